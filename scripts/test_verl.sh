#!/usr/bin/env bash
# PODS inside verl, in its own environment: verl 0.9.1 pins transformers < 5.11, below the
# range of podsrl's own trainer, so verl gets .venv-verl (podsrl's core and verl; no podsrl
# trainer stack). CI runs this after the main suite.
#  1. the install command of docs/verl.md, resolved (pip --dry-run: metadata only) beside
#     verl[vllm]==0.9.1, the GPU stack (torch 2.11.0, vLLM) verl users run;
#  2. .venv-verl: torch==2.13.0 (CPU) first, then podsrl[verl,test] under requirements-verl.lock;
#  3. tests/verl against a real TransferQueue store and Ray on CPU. --noconftest: the main
#     suite's conftest loads podsrl's models, which need the trainer's stack.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-verl/bin/python ]; then
  "$PYTHON" -m venv .venv-verl
fi
stamp=.venv-verl/.podsrl-installed
want=$(cat pyproject.toml requirements-verl.lock | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv-verl/bin/python -m pip install --quiet --upgrade pip
  .venv-verl/bin/python -m pip install --quiet "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  .venv-verl/bin/python -m pip install --quiet -c requirements-verl.lock -e ".[verl,test]"
  .venv-verl/bin/python -m pip check
  echo "$want" > "$stamp"
fi
echo "resolving docs/verl.md's install command beside verl[vllm]==0.9.1 (dry run) ..."
.venv-verl/bin/python -m pip install --quiet --dry-run --ignore-installed "podsrl[verl] @ file://$PWD" \
  "verl[vllm]==0.9.1"
# --noconftest drops tests/conftest.py's report of the machine and its CPU kind: say it here
.venv-verl/bin/python -c "from podsrl.provenance import machine_description; print('machine:', machine_description())"
exec .venv-verl/bin/python -m pytest -p no:cacheprovider --noconftest tests/verl tests/test_verl_core.py "$@"

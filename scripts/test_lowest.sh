#!/usr/bin/env bash
# The smoke job at the lower bounds of pyproject.toml's ranges: .venv-lowest holds
# requirements-lowest.txt (transformers 5.16.1, the oldest vLLM 0.33 accepts; accelerate,
# peft, datasets, numpy ... at their floors; trl 1.16.0) and runs the core of the suite:
# config, selection / advantages / loss, the update in every precision, training, resume,
# rewards, PODS inside TRL and two replicated processes (sharding needs transformers 5.23,
# which podsrl.distributed checks). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-lowest/bin/python ]; then
  "$PYTHON" -m venv .venv-lowest
fi
stamp=.venv-lowest/.podsrl-installed
want=$(cat pyproject.toml requirements-lowest.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv-lowest/bin/python -m pip install --quiet "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  .venv-lowest/bin/python -m pip install --quiet -r requirements-lowest.txt
  .venv-lowest/bin/python -m pip install --quiet --no-deps -e .
  .venv-lowest/bin/python -m pip check  # the lower bounds must be a consistent set
  echo "$want" > "$stamp"
fi
exec .venv-lowest/bin/python -m pytest -p no:cacheprovider \
  tests/test_config.py tests/test_algo.py tests/test_select.py tests/test_precision.py tests/test_checkpoint.py \
  tests/test_rewards.py tests/test_reward_inputs.py tests/test_trainer.py tests/test_trl.py tests/test_trl_agentic.py \
  "tests/test_distributed.py::test_sequence_aggregation_matches_one_process" \
  "tests/test_distributed.py::test_unsupported_distributed_modes_are_refused" "$@"

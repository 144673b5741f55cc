#!/usr/bin/env bash
# Regenerate a lock: resolve pyproject.toml's ranges afresh (newest allowed releases) in a
# throw-away venv, with torch==2.13.0 first, and freeze the result.
#   bash scripts/lock.sh         requirements.lock       (.[all,test]: the full suite)
#   bash scripts/lock.sh verl    requirements-verl.lock  (.[verl,test]: scripts/test_verl.sh)
# Run the matching tests with the new lock (scripts/test.sh, scripts/test_verl.sh) before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ "${1:-}" = "verl" ]; then
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
"$venv/bin/python" -m pip install --quiet ".[$extras]"
{
  echo "$header"
  "$venv/bin/python" -m pip freeze --exclude podsrl | sed 's/^torch==2.13.0+.*/torch==2.13.0/'
} > "$lock"
rm -rf "$(dirname "$venv")"
echo "wrote $lock ($(grep -c '==' "$lock") packages)"

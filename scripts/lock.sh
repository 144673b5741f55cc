#!/usr/bin/env bash
# Regenerate requirements.lock: resolve pyproject.toml's ranges afresh (newest allowed
# releases) in a throw-away venv, with torch==2.13.0 first, and freeze the result. Run the
# full suite with the new lock (bash scripts/test.sh) before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
venv=$(mktemp -d)/venv
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"$venv/bin/python" -m pip install --quiet ".[all,test]"
{
  echo "# The exact set of packages the full test suite runs with (Python 3.11, Linux x86_64),"
  echo "# installed as constraints by scripts/setup.sh. Regenerate with scripts/lock.sh."
  "$venv/bin/python" -m pip freeze --exclude podsrl | sed 's/^torch==2.13.0+.*/torch==2.13.0/'
} > requirements.lock
rm -rf "$(dirname "$venv")"
echo "wrote requirements.lock ($(grep -c '==' requirements.lock) packages)"

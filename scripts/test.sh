#!/usr/bin/env bash
# The test suite: set up (first time only), then pytest with any extra arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"

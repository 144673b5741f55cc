#!/usr/bin/env bash
# The main job: set up (first time only), then `podsrl train` with any extra arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/podsrl train "$@"

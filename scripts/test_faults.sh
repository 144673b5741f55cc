#!/usr/bin/env bash
# The fault catalogue, whole (#80): benchmarks/fault_catalogue.py runs every case (bad inputs and
# faults, each in a fresh process with a deadline) and exits 1 unless each ended as a clean error
# or was handled as documented. CI runs it after scripts/test_vllm.sh, whose .venv-vllm runs the
# vLLM cases (without it they are 'not run', and the last line says how many). The last line also
# names the machine: its counts per CPU kind are in benchmarks/RESULTS.md, "Fault catalogue".
# Extra arguments go to the catalogue (--only SUBSTRING, --deadline SECONDS).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python benchmarks/fault_catalogue.py "$@"

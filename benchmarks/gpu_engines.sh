#!/usr/bin/env bash
# #39's GPU measurement in one device call: benchmarks/engines.py on a randomly initialised
# SmolLM2-135M built from its shape (config and tokenizer, 3.4 MB, no weights to carry), the hf
# engine as podsrl ran it before #39 vs its bfloat16 generation copy vs the copy with the
# static, compiled cache, LoRA r16, recorded into RESULTS.md on the device (block
# engines-gpu-39, whose provenance line names the GPU machine); that file and the cells' JSON
# come back under OUT.
#
#   here:    python benchmarks/engines.py --models smollm2 --save_shape gpu-carry/smollm2-shape
#   device:  bash benchmarks/gpu_engines.sh "$OUT"        (carry: gpu-carry)
#   here:    copy the engines-gpu-39 block from OUT/RESULTS.md into benchmarks/RESULTS.md
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu_engines.sh OUT [ROWS=128,512,2048] [TOKENS=12,128]}
rows=${2:-128,512,2048}
tokens=${3:-12,128}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python benchmarks/engines.py --shape_dir gpu-carry/smollm2-shape --models smollm2 --dtypes bfloat16 \
  --engines hf,hf-copy,hf-static --rows "$rows" --tokens "$tokens" --repeats 2 --cell_limit 60 \
  --json "$out/engines-gpu.json" --record engines-gpu-39
cp benchmarks/RESULTS.md "$out/RESULTS.md"

#!/usr/bin/env bash
# #29's measurement in one command, on a CPU or a GPU: the same format warm-up for every arm
# (once; SmolLM2-135M-Instruct on level-1 answers), then on level-2 arithmetic
# (configs/smollm2-headroom.yaml) GRPO m vs GRPO-GA n vs PODS n -> m in podsrl's trainer, and
# GRPOTrainer m vs PODSTrainer n -> m in TRL, each arm x seed under the same training-time
# budget, interleaved, each table printed by the script that ran it.
#
#   bash benchmarks/headroom.sh OUT [SEEDS=3] [BUDGET_MINUTES=8] [FIELD=VALUE ...]
#
# FIELD=VALUE pairs override the config in both libraries, e.g. on a GPU
#   bash benchmarks/headroom.sh runs/headroom-gpu 3 1 bf16=true prompts_per_step=32 micro_batch_size=128
# A finished run is reused and an interrupted one resumed: re-run the same command to go on.
# ONLY=podsrl or ONLY=trl runs one library's arms.
set -euo pipefail
out=${1:?usage: bash benchmarks/headroom.sh OUT [SEEDS] [BUDGET_MINUTES] [FIELD=VALUE ...]}
seeds=${2:-3}
budget=${3:-8}
shift $(( $# < 3 ? $# : 3 ))
cd "$(dirname "$0")/.."
model="$out/smollm2-format"
podsrl_overrides=(--model "$model")
trl_overrides=(--set "model=$model")
for pair in "$@"; do
  podsrl_overrides+=("--${pair%%=*}" "${pair#*=}")
  trl_overrides+=(--set "$pair")
done
if [ ! -f "$model/config.json" ]; then
  python benchmarks/format_warmup.py --steps 60 --batch 8 --lr 5e-5 --output_dir "$model"
fi
only=${ONLY:-both}
if [ "$only" != trl ]; then
  podsrl compare --config configs/smollm2-headroom.yaml --methods grpo,grpo-ga,pods --n_values 16 \
    --m_values 4 --seeds "$seeds" --budget_minutes "$budget" --output_dir "$out/podsrl" "${podsrl_overrides[@]}"
fi
if [ "$only" != podsrl ]; then
  python benchmarks/trl_pods.py time-to-accuracy --config configs/smollm2-headroom.yaml --seeds "$seeds" \
    --budget_minutes "$budget" --output_dir "$out/trl" "${trl_overrides[@]}"
fi

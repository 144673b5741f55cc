#!/usr/bin/env bash
# PODS vs GRPO inside verl on GSM8K, one GPU, vLLM rollouts (docs/verl.md). Not run by the
# developers (no GPU was available): a recipe to run where verl runs.
#   bash examples/verl_pods_gsm8k.sh                  # both arms, 100 steps each
#   STEPS=2 MODEL=Qwen/Qwen2.5-0.5B-Instruct bash examples/verl_pods_gsm8k.sh   # a smoke run
# DATA: the folder of train.parquet / test.parquet from verl's GSM8K preprocessing script.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
STEPS=${STEPS:-100}
PROMPTS=${PROMPTS:-64}   # prompts per step
N=${N:-16}               # PODS: rollouts generated per prompt
M=${M:-4}                # PODS: rollouts trained on per prompt; GRPO generates and trains on M
common=(algorithm.adv_estimator=grpo
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet"
  data.max_prompt_length=512 data.max_response_length=512
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.logger='["console"]'
  trainer.total_training_steps="$STEPS" trainer.project_name=podsrl)
read -r -a pods <<< "$(python -m podsrl.integrations.verl_core "$PROMPTS" "$N" "$M")"
python -m verl.trainer.main_ppo "${common[@]}" "${pods[@]}" trainer.experiment_name="pods-$N-$M"
python -m verl.trainer.main_ppo "${common[@]}" data.train_batch_size="$PROMPTS" actor_rollout_ref.rollout.n="$M" \
  actor_rollout_ref.actor.ppo_mini_batch_size="$PROMPTS" trainer.experiment_name="grpo-$M"

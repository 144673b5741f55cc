"""PODS in TRL's GRPOTrainer: GSM8K with a hub model (the GPU setting), or the built-in tiny
model on the offline arithmetic task (any machine; the tests run it that way).

An existing GRPO script changes in two places: the import, and num_kept beside
num_generations in the config.

GPU, one process, generation with transformers:
    python examples/trl_pods.py --model Qwen/Qwen2.5-1.5B-Instruct

GPU, vLLM in the training processes (colocate), 8 GPUs with DeepSpeed ZeRO-2 / FSDP from accelerate:
    accelerate launch --num_processes 8 examples/trl_pods.py --model Qwen/Qwen2.5-3B-Instruct \
        --prompts_per_step 16 --use_vllm --vllm_mode colocate

GPU, vLLM on its own GPU (server mode): start `trl vllm-serve --model Qwen/Qwen2.5-3B-Instruct` on
GPU 0, then train on the other GPUs:
    CUDA_VISIBLE_DEVICES=1,2,3,4 accelerate launch --num_processes 4 examples/trl_pods.py \
        --model Qwen/Qwen2.5-3B-Instruct --use_vllm --vllm_mode server

Offline on CPU (no hub, no GPU): the tiny model, arithmetic prompts, podsrl's arithmetic rewards;
with --use_vllm, TRL's colocated vLLM on vLLM's CPU backend (in .venv-vllm: scripts/test_vllm.sh):
    python examples/trl_pods.py --offline --max_steps 20 --output_dir runs/trl-pods-tiny
    .venv-vllm/bin/python examples/trl_pods.py --offline --use_vllm --max_steps 20 --output_dir runs/trl-pods-vllm

The GPU commands have not been run by podsrl's developers (no GPU); the offline ones run in
the test suites (tests/test_trl.py, tests/on_vllm/test_trl_vllm.py).
"""

import argparse
import importlib.util
import os

import torch
from datasets import Dataset, load_dataset

from podsrl.trl import PODSConfig as GRPOConfig  # was: from trl import GRPOConfig, GRPOTrainer
from podsrl.trl import PODSTrainer as GRPOTrainer
from podsrl.trl import release_vllm, trl_batch_arguments

SYSTEM_PROMPT = ("A conversation between User and Assistant. The Assistant first thinks about the reasoning process "
                 "and then gives the answer. The reasoning and the answer are enclosed within <think> </think> and "
                 "<answer> </answer> tags, i.e., <think> reasoning here </think> <answer> answer here </answer>.")


def gsm8k_dataset(split: str) -> Dataset:
    """Conversational prompts; TRL's accuracy_reward reads the gold answer from `solution`."""
    def to_row(row):
        return {"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
                "solution": row["answer"].rsplit("####", 1)[-1].strip()}

    return load_dataset("openai/gsm8k", "main", split=split).map(to_row, remove_columns=["question", "answer"])


def arithmetic_dataset() -> Dataset:
    from podsrl.tasks.arithmetic import build_arithmetic

    task = build_arithmetic(level=3)
    return Dataset.from_list([{"prompt": ex.prompt, "answer": ex.answer} for ex in task.train[:4000]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct")
    parser.add_argument("--offline", action="store_true", help="the tiny model and the arithmetic task, on CPU")
    parser.add_argument("--num_generations", type=int, default=16, help="n: rollouts generated per prompt")
    parser.add_argument("--num_kept", type=int, default=4, help="m: rollouts kept per prompt and trained on")
    parser.add_argument("--downsampling_rule", default="max_variance")
    parser.add_argument("--prompts_per_step", type=int, default=8, help="over all processes")
    parser.add_argument("--micro_batch_size", type=int, default=8, help="kept rows per forward/backward per process")
    parser.add_argument("--num_processes", type=int, default=1, help="as launched (accelerate's --num_processes)")
    parser.add_argument("--max_steps", type=int, default=500)
    parser.add_argument("--learning_rate", type=float, default=None)
    parser.add_argument("--use_vllm", action="store_true")
    parser.add_argument("--vllm_mode", default="colocate", choices=["colocate", "server"])
    parser.add_argument("--output_dir", default="runs/trl-pods")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.use_vllm and importlib.util.find_spec("vllm") is None:  # TRL would fail deep in its set-up
        raise SystemExit("trl_pods.py: --use_vllm: vLLM is not installed in this environment; on a GPU "
                         "`pip install \"podsrl[vllm,trl] @ file://$PWD\"`, on this CPU use vLLM's own environment: "
                         "bash scripts/test_vllm.sh builds .venv-vllm, then .venv-vllm/bin/python "
                         "examples/trl_pods.py --offline --use_vllm ...")

    batch = trl_batch_arguments(args.prompts_per_step, args.num_generations, args.num_kept, args.micro_batch_size,
                                 args.num_processes)
    common = dict(output_dir=args.output_dir, max_steps=args.max_steps, logging_steps=1, save_strategy="no",
                  downsampling_rule=args.downsampling_rule, temperature=1.0, beta=0.0, seed=args.seed,
                  log_completions=True, report_to="none", use_vllm=args.use_vllm, vllm_mode=args.vllm_mode, **batch)
    if args.offline:
        from podsrl.models import load_model
        from podsrl.rewards import arithmetic_correct, arithmetic_format

        if args.use_vllm:  # vLLM's CPU backend: a small KV cache (its default, a share of the memory, is slow to get)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        bundle = load_model("tiny")
        model, tokenizer, dataset = bundle.model, bundle.tokenizer, arithmetic_dataset()
        reward_funcs, weights = [arithmetic_correct, arithmetic_format], [0.8, 0.2]
        config = GRPOConfig(**common, learning_rate=args.learning_rate or 2e-4, max_completion_length=8, use_cpu=True,
                            reward_weights=weights, disable_tqdm=True)
    else:
        from trl.rewards import accuracy_reward, think_format_reward

        model, tokenizer, dataset = args.model, None, gsm8k_dataset("train")
        reward_funcs = [accuracy_reward, think_format_reward]
        config = GRPOConfig(**common, learning_rate=args.learning_rate or 5e-6, max_completion_length=512,
                            bf16=True, reward_weights=[1.0, 0.2],
                            adam_beta2=0.99, weight_decay=0.1, max_grad_norm=0.1, lr_scheduler_type="constant")
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward_funcs, args=config,
                          train_dataset=dataset)
    trainer.train()
    trainer.save_model(args.output_dir)
    release_vllm(trainer)  # vLLM's own process groups first: its exit-time teardown would fail after the default's
    if torch.distributed.is_initialized():  # tear the process group down before exit (see tests/test_trl.py)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

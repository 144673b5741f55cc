"""podsrl vs TRL's GRPOTrainer on the same work, measured side by side in one process.

Same model (the built-in tiny model), prompts (arithmetic level 3), reward (0.8 correct +
0.2 format), learning rate, optimizer settings, completion length and micro-batch size.
Runs alternate (podsrl GRPO, TRL GRPO, podsrl PODS, TRL with num_generations = n) for
several rounds so that machine drift hits both sides alike; the first steps of every run
are dropped as warm-up. Reports seconds per optimizer step and generated tokens per
second of generation, and their ratios.

    pip install -e ".[trl]"        # TRL (scripts/setup.sh installs it)
    python benchmarks/vs_trl.py [--rounds 3] [--steps 12] [--prompts 16] [--n 16] [--m 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from podsrl.metrics import read_metrics
from podsrl.rewards import arithmetic_correct, arithmetic_format
from podsrl.trainer import train
from podsrl.trainer.config import make_config
from podsrl.types import completion_mask_from_eos

WARMUP_STEPS = 2


def podsrl_run(method: str, args, out: Path) -> dict:
    cfg = make_config(overrides={
        "method": method, "num_generations": args.n, "num_kept": args.m, "prompts_per_step": args.prompts,
        "max_steps": args.steps, "learning_rate": args.lr, "warmup_steps": 0,
        "max_completion_length": args.max_new_tokens, "micro_batch_size": args.micro_batch, "eval_prompts": 8,
        "eval_samples": 1, "eval_steps": 0, "eval_greedy": False, "save_steps": 0, "progress": False,
        "output_dir": str(out)})
    train(cfg)
    steps = [r for r in read_metrics(out / "metrics.jsonl") if r["step"] > WARMUP_STEPS]
    step_seconds = [sum(v for k, v in r.items() if k.startswith("time_") and k != "time_eval") for r in steps]
    generated = [r["completion_len"] * args.prompts * cfg.generated_per_prompt for r in steps]
    return {"seconds_per_step": statistics.fmean(step_seconds),
            "generate_seconds_per_step": statistics.fmean(r["time_generate"] for r in steps),
            "tokens_per_second": sum(generated) / sum(r["time_generate"] for r in steps)}


class StepTimer:
    """A TrainerCallback timing each optimizer step (generation included: TRL generates
    inside the training step)."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, *a, **k):
                timer.start = time.perf_counter()

            def on_step_end(self, *a, **k):
                timer.seconds.append(time.perf_counter() - timer.start)

        self.callback, self.seconds, self.start = Callback(), [], 0.0


def trl_run(num_generations: int, args, out: Path) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from podsrl.models import load_model
    from podsrl.tasks.arithmetic import build_arithmetic

    bundle = load_model("tiny")
    model, tokenizer = bundle.model, bundle.tokenizer
    task = build_arithmetic(level=3)
    dataset = Dataset.from_list([{"prompt": ex.prompt, "answer": ex.answer} for ex in task.train[:4000]])
    generated = {"seconds": [], "tokens": []}
    original_generate = model.generate

    def timed_generate(*a, **k):  # TRL calls the unwrapped model's generate
        start = time.perf_counter()
        out_ids = original_generate(*a, **k)
        generated["seconds"].append(time.perf_counter() - start)
        completion = out_ids[:, k["input_ids"].shape[1]:]
        generated["tokens"].append(int(completion_mask_from_eos(completion, tokenizer.eos_token_id).sum()))
        return out_ids

    model.generate = timed_generate
    completions_per_step = args.prompts * num_generations
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
        warmup_steps=0, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, max_grad_norm=0.1,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=max(1, completions_per_step // args.micro_batch),
        num_generations=num_generations, max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0,
        top_k=0, beta=0.0, epsilon=0.2, num_iterations=1, loss_type="grpo", scale_rewards="group",
        reward_weights=[0.8, 0.2], use_cpu=True, bf16=False, report_to=[], logging_steps=1000,
        save_strategy="no", seed=0, disable_tqdm=True)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[arithmetic_correct, arithmetic_format],
                          args=config, train_dataset=dataset, callbacks=[timer.callback])
    trainer.train()
    steps = timer.seconds[WARMUP_STEPS:]
    calls_per_step = len(generated["seconds"]) // max(1, len(timer.seconds))
    skip = WARMUP_STEPS * calls_per_step
    return {"seconds_per_step": statistics.fmean(steps),
            "generate_seconds_per_step": sum(generated["seconds"][skip:]) / len(steps),
            "tokens_per_second": sum(generated["tokens"][skip:]) / sum(generated["seconds"][skip:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--m", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--max_new_tokens", type=int, default=8)
    parser.add_argument("--micro_batch", type=int, default=32)
    parser.add_argument("--output", type=Path, default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    arms = {
        f"podsrl grpo {args.m}/{args.m}": lambda out: podsrl_run("grpo", args, out),
        f"trl grpo G={args.m}": lambda out: trl_run(args.m, args, out),
        f"podsrl pods {args.n}->{args.m}": lambda out: podsrl_run("pods", args, out),
        f"trl grpo G={args.n}": lambda out: trl_run(args.n, args, out),
    }
    results: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory() as tmp:
        # one throwaway run of each library first: the first run in a process pays one-off
        # costs (thread pools, allocator growth, lazy imports) that would bias round 1
        podsrl_run("grpo", argparse.Namespace(**{**vars(args), "steps": 3}), Path(tmp) / "warmup-podsrl")
        trl_run(args.m, argparse.Namespace(**{**vars(args), "steps": 3}), Path(tmp) / "warmup-trl")
        for round_ in range(args.rounds):
            for i, (name, run) in enumerate(arms.items()):
                results[name].append(run(Path(tmp) / f"r{round_}-{i}"))
                print(f"round {round_ + 1}/{args.rounds} {name}: {results[name][-1]}", flush=True)

    def mean(name, key):
        return statistics.fmean(r[key] for r in results[name])

    names = list(arms)
    print(f"\nmachine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{args.prompts} prompts/step, {args.max_new_tokens} new tokens, micro-batch {args.micro_batch}, "
          f"{args.rounds} rounds x {args.steps} steps ({WARMUP_STEPS} warm-up steps dropped per run)")
    print("| arm | s/step | generation s/step | generated tokens/s |\n| --- | --- | --- | --- |")
    for name in names:
        print(f"| {name} | {mean(name, 'seconds_per_step'):.3f} | {mean(name, 'generate_seconds_per_step'):.3f} "
              f"| {mean(name, 'tokens_per_second'):.0f} |")
    podsrl_grpo, trl_grpo, podsrl_pods, trl_n = names
    ratios = {
        "grpo step time, podsrl / trl": mean(podsrl_grpo, "seconds_per_step") / mean(trl_grpo, "seconds_per_step"),
        "grpo generation tokens/s, podsrl / trl":
            mean(podsrl_grpo, "tokens_per_second") / mean(trl_grpo, "tokens_per_second"),
        f"pods {args.n}->{args.m} step time / trl G={args.n}":
            mean(podsrl_pods, "seconds_per_step") / mean(trl_n, "seconds_per_step"),
    }
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    if args.output:
        args.output.write_text(json.dumps({"args": vars(args) | {"output": str(args.output)}, "results": results,
                                           "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()

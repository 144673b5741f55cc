"""What the extension contracts (podsrl.contracts) cost the main job: each checked call against
the bare function at the main job's shapes, side by side, and the sum per step against the main
job's own step time measured in the same run.

    python benchmarks/contract_cost.py [--steps 20] [--repeats 2000]

A main-job step calls the rule once ([P, n] -> [P, m]), the advantage estimator once ([P, m])
and the loss once per micro-batch ([B, Lc] per-token terms); podsrl's own prompt selectors
and engines are not wrapped (a user's are, at the same few comparisons per call).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import torch

from podsrl.algorithms.advantages import ADVANTAGES, group_advantages
from podsrl.algorithms.loss import LOSSES, sequence_mean
from podsrl.algorithms.select import Groups, max_variance, select
from podsrl.metrics import read_metrics
from podsrl.trainer import train
from podsrl.trainer.config import make_config


def seconds_per_call(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def contract_costs(cfg, repeats: int) -> list[tuple[str, float, float, int]]:
    """(what, bare seconds, checked seconds, calls per step) at the config's shapes."""
    num_prompts, n, m = cfg.prompts_per_step, cfg.num_generations, cfg.num_kept
    rewards = torch.rand(num_prompts, n)  # [P, n]
    kept_rewards = torch.rand(num_prompts, m)  # [P, m]
    rows = num_prompts * m
    per_token = torch.rand(min(rows, cfg.micro_batch_size), cfg.max_completion_length, requires_grad=True)
    mask = torch.ones_like(per_token)
    micro_batches = -(-rows // cfg.micro_batch_size)
    groups = Groups(rewards)
    estimator, loss = ADVANTAGES.checked("group"), LOSSES.checked("grpo")
    cases = [
        ("rule max_variance", lambda: max_variance(groups.selectable_rewards(), m),
         lambda: select("max_variance", groups, m), 1),
        ("advantage estimator group", lambda: group_advantages(kept_rewards, True),
         lambda: estimator(kept_rewards, True), 1),
        ("loss grpo", lambda: sequence_mean(per_token, mask, rows, float(mask.sum())),
         lambda: loss(per_token, mask, rows, float(mask.sum())), micro_batches),
    ]
    return [(name, seconds_per_call(bare, repeats), seconds_per_call(checked, repeats), calls)
            for name, bare, checked, calls in cases]


def main_job_step_seconds(steps: int) -> float:
    """The main job's mean training seconds per step over its first ``steps`` steps."""
    with tempfile.TemporaryDirectory() as work:
        cfg = make_config(overrides={"max_steps": str(steps), "output_dir": f"{work}/run", "progress": "false",
                                     "eval_steps": "0"})
        result = train(cfg)
        records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["step"] > 0]
    return records[-1]["train_seconds"] / len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = make_config()
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread; main job shapes: "
          f"P={cfg.prompts_per_step}, n={cfg.num_generations}, m={cfg.num_kept}, Lc={cfg.max_completion_length}")
    print("| call | bare (us) | checked (us) | ratio | calls per step | added per step (us) |")
    print("| --- | --- | --- | --- | --- | --- |")
    added = 0.0
    for name, bare, checked, calls in contract_costs(cfg, args.repeats):
        added += (checked - bare) * calls
        print(f"| {name} | {bare * 1e6:.1f} | {checked * 1e6:.1f} | {checked / bare:.2f}x | {calls} | "
              f"{(checked - bare) * calls * 1e6:.1f} |")
    step = main_job_step_seconds(args.steps)
    print(f"\nmain job step: {step * 1e3:.1f} ms (mean of {args.steps} steps); the checks add {added * 1e6:.1f} us "
          f"per step = {100 * added / step:.3f}% of it")


if __name__ == "__main__":
    main()

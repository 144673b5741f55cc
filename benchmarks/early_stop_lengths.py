"""Does early stop bias PODS's kept set toward short completions? Generation only, on a
workload whose lengths vary: SmolLM2-135M-Instruct answering level-1 arithmetic in its chat
template (it chats: 3 to 96 tokens).

For each seed, the same P prompts are sampled n times on the ``slots`` engine (round-robin
order, g slots) twice: without a stopper (plain PODS keeps the max-variance m of all n) and
with early stop (``SaturationStopper``, the trainer's own). The reward is binary and
bounded, "the completion contains the right sum" (the untrained model rarely writes the
task's ``Answer:`` format, so the task's own reward would be constant). Reported per arm,
over all groups: mean length of the kept completions and of all generated ones, rollouts
generated, decode steps, generation seconds, kept reward variance. The two arms draw
different samples (a cancelled group changes which draw goes to which sample), so the
comparison is statistical, over P x seeds groups: the last line is the paired difference of
the kept length (early stop minus plain, per group: same prompt, same seed) with its 95% t
interval over groups.

    python benchmarks/early_stop_lengths.py [--prompts 8] [--n 16] [--m 4] [--slots 32] [--seeds 3]
        [--max_new_tokens 96] [--schedule round_robin|length_aware] [--record NAME]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from podsrl.algorithms.early_stop import fill_skipped
from podsrl.algorithms.select import max_variance
from podsrl.experiments.stats import mean_ci
from podsrl.generation.saturation import SaturationStopper, reward_bounds
from podsrl.models import load_model
from podsrl.rewards import bounded, completion_text
from podsrl.rollout import SlotsOptions, generate_in_slots
from podsrl.rollout.schedule import PrefixLengthPredictor
from podsrl.scoring import Scorer, ScoringOptions
from podsrl.tasks import TaskOptions, build_task, prepare_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)


@bounded(0.0, 1.0)
def contains_sum(prompts, completions, answer, **_columns) -> list[float]:
    """1.0 when the gold sum appears in the completion as a number."""
    return [float(str(gold).strip() in re.findall(r"-?\d+", completion_text(c)))
            for c, gold in zip(completions, answer)]


def one_arm(bundle, split, scorer, args, seed: int, stop: bool, predictor) -> dict:
    stopper = (SaturationStopper(scorer, split, bundle.tokenizer, args.m, reward_bounds(scorer)) if stop else None)
    torch.manual_seed(seed)
    start = time.perf_counter()
    options = SlotsOptions(max_completion_length=args.max_new_tokens, micro_group=args.slots, schedule=args.schedule)
    rollouts = generate_in_slots(bundle.model, bundle.tokenizer, split.prompts, args.n, options,
                                 watchers=(stopper,) if stopper else (), predictor=predictor)
    seconds = time.perf_counter() - start
    scores = scorer(split, rollouts)  # [P, n], NaN where skipped
    keep = max_variance(fill_skipped(scores.reward.double(), rollouts.generated), args.m)  # [P, m]
    lengths = rollouts.completion_mask.sum(-1).float()  # [P, n]
    generated = rollouts.generated_mask
    kept_rewards = scores.reward.gather(1, keep)
    kept_lengths = lengths.gather(1, keep)  # [P, m]
    return {"kept_length": kept_lengths.flatten().tolist(), "group_kept_length": kept_lengths.mean(1).tolist(),
            "all_length": lengths[generated].tolist(),
            "generated": int(generated.sum()), "decode_steps": rollouts.stats["decode_steps"], "seconds": seconds,
            "kept_variance": kept_rewards.var(dim=1, correction=0).tolist()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--m", type=int, default=4)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--schedule", default="round_robin", choices=("round_robin", "length_aware"),
                        help="length_aware: each arm's length predictor learns across seeds (none at seed 0)")
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    bundle = load_model("smollm2-135m-instruct")
    task = build_task(TaskOptions(task_level=1))
    scorer = Scorer.build(task, ScoringOptions(reward_funcs=(contains_sum,), reward_weights=(1.0,)))
    results = {False: [], True: []}
    predictors = {stop: PrefixLengthPredictor() if args.schedule == "length_aware" else None for stop in results}
    for seed in range(args.seeds):
        examples = task.train[seed * args.prompts:(seed + 1) * args.prompts]
        split = prepare_split(examples, bundle.tokenizer, system_prompt="", use_chat_template=True,
                              max_prompt_tokens=512)
        for stop in ((False, True) if seed % 2 == 0 else (True, False)):  # alternate the order
            results[stop].append(one_arm(bundle, split, scorer, args, 1000 + seed, stop, predictors[stop]))
    lines = [f"SmolLM2-135M-Instruct, {args.prompts} prompts x {args.seeds} seeds, n = {args.n}, m = {args.m}, "
             f"{args.slots} slots ({args.schedule}), up to {args.max_new_tokens} new tokens, torch threads "
             f"{torch.get_num_threads()}", "",
             "| arm | kept completion length (mean, tokens) | all generated completions' length | rollouts "
             "generated | decode steps | generation s | kept reward variance (mean over groups) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for stop, name in ((False, "plain PODS (all n generated)"), (True, "early stop")):
        rows = results[stop]
        flat = {k: [v for r in rows for v in r[k]] for k in ("kept_length", "all_length", "kept_variance")}
        total = args.seeds * args.prompts * args.n
        lines.append(f"| {name} | {statistics.fmean(flat['kept_length']):.1f} | "
                     f"{statistics.fmean(flat['all_length']):.1f} | {sum(r['generated'] for r in rows)} of {total} | "
                     f"{sum(r['decode_steps'] for r in rows)} | {sum(r['seconds'] for r in rows):.1f} | "
                     f"{statistics.fmean(flat['kept_variance']):.4f} |")
    plain = [v for r in results[False] for v in r["group_kept_length"]]  # [seeds * P], same order in both arms
    stopped = [v for r in results[True] for v in r["group_kept_length"]]
    difference, half_width = mean_ci([b - a for a, b in zip(plain, stopped)])
    lines += ["", f"Kept length, early stop minus plain PODS, paired by group ({len(plain)} groups): "
              f"{difference:+.1f} +- {half_width:.1f} tokens (95% t interval), "
              f"{difference / statistics.fmean(plain):+.1%} of plain PODS's mean"]
    table = "\n".join(lines)
    print(table)
    if args.record:
        record(args.record, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Lossless early stop (group_early_stop) against plain PODS at the same n, time to accuracy.

Three arms, run interleaved seed by seed with one training-time budget (``podsrl compare``'s
methodology), PODS 16 -> 4 max_variance on the main job's settings with a correctness-only
reward (correct_weight 1, format_weight 0; see below):

* plain PODS with the default ``hf`` engine (the baseline);
* plain PODS on the ``slots`` engine, round-robin order, g slots (what early stop runs on,
  without stopping: separates the engine's cost from early stop's saving);
* the same with ``group_early_stop``.

Why the correctness-only reward: the default reward 0.8 x correct + 0.2 x format is bounded
by [0, 1], and its lower bound needs an unformatted wrong answer; once the model has learnt
the format (within ~20 steps on the main job) no group can reach the bound, so early stop
never fires there (``--reward default`` measures that).

``--config FILE`` takes the shared settings from a YAML config instead of the main job's (#58:
``--config configs/tiny-chain.yaml``), ``--set FIELD=VALUE`` overrides one of them, and
``--with_grpo`` adds a fourth arm, GRPO m/m on the config's engine, with a second table that
takes it as the baseline: the best generation settings against GRPO in the same interleaved run.
``--skip_hf_arm`` leaves plain PODS on the ``hf`` engine out: early stop's baseline is then plain
PODS on the slots engine, which is the like-for-like one (same engine, same schedule).

Besides the comparison table it prints, per arm, the mean over all steps of: rollouts
generated per step, generation seconds per step, the kept groups' reward std (the variance
PODS keeps) and the kept completions' length (early stop favours samples that finish first).

    python benchmarks/early_stop.py [--seeds 3] [--budget_minutes 1.5] [--slots 128]
        [--output_dir runs/early-stop] [--reward correct|default] [--record NAME] [--figures DIR]
        [--config FILE] [--set FIELD=VALUE ...] [--with_grpo] [--skip_hf_arm]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from podsrl.experiments.compare import (
    analyze,
    arm_configs,
    arm_dir_name,
    format_table,
    planned_arm_names,
    run_comparison,
    write_report,
)
from podsrl.metrics import read_metrics
from podsrl.trainer.config import make_config, parse_value

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

STEP_FIELDS = ("rollouts_generated", "time_generate", "kept_reward_std", "kept_completion_len", "completion_len",
               "groups_stopped_early", "kept_reward_zero_var_frac")


def step_means(run_dir: Path, per_step_rollouts: int) -> dict[str, float]:
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time_generate" in r]
    means = {}
    for name in STEP_FIELDS:
        default = per_step_rollouts if name == "rollouts_generated" else 0.0  # plain PODS generates them all
        means[name] = statistics.fmean(r.get(name, default) for r in steps)
    return means


def per_arm_table(result: dict, per_step_rollouts: int) -> str:
    lines = ["| arm | rollouts generated / step | generation s / step | kept reward std | kept completion "
             "length | all completions' length | groups stopped early | kept zero-variance groups |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, arm in result["arms"].items():
        runs = [step_means(run.path, per_step_rollouts) for run in arm.runs]
        cell = {k: statistics.fmean(r[k] for r in runs) for k in STEP_FIELDS}
        lines.append(f"| {name} | {cell['rollouts_generated']:.1f} of {per_step_rollouts} | "
                     f"{cell['time_generate']:.3f} | {cell['kept_reward_std']:.4f} | {cell['kept_completion_len']:.3f} "
                     f"| {cell['completion_len']:.3f} | {cell['groups_stopped_early']:.3f} | "
                     f"{cell['kept_reward_zero_var_frac']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget_minutes", type=float, default=1.5)
    parser.add_argument("--slots", type=int, default=128, help="generation_micro_group of the slots arms")
    parser.add_argument("--reward", choices=("correct", "default"), default="correct")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/early-stop"))
    parser.add_argument("--figures", type=Path, default=None)
    parser.add_argument("--record", default="")
    parser.add_argument("--config", default=None, help="shared settings from a YAML config (default: the main job's)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override one setting")
    parser.add_argument("--with_grpo", action="store_true", help="also GRPO m/m, and a table with it as the baseline")
    parser.add_argument("--skip_hf_arm", action="store_true", help="no plain PODS arm on the hf engine")
    args = parser.parse_args()
    reward = dict(correct_weight=1.0, format_weight=0.0) if args.reward == "correct" else {}
    malformed = [pair for pair in args.set if "=" not in pair]
    if malformed:
        parser.error(f"--set: expected FIELD=VALUE, got {malformed[0]!r}")
    settings = dict(pair.split("=", 1) for pair in args.set)
    base = dataclasses.replace(make_config(args.config, {k: parse_value(k, v) for k, v in settings.items()}),
                               **reward)
    slots = dict(generation_engine="slots", generation_schedule="round_robin", generation_micro_group=args.slots)
    plain = dict(method="pods", num_generations=base.num_generations, num_kept=base.num_kept,
                 downsampling_rule="max_variance")
    arms = [plain, {**plain, **slots}, {**plain, **slots, "group_early_stop": True}][args.skip_hf_arm:]
    grpo = arm_configs(base, ["grpo"], [], [], [base.num_kept]) if args.with_grpo else []
    run_dirs = run_comparison(base, grpo + arms, args.seeds, args.budget_minutes, args.output_dir / "runs")
    pods_runs = [d for d in run_dirs if not grpo or d.parent.name != arm_dir_name(grpo[0])]
    result = analyze(pods_runs, baseline=planned_arm_names(base, arms)[0])
    paths = write_report(result, args.output_dir, title="early stop")
    per_step = base.prompts_per_step * base.num_generations
    body = (f"{format_table(result)}\n\nPer step (means over every step of every seed):\n\n"
            f"{per_arm_table(result, per_step)}")
    if grpo:  # the same runs against GRPO m/m: what the best generation settings buy over it
        against_grpo = analyze(run_dirs, baseline=f"grpo {base.num_kept}/{base.num_kept}")
        body += f"\n\nThe same runs with GRPO {base.num_kept}/{base.num_kept} as the baseline:\n\n"
        body += format_table(against_grpo)
    print(body)
    if args.figures:
        args.figures.mkdir(parents=True, exist_ok=True)
        stem = args.record or "early-stop"
        for kind in ("accuracy", "step_time"):
            target = args.figures / f"{stem}-{kind}.png"
            target.write_bytes(paths[kind].read_bytes())
        body += f"\n\n![early stop: accuracy vs training time](figures/{stem}-accuracy.png)"
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

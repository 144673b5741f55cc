"""Each method at its tuned learning rate (#81 item 4): a small learning-rate sweep per arm, then
fresh seeds of every arm at its chosen rate, interleaved (``podsrl compare``'s methodology).

1. The sweep: every arm at each of ``--learning_rates`` (at least 3, spanning at least 10x) for
   ``--sweep_seeds`` seeds, with the same short budget (``--sweep_minutes``), interleaved. A rate is
   chosen per arm by its late accuracy: the mean held-out accuracy of the evaluations in the last
   half of the budget, over seeds. A mean of several evaluations is what a single noisy evaluation
   moves least; the table says how far dropping the worst one would move it.
2. The comparison: ``--seeds`` fresh seeds (none of the sweep's) of every arm at its chosen rate,
   ``--budget_minutes`` each, against each GRPO arm as the baseline, with the headline in seconds
   and in steps (the step-cost ratio and the per-step learning apart).

The sweep may cost at most what the comparison costs (arms x rates x sweep seeds x sweep minutes
at most arms x seeds x minutes), or the tuning would be the experiment. Finished runs are reused,
so the same command picks up where it was stopped, in this session or the next.

Arms (``--arms``): ``at-best``, the reasoning regime's best generation settings
(benchmarks/methods_at_best.py: PODS with early stop and partial rollouts, GRPO-GA n and GRPO m/m
with partial rollouts, GRPO-GA's better arm in its 5 seeds); ``plain``, GRPO m/m, GRPO-GA n and
PODS n -> m with the config's own settings.

    python benchmarks/tuned_rates.py --config configs/tiny-chain-early-stop.yaml --arms at-best \\
        --learning_rates 6e-5,2e-4,6e-4 --sweep_seeds 2 --sweep_minutes 2.5 --sweep_eval_steps 5 \\
        --seeds 5 --budget_minutes 3 \\
        [--sweep_only] [--output_dir runs/tuned-rates] [--record NAME] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

from podsrl.experiments.compare import (
    planned_arm_names,
    provenance,
    run_comparison,
)
from podsrl.experiments.runs import arm_name, load_run
from podsrl.experiments.stats import mean_ci
from podsrl.trainer.config import split_list

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods_at_best import baseline_sections, plan_arms  # noqa: E402 (benchmarks/ is not a package)
from partial_rollouts import base_config  # noqa: E402
from results_md import record  # noqa: E402

SWEEP_SEED_OFFSET = 1000  # the sweep's seeds: never one of the comparison's
LATE = 0.5  # late accuracy: the evaluations after this fraction of the budget


def regime_arms(base, arms: str) -> list[dict]:
    """The compared arms' config overrides, PODS first."""
    if arms == "at-best":  # GRPO-GA with partial rollouts: its better arm in methods-at-best's 5 seeds
        return [arm for arm in plan_arms(base, base.partial_extra_prompts, grpo_plain=False)
                if arm["method"] != "grpo-ga" or arm.get("partial_rollouts")]
    n, m = base.num_generations, base.num_kept
    return [dict(method="pods", num_generations=n, num_kept=m), dict(method="grpo-ga", num_generations=n, num_kept=m),
            dict(method="grpo", num_generations=m, num_kept=m)]


def late_accuracy(evals: list[tuple[float, float]], budget: float) -> list[float]:
    """The accuracies of the evaluations in the last half of ``budget`` (training seconds)."""
    return [accuracy for seconds, accuracy in evals if seconds >= LATE * budget]


def sweep_rows(runs: list, budget: float) -> list[dict]:
    """Per arm and rate: seeds, steps, late accuracy (mean over seeds of each run's late mean, its
    95% half-width) and how far dropping the evaluation that moves it most would move it."""
    groups: dict[tuple[str, float], list] = {}
    for run in runs:
        groups.setdefault((arm_name(run.config), run.config["learning_rate"]), []).append(run)
    rows = []
    for (arm, rate), runs in groups.items():
        late = [late_accuracy(r.evals, budget) for r in runs]
        per_seed = [statistics.fmean(values) for values in late if values]
        mean, half = mean_ci(per_seed) if per_seed else (math.nan, math.nan)
        moved = 0.0
        for i, values in enumerate(late):  # each evaluation dropped in turn (a run keeps at least one)
            for k in range(len(values)) if len(values) > 1 else ():
                others = [statistics.fmean(v) for j, v in enumerate(late) if j != i and v]
                dropped = statistics.fmean(others + [statistics.fmean(values[:k] + values[k + 1:])])
                moved = max(moved, abs(dropped - mean))
        rows.append({"arm": arm, "learning_rate": rate, "seeds": len(runs),
                     "steps": statistics.fmean(r.steps for r in runs), "late_accuracy": mean, "ci95": half,
                     "evaluations": statistics.fmean(len(v) for v in late), "moved_by_one": moved})
    return rows


def chosen_rates(rows: list[dict]) -> dict[str, float]:
    """Each arm's rate of the highest late accuracy."""
    best: dict[str, dict] = {}
    for row in rows:
        if row["arm"] not in best or row["late_accuracy"] > best[row["arm"]]["late_accuracy"]:
            best[row["arm"]] = row
    return {arm: row["learning_rate"] for arm, row in best.items()}


def sweep_table(rows: list[dict], chosen: dict[str, float]) -> str:
    lines = ["| arm | learning rate | seeds | steps | late accuracy (95% CI) | evaluations a run | "
             "dropping one evaluation moves it by | chosen |", "| --- " * 8 + "|"]
    for row in sorted(rows, key=lambda r: (r["arm"], r["learning_rate"])):
        lines.append(f"| {row['arm']} | {row['learning_rate']:g} | {row['seeds']} | {row['steps']:.1f} | "
                     f"{100 * row['late_accuracy']:.1f}% +- {100 * row['ci95']:.1f} | {row['evaluations']:.1f} | "
                     f"{100 * row['moved_by_one']:.1f} points | "
                     f"{'yes' if chosen[row['arm']] == row['learning_rate'] else ''} |")
    return "\n".join(lines)


def runs_line(runs: list) -> str:
    """When, at which commit and on which machine the runs ran (each run's environment.json)."""
    found = provenance(runs)
    if not found:
        return "runs: no environment recorded"
    return (f"runs started {found['first_start']} to {found['last_start']} (UTC); code {', '.join(found['commits'])}; "
            f"machine: {'; '.join(found['machines'])}; torch {'; '.join(found['torch'])}")


def check_budgets(parser, args, arms: int, rates: list[float]) -> None:
    if len(rates) < 3 or max(rates) / min(rates) < 10 - 1e-9:  # 6e-4 / 6e-5 is 9.999999999999998
        parser.error("--learning_rates: at least 3 rates spanning at least 10x (#81 item 4)")
    sweep, final = arms * len(rates) * args.sweep_seeds * args.sweep_minutes, arms * args.seeds * args.budget_minutes
    if sweep > final:
        parser.error(f"the sweep ({sweep:g} run-minutes) would cost more than the comparison ({final:g}): "
                     "fewer sweep seeds or minutes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny-chain-early-stop.yaml")
    parser.add_argument("--arms", choices=("at-best", "plain"), default="at-best")
    parser.add_argument("--learning_rates", default="6e-5,2e-4,6e-4")
    parser.add_argument("--sweep_seeds", type=int, default=2)
    parser.add_argument("--sweep_minutes", type=float, default=2.5)
    parser.add_argument("--sweep_eval_steps", type=int, default=5, help="the sweep's evaluation interval: its late "
                                                                        "accuracy averages several evaluations")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget_minutes", type=float, default=3.0)
    parser.add_argument("--sweep_only", action="store_true", help="stop after the sweep and its table")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override one setting")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/tuned-rates"))
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    base = base_config(parser, args.config, args.set)
    arms = regime_arms(base, args.arms)
    rates = [float(rate) for rate in split_list(args.learning_rates)]
    check_budgets(parser, args, len(arms), rates)
    swept = [{**arm, "learning_rate": rate} for arm in arms for rate in rates]
    sweep_base = dataclasses.replace(base, seed=base.seed + SWEEP_SEED_OFFSET, eval_steps=args.sweep_eval_steps)
    sweep_dirs = run_comparison(sweep_base, swept, args.sweep_seeds, args.sweep_minutes, args.output_dir / "sweep")
    sweep_runs = [load_run(path) for path in sweep_dirs]
    rows = sweep_rows(sweep_runs, 60 * args.sweep_minutes)
    chosen = chosen_rates(rows)
    sections = [f"Sweep: {len(rates)} rates x {args.sweep_seeds} seeds x {args.sweep_minutes:g} minutes, late accuracy "
                f"= mean of the evaluations after {LATE:.0%} of the budget\n{runs_line(sweep_runs)}\n\n"
                f"{sweep_table(rows, chosen)}"]
    if not args.sweep_only:
        tuned = [{**arm, "learning_rate": chosen[arm_name({**base.to_dict(), **arm})]} for arm in arms]
        run_dirs = run_comparison(base, tuned, args.seeds, args.budget_minutes, args.output_dir / "runs")
        baselines = [name for name in planned_arm_names(base, tuned) if name.startswith("grpo")]
        sections += baseline_sections(run_dirs, baselines, args.output_dir, "methods at their tuned rates")
    body = "\n\n".join(sections)
    print(body)
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Quota-aware pruning of running rollouts in training (#72 item 3): PODS at its best with and
without ``prune_running``, and GRPO-GA with partial rollouts, interleaved seed by seed with one
training-time budget (``podsrl compare``'s methodology), in the reasoning regime.

Arms, on ``--config`` (default configs/tiny-chain-early-stop.yaml: tiny-chain on the chain task,
completions of about 20-240 tokens in a 256-token budget, PODS 16 -> 4 on the slots engine):

* PODS n -> m at its best without pruning: lossless early stop and partial rollouts with
  ``--extra`` groups in flight (the best measured, RESULTS.md "Every method at its best");
* the same with ``prune_running``, once per ``--rule`` (``finished``: #72's rule, a class's places
  filled by finished samples; ``sure``: the bolder one), the other pruning settings at their
  defaults unless ``--set``;
* GRPO-GA n with partial rollouts, the better of its two arms on the mean curves of RESULTS.md's "Every
  method at its best" (1.25x plain GRPO-GA there; per seed 1.19x [0.62, 2.28], so not shown better).

Two time-to-accuracy tables: against PODS without pruning (#72's target: 1.3x sooner) and against
GRPO-GA (target: 1.5x sooner); each headline's "in steps" column says how much is per-step learning,
the rest is a cheaper step. Then, per arm, means over every step of every seed: seconds per step
and per generation, rollouts generated, samples and tokens pruned, the kept and all completions'
lengths, the kept reward standard deviation and the share of kept groups with none, and the
head's AUC and sure-and-wrong share at each point. Last, per pruning arm, paired by seed against
PODS without pruning: the kept length and generation seconds per step as ratios, geometric mean
and 95% interval (#72: kept mean length within 5%).

    python benchmarks/pruning_training.py [--seeds 5] [--budget_minutes 3] [--extra 2]
        [--rule finished --rule sure] [--output_dir runs/pruning-training] [--record NAME]
        [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from podsrl.experiments.compare import analyze, format_table, planned_arm_names, run_comparison, write_report
from podsrl.experiments.runs import arm_name
from podsrl.experiments.stats import t_quantile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from partial_rollouts import base_config, step_rows  # noqa: E402 (benchmarks/ is not a package)
from results_md import record  # noqa: E402

COLUMNS = (  # (header, per-step value from a record)
    ("s / step", lambda r: sum(v for k, v in r.items() if k.startswith("time_") and k != "time_eval")),
    ("generation s / step", lambda r: r["time_generate"]),
    ("rollouts generated", lambda r: r.get("rollouts_generated", float("nan"))),
    ("pruned samples", lambda r: r.get("pruned_samples", 0.0)),
    ("pruned tokens", lambda r: r.get("pruned_tokens", 0.0)),
    ("kept length", lambda r: r["kept_completion_len"]),
    ("all lengths", lambda r: r["completion_len"]),
    ("kept reward std", lambda r: r["kept_reward_std"]),
    ("kept constant groups", lambda r: r["kept_reward_zero_var_frac"]),
)
VALUE = dict(COLUMNS)
POINT_METRICS = (("AUC", "prune_auc"), ("sure and wrong", "prune_sure_wrong"))


def plan_arms(base, extra: int, rules: list[str]) -> list[dict]:
    """The arms' config overrides: PODS at its best, with pruning per rule, then GRPO-GA."""
    partial = {"partial_rollouts": True, "partial_extra_prompts": extra}
    pods = dict(method="pods", num_generations=base.num_generations, num_kept=base.num_kept,
                group_early_stop=True, prune_running=False, **partial)
    ga = dict(method="grpo-ga", num_generations=base.num_generations, num_kept=base.num_kept,
              group_early_stop=False, prune_running=False, **partial)
    return [pods, *({**pods, "prune_running": True, "prune_rule": rule} for rule in rules), ga]


def mean_over(rows: list[dict], value) -> float:
    values = [value(r) for r in rows]
    values = [v for v in values if v is not None and v == v]  # a point no sample reached logs NaN / null
    return statistics.fmean(values) if values else float("nan")


def per_arm_table(arms: dict[str, list[Path]]) -> str:
    rows_of = {name: [r for p in paths for r in step_rows(p)] for name, paths in arms.items()}  # each file read once
    points = sorted({int(k.rsplit("_", 1)[1]) for rows in rows_of.values() for r in rows
                     for k in r if k.startswith("prune_auc_")})
    headers = [h for h, _ in COLUMNS] + [f"{h} at point {j}" for j in points for h, _ in POINT_METRICS]
    lines = ["| arm | " + " | ".join(headers) + " |", "| --- " * (len(headers) + 1) + "|"]
    for name, rows in rows_of.items():
        cells = [f"{mean_over(rows, value):.3f}" for _, value in COLUMNS]
        for j in points:
            cells += [f"{mean_over(rows, lambda r, k=f'{key}_{j}': r.get(k)):.3f}" for _, key in POINT_METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_ratio(arm: list[Path], baseline: list[Path], value) -> str:
    """Per seed, the arm's mean of ``value`` over its steps over the baseline's: geometric mean
    and 95% interval (t over the log ratios), and the seeds' ratios."""
    by_seed = {p.name: p for p in baseline}
    ratios = [mean_over(step_rows(p), value) / mean_over(step_rows(by_seed[p.name]), value)
              for p in arm if p.name in by_seed]
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    half = t_quantile(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0
    seeds = ", ".join(f"{r:.3f}" for r in ratios)
    return f"{math.exp(centre):.3f} [{math.exp(centre - half):.3f}, {math.exp(centre + half):.3f}] (seeds: {seeds})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget_minutes", type=float, default=3.0)
    parser.add_argument("--extra", type=int, default=2, help="partial_extra_prompts of every arm")
    parser.add_argument("--rule", action="append", default=None, help="prune_rule of a pruning arm (repeatable; "
                                                                      "default: finished and sure)")
    parser.add_argument("--config", default="configs/tiny-chain-early-stop.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override one setting")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/pruning-training"))
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    base = base_config(parser, args.config, args.set)
    arms = plan_arms(base, args.extra, args.rule or ["finished", "sure"])
    run_dirs = run_comparison(base, arms, args.seeds, args.budget_minutes, args.output_dir / "runs")
    names = planned_arm_names(base, arms)
    sections = []
    for baseline in (names[0], names[-1]):  # PODS without pruning, then GRPO-GA
        result = analyze(run_dirs, baseline=baseline)
        write_report(result, args.output_dir / baseline.replace(" ", "_").replace("/", "_"),
                     title=f"pruning running rollouts, baseline {baseline}")
        sections.append(f"Baseline {baseline}:\n\n{format_table(result)}")
    by_arm: dict[str, list[Path]] = {}
    for path in run_dirs:
        by_arm.setdefault(arm_name(json.loads((path / "config.json").read_text())), []).append(path)
    paired = [f"- {name}: kept length {paired_ratio(by_arm[name], by_arm[names[0]], VALUE['kept length'])}; "
              f"generation s / step {paired_ratio(by_arm[name], by_arm[names[0]], VALUE['generation s / step'])}"
              for name in names[1:-1]]
    body = ("\n\n".join(sections) + f"\n\nPer step (means over every step of every seed):\n\n{per_arm_table(by_arm)}"
            + f"\n\nPaired by seed against {names[0]} (geometric mean [95% interval]):\n" + "\n".join(paired))
    print(body)
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What adaptive_n chose, from the metrics.jsonl of its runs: the mean n in each quarter of
the training budget, how often it explored, and its expected fraction of informative groups
against the fraction of kept groups that were actually constant.

    python benchmarks/adaptive_n_trace.py RUN_DIR [RUN_DIR ...] [--record NAME]

(RUN_DIRs are `podsrl train` output folders of adaptive_n runs, e.g.
runs/adaptive-main/runs/pods-nauto-m4-max_variance/seed*.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from podsrl.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

QUARTERS = 4


def trace(run_dir: Path) -> dict:
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "n" in r]
    if not steps:
        raise SystemExit(f"{run_dir}: no adaptive_n decisions in metrics.jsonl (not an adaptive_n run?)")
    budget = steps[-1]["train_seconds"]
    quarters = []
    for q in range(QUARTERS):
        part = [r["n"] for r in steps if q * budget / QUARTERS <= r["train_seconds"] < (q + 1) * budget / QUARTERS
                or (q == QUARTERS - 1 and r["train_seconds"] == budget)]
        quarters.append(statistics.fmean(part) if part else float("nan"))
    decided = [r for r in steps if "n_informative" in r]
    return {"steps": len(steps), "quarters": quarters,
            "explored": sum(r["n_explore"] for r in steps) / len(steps),
            "informative": statistics.fmean(r["n_informative"] for r in decided),
            "constant": statistics.fmean(r["kept_reward_zero_var_frac"] for r in decided),
            "per_rollout_ms": 1000 * statistics.fmean(r["n_generation_per_rollout_s"] for r in decided),
            "rest_s": statistics.fmean(r["n_rest_s"] for r in decided)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    lines = ["| run | steps | mean n in quarter 1 / 2 / 3 / 4 of the budget | steps exploring | expected "
             "informative groups | kept groups actually constant | fitted s per rollout (ms) | rest of step (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run_dir in args.run_dirs:
        t = trace(run_dir)
        quarters = " / ".join(f"{q:.1f}" for q in t["quarters"])
        lines.append(f"| {run_dir} | {t['steps']} | {quarters} | {100 * t['explored']:.0f}% | "
                     f"{100 * t['informative']:.1f}% | {100 * t['constant']:.1f}% | {t['per_rollout_ms']:.3f} | "
                     f"{t['rest_s']:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        record(args.record, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What each arm spent per informative group, from finished podsrl runs (#30): a prompt
selector is worth it when fewer rollouts are generated for each group that teaches
something (rewards not all equal) without losing accuracy.

    python benchmarks/informative_groups.py RUN_DIR_OR_COMPARISON [...] [--record NAME]

Per arm (runs grouped as `podsrl compare` groups them), means over its runs of: rollouts
generated per step (every generation round: dynamic sampling's refills count), informative
groups trained per step, rollouts generated per informative group trained, the share of
generated groups that came out constant, the steps made, and the final held-out accuracy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from podsrl.experiments.runs import load_run
from podsrl.experiments.stats import mean_ci
from podsrl.methods import METHODS
from podsrl.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)
from rollout_costs import find_runs  # noqa: E402


def spending(run_dir: Path) -> dict[str, float]:
    """Per-step means of one run."""
    run = load_run(run_dir)
    config = run.config
    per_prompt = METHODS[config["method"]].generated_per_prompt(config["num_generations"], config["num_kept"])
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]
    prompts = config["prompts_per_step"]
    # dynamic sampling logs its rounds' prompts, early stop the rollouts it generated, others neither
    generated = [r["prompts_generated"] * per_prompt if "prompts_generated" in r
                 else r.get("rollouts_generated", prompts * per_prompt) for r in steps]
    informative = [prompts * (1 - r["reward_zero_var_frac"]) for r in steps]
    constant = [r.get("generated_constant_frac", r["reward_zero_var_frac"]) for r in steps]
    return {"arm": run.arm, "steps": len(steps), "generated": statistics.fmean(generated),
            "informative": statistics.fmean(informative),
            "per_informative": sum(generated) / max(sum(informative), 1e-9),
            "constant": statistics.fmean(constant), "final": run.evals[-1][1]}


def table(rows: list[dict]) -> str:
    arms: dict[str, list[dict]] = {}
    for row in rows:
        arms.setdefault(row["arm"], []).append(row)
    lines = ["| arm | runs | steps | rollouts generated / step | informative groups trained / step "
             "| rollouts per informative group | constant share of generated groups | final held-out accuracy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, runs in arms.items():
        def mean(key):
            return statistics.fmean(r[key] for r in runs)
        final, half = mean_ci([r["final"] for r in runs])
        spread = f" +- {100 * half:.1f}" if len(runs) > 1 else ""
        lines.append(f"| {name} | {len(runs)} | {mean('steps'):.0f} | {mean('generated'):.1f} "
                     f"| {mean('informative'):.2f} | {mean('per_informative'):.1f} | {100 * mean('constant'):.1f}% "
                     f"| {100 * final:.1f}%{spread} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    args = parser.parse_args()
    text = table([spending(run) for run in find_runs(args.paths)])
    print(text)
    if args.record:
        record(args.record, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

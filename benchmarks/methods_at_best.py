"""Every method at its best, side by side (#70 item 4): PODS 16 -> 4, GRPO-GA 16 and GRPO 4/4 in the
reasoning regime, interleaved seed by seed with one training-time budget (``podsrl compare``'s
methodology), on the slots engine and podsrl's decode step.

Arms, on ``--config`` (default configs/tiny-chain-early-stop.yaml):

* PODS n -> m with the best settings measured in the regime: lossless early stop and partial
  rollouts (``--extra`` groups in flight; RESULTS.md, tiny-chain-partial/5-seeds);
* GRPO-GA n (trains all n, m at a time), without and with partial rollouts: which of the two pays
  for it was never measured, so both run and the better one is its best;
* GRPO m/m with partial rollouts, its best in the 5-seed comparison of #60 (1.12x plain GRPO on
  the mean curves; ``--grpo_plain`` adds the plain arm too).

GRPO arms run without early stop (it needs a method that drops rollouts). One table per baseline
(each GRPO arm), then per-step means (partial_rollouts.py's columns).

    python benchmarks/methods_at_best.py [--seeds 5] [--budget_minutes 3] [--extra 2] [--grpo_plain]
        [--output_dir runs/methods-at-best] [--record NAME] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from podsrl.experiments.compare import analyze, format_table, planned_arm_names, run_comparison, write_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from partial_rollouts import base_config, per_arm_table  # noqa: E402 (benchmarks/ is not a package)
from results_md import record  # noqa: E402


def plan_arms(base, extra: int, grpo_plain: bool) -> list[dict]:
    """The arms' config overrides: PODS at its best first, then the GRPO arms."""
    partial = {"partial_rollouts": True, "partial_extra_prompts": extra}
    pods = dict(method="pods", num_generations=base.num_generations, num_kept=base.num_kept,
                group_early_stop=True, **partial)
    ga = dict(method="grpo-ga", num_generations=base.num_generations, num_kept=base.num_kept,
              group_early_stop=False, partial_rollouts=False)
    grpo = dict(method="grpo", num_generations=base.num_kept, num_kept=base.num_kept, group_early_stop=False)
    return [pods, ga, {**ga, **partial}, *([{**grpo, "partial_rollouts": False}] if grpo_plain else []),
            {**grpo, **partial}]


def baseline_sections(run_dirs: list[Path], baselines: list[str], output_dir: Path, title: str) -> list[str]:
    """The comparison's table against each of ``baselines`` (its report written under ``output_dir``)."""
    sections = []
    for baseline in baselines:
        result = analyze(run_dirs, baseline=baseline)
        write_report(result, output_dir / baseline.replace(" ", "_").replace("/", "_"),
                     title=f"{title}, baseline {baseline}")
        sections.append(f"Baseline {baseline}:\n\n{format_table(result)}")
    return sections


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget_minutes", type=float, default=3.0)
    parser.add_argument("--extra", type=int, default=2, help="partial_extra_prompts of the partial arms")
    parser.add_argument("--grpo_plain", action="store_true", help="GRPO m/m without partial rollouts too")
    parser.add_argument("--config", default="configs/tiny-chain-early-stop.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override one setting")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/methods-at-best"))
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    base = base_config(parser, args.config, args.set)
    arms = plan_arms(base, args.extra, args.grpo_plain)
    run_dirs = run_comparison(base, arms, args.seeds, args.budget_minutes, args.output_dir / "runs")
    names = planned_arm_names(base, arms)
    # PODS against each GRPO arm, and the GRPO arms against each other
    sections = baseline_sections(run_dirs, names[1:], args.output_dir, "methods at their best")
    trained = {"pods": base.num_kept, "grpo": base.num_kept, "grpo-ga": base.num_generations}
    configs = {}
    for path in run_dirs:
        config = json.loads((path / "config.json").read_text())
        configs[path] = {**config, "trained": trained[config["method"]]}
    steps = per_arm_table(run_dirs, configs)
    body = "\n\n".join(sections) + f"\n\nPer step (means over every step of every seed):\n\n{steps}"
    print(body)
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Partial rollouts (#60) against the same run without them, interleaved seed by seed with one
training-time budget (``podsrl compare``'s methodology), in the reasoning regime.

Arms, on ``--config`` (default configs/tiny-chain-early-stop.yaml: PODS 16 -> 4 on the slots
engine, 64 slots, round robin, lossless early stop; the best setting of #58):

* the config as it is (the baseline);
* the same with ``partial_rollouts``, once per ``--extra`` value (``partial_extra_prompts``:
  groups in flight beyond the step's 16);
* with ``--with_grpo``: GRPO m/m on the same engine (no early stop: it needs PODS), without and
  with partial rollouts (the first ``--extra``), and a second table with GRPO as the baseline.

Besides the time-to-accuracy table it prints, per arm, means over every step of every seed:
seconds per step and per generation, trained tokens per generation second (the kept
completions' tokens over the generation stage's seconds: the throughput that matters to
PODS, which trains on 4 of 16), the kept and all completions' lengths (partial rollouts must
not shorten what is trained), the share of trained tokens drawn by an earlier policy, their
staleness, samples resumed and restarted per step, the idle slot share, and the importance
weights.

    python benchmarks/partial_rollouts.py [--seeds 5] [--budget_minutes 10] [--extra 2 ...]
        [--with_grpo] [--output_dir runs/partial-rollouts] [--record NAME] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from podsrl.experiments.compare import analyze, format_table, planned_arm_names, run_comparison, write_report
from podsrl.experiments.runs import arm_name
from podsrl.metrics import read_metrics
from podsrl.trainer.config import make_config, parse_value

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

COLUMNS = (  # (header, per-step value from a record and the run's config)
    ("s / step", lambda r, c: sum(v for k, v in r.items() if k.startswith("time_") and k != "time_eval")),
    ("generation s / step", lambda r, c: r["time_generate"]),
    ("trained tokens / generation s", lambda r, c: r["kept_completion_len"] * c["prompts_per_step"]
     * c["trained"] / r["time_generate"]),
    ("kept length", lambda r, c: r["kept_completion_len"]),
    ("all lengths", lambda r, c: r["completion_len"]),
    ("off-policy tokens", lambda r, c: r.get("off_policy_token_frac", 0.0)),
    ("staleness mean", lambda r, c: r.get("staleness_mean", 0.0)),
    ("staleness max", lambda r, c: r.get("staleness_max", 0)),
    ("resumed / step", lambda r, c: r.get("partial_samples_resumed", 0)),
    ("restarted / step", lambda r, c: r.get("partial_samples_restarted", 0)),
    ("idle slots", lambda r, c: r.get("idle_slot_frac", float("nan"))),
    ("IS weight mean [min, max]", None),
    ("IS clipped", lambda r, c: r.get("importance_sampling_clipped_frac", 0.0)),
)


def step_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "time_generate" in r]


def per_arm_table(run_dirs: list[Path], configs: dict[Path, dict]) -> str:
    arms: dict[str, list[Path]] = {}
    for path in run_dirs:
        arms.setdefault(arm_name(configs[path]), []).append(path)
    lines = ["| arm | " + " | ".join(header for header, _ in COLUMNS) + " |",
             "| --- " * (len(COLUMNS) + 1) + "|"]
    for name, paths in arms.items():
        rows = [(r, configs[p]) for p in paths for r in step_rows(p)]
        cells = []
        for header, value in COLUMNS:
            if value is None:  # the importance weights: mean, and the extremes over every step
                weights = [r for r, _ in rows if "importance_sampling_weight_mean" in r]
                cells.append("-" if not weights else
                             f"{statistics.fmean(r['importance_sampling_weight_mean'] for r in weights):.3f} "
                             f"[{min(r['importance_sampling_weight_min'] for r in weights):.3f}, "
                             f"{max(r['importance_sampling_weight_max'] for r in weights):.3f}]")
                continue
            values = [value(r, c) for r, c in rows]
            cells.append(f"{max(values)}" if header == "staleness max" else f"{statistics.fmean(values):.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def base_config(parser: argparse.ArgumentParser, config: str, pairs: list[str]):
    """``config`` with the ``--set FIELD=VALUE`` overrides (a malformed pair is the parser's error)."""
    malformed = [pair for pair in pairs if "=" not in pair]
    if malformed:
        parser.error(f"--set: expected FIELD=VALUE, got {malformed[0]!r}")
    settings = dict(pair.split("=", 1) for pair in pairs)
    return make_config(config, {k: parse_value(k, v) for k, v in settings.items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget_minutes", type=float, default=10.0)
    parser.add_argument("--extra", type=int, action="append", default=None,
                        help="partial_extra_prompts of a partial arm (repeatable; default 2)")
    parser.add_argument("--with_grpo", action="store_true", help="GRPO m/m without and with partial rollouts")
    parser.add_argument("--config", default="configs/tiny-chain-early-stop.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override one setting")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/partial-rollouts"))
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    base = base_config(parser, args.config, args.set)
    extras = args.extra or [2]
    pods = dict(method="pods", num_generations=base.num_generations, num_kept=base.num_kept)
    arms = [pods] + [{**pods, "partial_rollouts": True, "partial_extra_prompts": k} for k in extras]
    grpo = dict(method="grpo", num_generations=base.num_kept, num_kept=base.num_kept, group_early_stop=False)
    grpo_arms = [grpo, {**grpo, "partial_rollouts": True, "partial_extra_prompts": extras[0]}] if args.with_grpo \
        else []
    run_dirs = run_comparison(base, arms + grpo_arms, args.seeds, args.budget_minutes, args.output_dir / "runs")
    # each run's own config, and the rollouts it trains on per prompt (m for PODS and GRPO m/m)
    configs = {path: {**json.loads((path / "config.json").read_text()), "trained": base.num_kept}
               for path in run_dirs}
    pods_names = planned_arm_names(base, arms)
    pods_runs = [p for p in run_dirs if arm_name(configs[p]) in pods_names]
    result = analyze(pods_runs, baseline=pods_names[0])
    write_report(result, args.output_dir, title="partial rollouts")
    body = (f"{format_table(result)}\n\nPer step (means over every step of every seed):\n\n"
            f"{per_arm_table(run_dirs, configs)}")
    if grpo_arms:
        grpo_names = planned_arm_names(base, grpo_arms)
        against = analyze([p for p in run_dirs if arm_name(configs[p]) in grpo_names], baseline=grpo_names[0])
        body += (f"\n\nGRPO {base.num_kept}/{base.num_kept} without and with partial rollouts:\n\n"
                 f"{format_table(against)}")
    print(body)
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

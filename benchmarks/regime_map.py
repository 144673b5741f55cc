"""Where does PODS win at equal time? GRPO (m/m) vs PODS (n -> m) across regimes.

For each regime (one change from the main job's settings: task difficulty, completion
length, prompts per step, LoRA instead of full fine-tuning) this runs `podsrl compare
--methods grpo,pods` with the same training-time budget per run, then prints one table:
seconds per step of each arm split into inference and update, how much a generated rollout
costs relative to a trained one, the fraction of GRPO's groups that carry no signal (all
rewards equal), peak accuracies and the time-to-accuracy speedup of PODS over GRPO.

    python benchmarks/regime_map.py [--seeds 2] [--budget_minutes 1] [--output_dir runs/regime]
        [--regimes base,level1,...] [-- extra podsrl train options applied to every regime]
    python benchmarks/regime_map.py --regimes smollm2 --seeds 1 --budget_minutes 8  # the larger model

Finished runs are reused, so an interrupted map can be restarted. Writes
OUTPUT_DIR/regime_map.md and regime_map.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from podsrl.cli import main as podsrl
from podsrl.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

# name -> (what changes, podsrl train options)
REGIMES = {
    "base": ("main job: level 3, 8 new tokens, 16 prompts/step, full fine-tuning", []),
    "level1": ("easier task (level 1)", ["--task_level", "1"]),
    "level5": ("harder task (level 5)", ["--task_level", "5"]),
    "tokens32": ("longer completion budget (32 new tokens)", ["--max_completion_length", "32"]),
    "prompts4": ("4 prompts per step", ["--prompts_per_step", "4"]),
    "prompts64": ("64 prompts per step", ["--prompts_per_step", "64"]),
    "lora": ("LoRA r = 8 instead of full fine-tuning (lr 1e-3)", ["--lora_rank", "8", "--learning_rate", "1e-3"]),
    # a 165x larger model: minutes per evaluation on 2 cores, so run it alone with a longer budget
    "smollm2": ("SmolLM2-135M-Instruct + LoRA r = 16, level 1 (configs/smollm2-arith.yaml)",
                ["--config", "configs/smollm2-arith.yaml", "--eval_steps", "8", "--eval_prompts", "100"]),
    # #58's reasoning regime: worked chains of 20-240 tokens, generation most of a step
    "chain": ("tiny-chain on the chain task, 256 new tokens (configs/tiny-chain.yaml)",
              ["--config", "configs/tiny-chain.yaml"]),
}
DEFAULT_REGIMES = "base,level1,level5,tokens32,prompts4,prompts64,lora"
N_M = (16, 4)  # PODS n -> m; GRPO generates and trains m


def zero_variance_fraction(run_dirs: list[str]) -> float:
    """Mean fraction of trained (kept) groups whose rewards are all equal, over every step of every run."""
    values = [row["kept_reward_zero_var_frac"] for run in run_dirs for row in read_metrics(Path(run) / "metrics.jsonl")
              if "kept_reward_zero_var_frac" in row]
    return sum(values) / max(1, len(values))


def summarize(name: str, report: dict) -> dict:
    rows = {row["arm"].split()[0]: row for row in report["rows"]}
    grpo, pods = rows["grpo"], rows["pods"]
    grpo_runs = next(runs for arm, runs in report["runs"].items() if arm.startswith("grpo"))
    pods_runs = next(runs for arm, runs in report["runs"].items() if arm.startswith("pods"))
    # seconds to generate one rollout vs to train on one: PODS pays off when the first is small
    n, m = N_M
    rollout_cost = (pods["inference_seconds_per_step"] - grpo["inference_seconds_per_step"]) / (n - m)  # extra ones
    trained_cost = grpo["update_seconds_per_step"] / m
    return {
        "regime": name,
        "change": REGIMES[name][0],
        "grpo_step": grpo["seconds_per_step"], "grpo_inference": grpo["inference_seconds_per_step"],
        "grpo_update": grpo["update_seconds_per_step"],
        "pods_step": pods["seconds_per_step"], "pods_inference": pods["inference_seconds_per_step"],
        "pods_update": pods["update_seconds_per_step"],
        "generate_vs_train_cost": rollout_cost / trained_cost if trained_cost else float("nan"),
        "grpo_zero_var": zero_variance_fraction(grpo_runs), "pods_zero_var": zero_variance_fraction(pods_runs),
        "grpo_peak": grpo["peak_accuracy"], "pods_peak": pods["peak_accuracy"],
        "target": report["target_accuracy"], "speedup": pods["speedup_vs_baseline"],
        "speedup_per_seed": pods["speedup_per_seed_mean"], "speedup_ci95": pods["speedup_per_seed_ci95"],
        "pods_seeds_reaching": pods["seeds_reaching_target"], "seeds": pods["seeds"],
        "pairs": len(pods["seed_pairs"]), "censored_pairs": pods["censored_pairs"],
    }


def table(rows: list[dict]) -> str:
    fmt = lambda x, spec: "n/a" if x is None or x != x else format(x, spec)  # noqa: E731 (None/NaN-safe)
    lines = ["| regime | GRPO 4/4 s/step (inf + upd) | PODS 16->4 s/step (inf + upd) | extra rollout / trained "
             "rollout cost | zero-var groups GRPO / PODS-16 | peak acc GRPO / PODS | target | speedup x (mean "
             "curves) | per seed (95% CI) |", "| " + " | ".join(["---"] * 9) + " |"]
    for r in rows:
        lines.append(
            f"| {r['regime']}: {r['change']} | {r['grpo_step']:.3f} ({r['grpo_inference']:.3f} + "
            f"{r['grpo_update']:.3f}) | {r['pods_step']:.3f} ({r['pods_inference']:.3f} + {r['pods_update']:.3f}) | "
            f"{fmt(r['generate_vs_train_cost'], '.2f')} | {100 * r['grpo_zero_var']:.0f}% / "
            f"{100 * r['pods_zero_var']:.0f}% | {100 * r['grpo_peak']:.1f}% / {100 * r['pods_peak']:.1f}% | "
            f"{100 * r['target']:.1f}% | {fmt(r['speedup'], '.2f')} | {fmt(r['speedup_per_seed'], '.2f')} +- "
            f"{fmt(r['speedup_ci95'], '.2f')} ({r['pairs']} pairs, {r['censored_pairs']} censored) |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--budget_minutes", type=float, default=1.0)
    parser.add_argument("--output_dir", type=Path, default=Path("runs/regime"))
    parser.add_argument("--regimes", default=DEFAULT_REGIMES, help=f"known: {', '.join(REGIMES)}")
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as generated block NAME")
    args, extra = parser.parse_known_args()
    names = [r.strip() for r in args.regimes.split(",") if r.strip()]
    unknown = [r for r in names if r not in REGIMES]
    if unknown:
        parser.error(f"--regimes: unknown {unknown}; known: {', '.join(REGIMES)}")
    rows = []
    for name in names:
        out = args.output_dir / name
        print(f"\n=== {name}: {REGIMES[name][0]} ===", flush=True)
        code = podsrl(["compare", "--methods", "grpo,pods", "--num_generations", str(N_M[0]), "--num_kept", str(N_M[1]),
                       "--seeds", str(args.seeds), "--budget_minutes", str(args.budget_minutes),
                       "--output_dir", str(out / "runs"),
                       *REGIMES[name][1], *extra])
        if code:
            return code
        for produced in ("compare.md", "compare.json", "accuracy.png", "step_time.png"):
            shutil.move(str(out / "runs" / produced), out / produced)
        rows.append(summarize(name, json.loads((out / "compare.json").read_text())))
        (args.output_dir / "regime_map.json").write_text(json.dumps(rows, indent=1))
        (args.output_dir / "regime_map.md").write_text(table(rows) + "\n")
    print("\n" + table(rows))
    if args.record:
        record(args.record, table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CPU reproduction of the paper's comparison, on the tiny model and the arithmetic task.

Experiments, each a `podsrl compare` (runs one at a time on this machine, interleaved seed
by seed, every run with the same training-time budget; finished runs are reused when re-run):

1. methods:      grpo (n = m) vs grpo-ga (n, accumulated) vs pods (n -> m), max_variance;
2. grpo-vs-pods: grpo (m) vs pods (n -> m) only (the quoted speedup);
   pods-vs-ga:   the paper's second comparison, grpo-ga (n, accumulated; the baseline) vs pods (n -> m):
                 the same rollouts generated, m / n of them trained (#51 item 4a);
   paper-ratio:  the paper's first comparison at its ratio, grpo 16/16 vs pods 64 -> 16, read per step
                 (#51 item 4b);
3. rules:        pods with max_variance vs random vs max_reward;
4. nsweep:       pods n -> m at fixed m;
5. msweep:       pods n -> m at fixed n (the paper's ablation: flat down to m = 4, worse at m = 2),
                 against the default m = 4;
6. adaptive:     adaptive_n (n: auto) against fixed n = 8, 16, 32 (baseline: the default n = 16);
7. adaptive-easy: the same with n = 16, 32, 64 (run it on an easier task: -- --task_level 1);
8. selectors:    pods n -> m with each prompt selector, shuffled (baseline) and pass_rate, each
                 without and with dynamic sampling (#30, #52; a small pool revisited each epoch:
                 -- --max_train_prompts 256; benchmarks/informative_groups.py adds what each
                 spent per informative group).

    python benchmarks/time_to_accuracy.py [--seeds 3] [--budget_minutes 1] [--output_dir runs/tta]
        [--experiments methods,rules,nsweep] [--figures benchmarks/figures] [--record NAME]
        [-- any podsrl train options, e.g. --task_level 4]

Each experiment writes compare.md / compare.json / accuracy.png / step_time.png under
OUTPUT_DIR/EXPERIMENT and prints its table. ``--record NAME`` also writes the table, with
the command, date, commit and machine, into benchmarks/RESULTS.md as the generated block
NAME-EXPERIMENT (replacing an earlier one); ``--figures`` copies the figures there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from podsrl.cli import main as podsrl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

EXPERIMENTS = {
    "methods": ["--methods", "grpo,grpo-ga,pods"],
    "grpo-vs-pods": ["--methods", "grpo,pods"],
    "pods-vs-ga": ["--methods", "grpo-ga,pods", "--baseline", "grpo-ga"],
    "paper-ratio": ["--methods", "grpo,pods", "--n_values", "64", "--m_values", "16"],
    "rules": ["--methods", "pods", "--rules", "max_variance,random,max_reward"],
    "nsweep": ["--methods", "pods", "--n_values", "8,16,32,64"],
    "adaptive": ["--methods", "pods", "--n_values", "8,16,32,auto", "--baseline", "pods 16->4 max_variance"],
    "adaptive-easy": ["--methods", "pods", "--n_values", "16,32,64,auto", "--baseline", "pods 16->4 max_variance"],
    "msweep": ["--methods", "pods", "--n_values", "16", "--m_values", "2,4,8", "--baseline", "pods 16->4 max_variance"],
    "selectors": ["--methods", "pods", "--prompt_selectors", "shuffled,pass_rate", "--dynamic_sampling", "false,true",
                  "--baseline", "pods 16->4 max_variance"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget_minutes", type=float, default=1.0)
    parser.add_argument("--budget_steps", type=int, default=0,
                        help="steps per run instead of minutes (paper-ratio is read per step)")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/tta"))
    parser.add_argument("--experiments", default="methods,rules,nsweep")
    parser.add_argument("--figures", type=Path, default=None, help="copy the figures here (e.g. benchmarks/figures)")
    parser.add_argument("--record", default="", help="write each table into RESULTS.md as block NAME-EXPERIMENT")
    args, train_options = parser.parse_known_args()
    train_options = [option for option in train_options if option != "--"]  # the separator the usage line shows
    runs_root = args.output_dir / "runs"  # shared: an arm that two experiments need runs once
    names = [e.strip() for e in args.experiments.split(",") if e.strip()]
    unknown = [name for name in names if name not in EXPERIMENTS]
    if unknown:
        parser.error(f"--experiments: unknown {unknown}; known: {', '.join(EXPERIMENTS)}")
    for name in names:
        report = args.output_dir / name
        stem = f"{args.record}-{name}" if args.record else name  # figure and RESULTS.md block names
        print(f"\n=== {name} ===", flush=True)
        budget = (["--budget_steps", str(args.budget_steps)] if args.budget_steps
                  else ["--budget_minutes", str(args.budget_minutes)])
        code = podsrl(["compare", *EXPERIMENTS[name], "--seeds", str(args.seeds), *budget,
                       "--output_dir", str(runs_root), *train_options])
        if code:
            return code
        for produced in ("compare.md", "compare.json", "accuracy.png", "step_time.png"):
            report.mkdir(parents=True, exist_ok=True)
            shutil.move(str(runs_root / produced), report / produced)
            if args.figures and produced.endswith(".png"):
                args.figures.mkdir(parents=True, exist_ok=True)
                shutil.copy(report / produced, args.figures / f"{stem}-{produced}")
        if args.record:
            figure = f"\n\n![{name}: accuracy vs training time](figures/{stem}-accuracy.png)" if args.figures else ""
            record(stem, (report / "compare.md").read_text() + figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())

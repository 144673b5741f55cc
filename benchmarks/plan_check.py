"""The planner against measured steps (#81 item 2): in each regime, `podsrl plan`'s probe, then
each method trained as a run of its own for ``--steps`` steps after one warm-up step, on the same
machine in the same run; its measured seconds per step (the training clock, as time to accuracy
counts it) beside the planner's prediction, and each baseline's step over PODS's, predicted
against measured.

    python benchmarks/plan_check.py [--regimes main,tiny-chain,smollm2-full] [--steps 12] [--rounds 2]
        [--probe_steps 2] [--record NAME]

The measured runs are the probe's arms (`podsrl.experiments.plan.arm_config`: evaluation at its
cheapest, untimed) with more steps; rounds interleave the methods, the order reversed every
other round, and the table gives the median over rounds. Target: every predicted step-time ratio
within 15% of the measured one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

from podsrl.experiments.plan import ARMS, arm_config, arm_seconds, probe  # noqa: E402
from podsrl.metrics import read_metrics  # noqa: E402
from podsrl.trainer import train  # noqa: E402
from podsrl.trainer.config import make_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# smollm2-full: #81 item 3's regime (its model from benchmarks/format_warmup.py, in runs/smollm2-format)
REGIMES = {"main": (None, {}), "tiny-chain": (REPO / "configs" / "tiny-chain.yaml", {}),
           "smollm2-full": (REPO / "configs" / "smollm2-full.yaml", {})}
TARGET = 0.15  # a predicted ratio within 15% of the measured one


def measured_steps(cfg, steps: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per step of each method's run, warm-up dropped, round by round."""
    seconds: dict[str, list[float]] = {method: [] for method in ARMS}
    with tempfile.TemporaryDirectory(prefix="plan-check-") as scratch:
        for round_ in range(rounds):
            for method in ARMS if round_ % 2 == 0 else ARMS[::-1]:
                arm = arm_config(cfg, method, 1 + steps, Path(scratch) / f"round{round_}")
                train(arm)
                seconds[method].append(arm_seconds(arm.to_dict(), read_metrics(Path(arm.output_dir) /
                                                                               "metrics.jsonl"), 1)["step"])
    return seconds


def regime_lines(name: str, cfg, steps: int, rounds: int,
                 probe_steps: int = 2) -> tuple[list[str], list[float], str]:
    """The regime's rows, each predicted ratio's error against the measured one, and what the probe found."""
    found = probe(cfg, probe_steps)
    n, m = cfg.num_generations, cfg.num_kept
    costs = found.costs
    predicted = {"pods": found.pods_costs.step_seconds("pods", n, m), "grpo": costs.step_seconds("grpo", n, m),
                 "grpo-ga": costs.step_seconds("grpo-ga", n, m)}
    runs = measured_steps(cfg, steps, rounds)
    measured = {method: statistics.median(values) for method, values in runs.items()}
    lines, errors = [], []
    for method in ARMS:
        shown = {"pods": f"pods {n} -> {m}", "grpo": f"grpo {m}/{m}", "grpo-ga": f"grpo-ga {n}"}[method]
        lines.append(f"| {name} | {shown} | {predicted[method]:.3f} | {measured[method]:.3f} "
                     f"({', '.join(f'{s:.3f}' for s in runs[method])}) | {predicted[method] / measured[method]:.2f} |")
    for baseline in ("grpo", "grpo-ga"):
        guess, seen = predicted[baseline] / predicted["pods"], measured[baseline] / measured["pods"]
        errors.append(guess / seen - 1)
        lines.append(f"| {name} | {baseline} over pods | {guess:.2f}x | {seen:.2f}x | {guess / seen:.2f} |")
    note = (f"{name}: g {1000 * costs.generated:.2f} ms, t {1000 * costs.trained:.2f} ms, f {costs.fixed:.3f} s, "
            f"PODS generated {100 * found.pods_generated_share:.0f}% of its n; probe {found.seconds:.0f} s")
    return lines, errors, note


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regimes", default="main,tiny-chain", help=f"comma-separated, of {', '.join(REGIMES)}")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--probe_steps", type=int, default=2, help="the probe's timed steps a method (podsrl plan's "
                                                                   "--probe_steps)")
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    args = parser.parse_args()
    lines = ["| regime | method, or ratio | predicted (s/step or ratio) | measured (median; rounds) | predicted / "
             "measured |", "| --- | --- | --- | --- | --- |"]
    notes, errors = [], []
    for name in args.regimes.split(","):
        if name not in REGIMES:
            raise SystemExit(f"--regimes: unknown {name!r}; use {', '.join(REGIMES)}")
        config, overrides = REGIMES[name]
        cfg = make_config(str(config) if config else None, {"progress": "false", **overrides})
        rows, found, note = regime_lines(name, cfg, args.steps, args.rounds, args.probe_steps)
        lines += rows
        notes.append(note)
        errors += found
        print(f"{name}: done", file=sys.stderr, flush=True)
    worst = max(abs(e) for e in errors)
    lines += ["", "Probes: " + "; ".join(notes) + ".",
              f"{args.steps} steps a run after one warm-up, {args.rounds} rounds interleaved. The worst predicted "
              f"step-time ratio is {100 * worst:.0f}% off the measured one (target: within {100 * TARGET:.0f}%): "
              f"{'met' if worst <= TARGET else 'missed'}."]
    body = "\n".join(lines)
    print(body)
    if args.record:
        record(args.record, body)
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())

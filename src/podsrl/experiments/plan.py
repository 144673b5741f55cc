"""``podsrl plan``: a step's economics measured on the user's own model, task, settings and
machine (:mod:`podsrl.experiments.economics`), before GPU days are spent on a comparison.

The probe trains the run's config for a few steps as PODS n -> m, GRPO m/m and GRPO-GA n, each
in a temporary folder, at the run's own shapes (prompts a step, lengths, engine, precision,
micro-batches), and reads each step's stage times from its metrics: the first steps are warm-up
and are dropped. Generation seconds (generate + reward) against the rollouts generated, and
update seconds (old log-probs + update) against the rollouts trained, each fitted by a line over
the three arms: the slopes are g and t; f is what a whole step took on the training clock (the
time-to-accuracy axis) beyond g and t times its rollouts, averaged over the arms. PODS-only
settings (early stop, pruning, adaptive n) stay with the PODS arm; PODS's rows are predicted at
the share of its n the probe's PODS steps generated.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from podsrl.experiments.economics import (
    BASELINES,
    RECORDED,
    StepCosts,
    break_even,
    fit_line,
    grid,
    recommendation,
)
from podsrl.experiments.runs import generated_per_step
from podsrl.methods import METHODS
from podsrl.metrics import read_metrics
from podsrl.provenance import machine_description

ARMS = ("pods", "grpo", "grpo-ga")
# refused with the baselines
PODS_ONLY = {"group_early_stop": False, "prune_running": False, "adaptive_n": False}


@dataclass(frozen=True)
class Probe:
    """What the probe measured: the fitted costs, PODS's share of its n generated, the update's
    largest memory per micro-batch (MiB; None where not logged), and each arm's mean seconds of a
    step's generation, update and rest, with its rollouts generated and trained."""

    costs: StepCosts
    pods_generated_share: float
    update_mb: float | None
    arms: dict[str, dict[str, float]]
    seconds: float  # the probe's wall time

    @property
    def pods_costs(self) -> StepCosts:
        """The costs PODS's rows are predicted at: its generation at the share of n it generated."""
        return dataclasses.replace(self.costs, generated=self.costs.generated * self.pods_generated_share)


def arm_config(cfg, method: str, steps: int, folder: Path):
    """The run's config as a probe arm: ``method`` at the run's n and m (GRPO keeps n >= m), a few
    steps, evaluation and files at their cheapest, in ``folder``."""
    extra = {} if method == "pods" else dict(PODS_ONLY)
    if method == "grpo":
        extra["num_generations"] = max(cfg.num_generations, cfg.num_kept)
    return dataclasses.replace(cfg, method=method, max_steps=steps, max_minutes=0.0, eval_steps=0,
                               eval_prompts=1, eval_samples=1, eval_greedy=False, save_steps=0,
                               checkpoint_minutes=0.0, save_total_limit=1, log_rollouts=0, report_to="none",
                               progress=False, resume=False, output_dir=str(folder / method), **extra)


def arm_seconds(config: dict, records: list[dict], warmup: int) -> dict[str, float]:
    """An arm's mean per step, warm-up dropped: the whole step on the training clock, its generation,
    update and other seconds, rollouts generated (as the steps logged them) and trained, update
    memory per micro-batch (MiB, largest)."""
    steps = [r for r in records if r["step"] > warmup]
    if not steps:
        raise ValueError(f"plan: the probe's {config['method']} run logged no step after its {warmup} "
                         "warm-up")
    start = next(r["train_seconds"] for r in records if r["step"] == warmup)  # the training clock then
    method = METHODS[config["method"]]
    trained = config["prompts_per_step"] * method.trained_per_prompt(config["num_generations"],
                                                                     config["num_kept"])
    memory = [r.get("update_peak_cuda_mb") or r.get("update_activation_mb") for r in steps]
    return {"step": (steps[-1]["train_seconds"] - start) / len(steps),
            "generation": statistics.fmean(r.get("time_generate", 0.0) + r.get("time_reward", 0.0)
                                           for r in steps),
            "update": statistics.fmean((r.get("time_logprobs") or 0.0) + r.get("time_update", 0.0)
                                       for r in steps),
            "other": statistics.fmean(r.get("time_select", 0.0) + r.get("time_advantages", 0.0)
                                      for r in steps),
            "generated": statistics.fmean(generated_per_step(config, r) for r in steps),
            "trained": float(trained),
            "update_mb": max((value for value in memory if value is not None), default=float("nan"))}


def probe(cfg, steps: int = 2, warmup: int = 1) -> Probe:
    """Train ``cfg`` for ``warmup`` + ``steps`` steps as each of :data:`ARMS` and fit the costs."""
    from podsrl.trainer import train  # the trainer's machinery: loaded when a probe runs, not for --help

    if steps < 1:
        raise ValueError(f"probe_steps: at least 1 step timed after the warm-up, got {steps}")
    if cfg.num_kept >= cfg.num_generations:
        raise ValueError("num_kept: the probe tells a generated rollout from a trained one by PODS n -> m "
                         f"with m < n; got m = {cfg.num_kept}, n = {cfg.num_generations}")
    start, arms = time.perf_counter(), {}
    with tempfile.TemporaryDirectory(prefix="podsrl-plan-") as scratch:
        for method in tqdm(ARMS, desc="probing", unit="arm", disable=not cfg.progress):
            arm = arm_config(cfg, method, warmup + steps, Path(scratch))
            train(arm)  # a run that learned nothing in a few steps still timed them
            records = read_metrics(Path(arm.output_dir) / "metrics.jsonl")
            arms[method] = arm_seconds(arm.to_dict(), records, warmup)
    g = max(fit_line([(a["generated"], a["generation"]) for a in arms.values()])[1], 0.0)
    t = max(fit_line([(a["trained"], a["update"]) for a in arms.values()])[1], 0.0)
    # the fixed part: what a whole step took (the training clock, as time-to-accuracy counts it) beyond its
    # rollouts
    fixed = statistics.fmean(a["step"] - g * a["generated"] - t * a["trained"] for a in arms.values())
    costs = StepCosts(g, t, max(fixed, 0.0), cfg.prompts_per_step)
    share = arms["pods"]["generated"] / (cfg.prompts_per_step * cfg.num_generations)
    memory = [a["update_mb"] for a in arms.values() if a["update_mb"] == a["update_mb"]]
    return Probe(costs, share, max(memory) if memory else None, arms, time.perf_counter() - start)


def plan_rows(probe_result: Probe, n: int, m: int) -> list[dict]:
    """Each method's predicted step over the grid around (n, m), and PODS's break-even per-step
    learning against each baseline (PODS's generation at its measured share of n)."""
    costs, pods_costs = probe_result.costs, probe_result.pods_costs
    rows = []
    for a, b in grid(n, m):
        even = {row.baseline: row for row in break_even(pods_costs, a, b)}
        rows.append({"method": "pods", "n": a, "m": b, "step_seconds": pods_costs.step_seconds("pods", a, b),
                     **{f"{name}_step_ratio": row.step_ratio for name, row in even.items()},
                     **{f"learning_for_1x_vs_{name}": row.for_1x for name, row in even.items()},
                     **{f"learning_for_1.5x_vs_{name}": row.for_1_5x for name, row in even.items()}})
        rows.append({"method": "grpo", "n": b, "m": b, "step_seconds": costs.step_seconds("grpo", a, b)})
        rows.append({"method": "grpo-ga", "n": a, "m": a,
                     "step_seconds": costs.step_seconds("grpo-ga", a, b)})
    unique = {(r["method"], r["n"], r["m"]): r for r in rows}  # a baseline shared by two cells, once
    return list(unique.values())


def plan_report(cfg, probe_result: Probe) -> dict:
    """Everything `podsrl plan` says, as --json prints it."""
    costs, n, m = probe_result.costs, cfg.num_generations, cfg.num_kept
    return {"machine": machine_description(), "model": cfg.model, "task": str(cfg.task),
            "prompts_per_step": cfg.prompts_per_step, "probe_seconds": round(probe_result.seconds, 1),
            "costs": {"generated_rollout_seconds": costs.generated, "trained_rollout_seconds": costs.trained,
                      "step_fixed_seconds": costs.fixed,
                      "pods_generated_share": probe_result.pods_generated_share,
                      "update_peak_mb_per_micro_batch": probe_result.update_mb},
            "probe_arms": probe_result.arms, "methods": plan_rows(probe_result, n, m),
            "recorded_learning": [dataclasses.asdict(r) for r in RECORDED],
            "recommendation": recommendation(probe_result.pods_costs, n, m)}


HEADER = ["| method | n | m | s/step (predicted) | GRPO m/m over PODS | GRPO-GA n over PODS | PODS needs "
          "per-step learning vs GRPO (1x / 1.5x) | vs GRPO-GA (1x / 1.5x) |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]


def table_row(row: dict, n: int, m: int) -> str:
    """One method's row of the table; a PODS row with its step ratios and break-evens."""
    head = (f"| {row['method']}"
            f"{' (config)' if (row['method'], row['n'], row['m']) == ('pods', n, m) else ''} | "
            f"{row['n']} | {row['m']} | {row['step_seconds']:.3f} |")
    if row["method"] != "pods":
        return head + " | | | |"
    even = [f"{row[f'learning_for_1x_vs_{b}']:.2f}x / {row[f'learning_for_1.5x_vs_{b}']:.2f}x"
            for b in BASELINES]
    return head + (f" {row['grpo_step_ratio']:.2f}x | {row['grpo-ga_step_ratio']:.2f}x | {even[0]} | "
                   f"{even[1]} |")


def format_plan(report: dict, n: int, m: int) -> str:
    """The report as the command line prints it: the costs, the grid's table, the recorded
    per-step learning and the recommendation."""
    c = report["costs"]
    g, t, memory = (c["generated_rollout_seconds"], c["trained_rollout_seconds"],
                    c["update_peak_mb_per_micro_batch"])
    lines = [f"podsrl plan: {report['model']} on {report['task']}, {report['prompts_per_step']} prompts a "
             f"step, on {report['machine']} (probe: {report['probe_seconds']:.0f} s)",
             f"a generated rollout {1000 * g:.2f} ms, a trained one {1000 * t:.2f} ms (t/g = "
             f"{t / g if g else float('inf'):.2f}), a step's fixed part {c['step_fixed_seconds']:.3f} s; "
             f"PODS generated {100 * c['pods_generated_share']:.0f}% of its n; the update's peak per "
             f"micro-batch: {'not logged' if memory is None else f'{memory:.0f} MiB'}", "", *HEADER]
    order = sorted(report["methods"], key=lambda r: (r["method"] != "pods", r["method"], r["n"], r["m"]))
    lines += [table_row(row, n, m) for row in order]
    lines += ["", "per-step learning podsrl has measured (PODS over the baseline, in steps to its accuracy "
                  "levels; per seed 95% interval; benchmarks/RESULTS.md):"]
    lines += [f"- {r['regime']}: PODS {r['n']} -> {r['m']} vs {r['baseline']}: {r['ratio']:.2f}x "
              f"[{r['low']:.2f}, {r['high']:.2f}] ({r['section']})" for r in report["recorded_learning"]]
    lines += ["", f"recommendation: {report['recommendation']}", "",
              "The planner measures what a step costs here; it cannot know how much each method learns per "
              "step on your task: that is the recorded ratios above, or your own podsrl compare."]
    return "\n".join(lines)


def run_plan(cfg, as_json: bool, steps: int) -> str:
    """``podsrl plan``: probe, then the report as text or JSON."""
    report = plan_report(cfg, probe(cfg, steps=steps))
    return json.dumps(report, indent=2) if as_json else format_plan(report, cfg.num_generations, cfg.num_kept)

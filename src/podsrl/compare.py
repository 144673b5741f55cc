"""Compare methods the way the paper does: held-out accuracy against training time.

``analyze`` groups run directories into arms (same method, rule, n, m; different seeds),
puts every seed's accuracy curve on a common time grid, and reports per arm: the mean
curve with a confidence band, seconds per step split into inference (generate + reward)
and update, peak accuracy, and the speedup metric of the authors' plotting code: the time
the baseline needs to reach 99% of its own best mean accuracy, divided by the time each
arm needs to reach that same accuracy.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from podsrl.metrics import read_metrics
from podsrl.plot import save_accuracy_figure

TARGET_FRACTION = 0.99  # of the baseline's best mean accuracy (authors' plotting code)
GRID_POINTS = 200
# two-sided 95% Student-t quantiles by degrees of freedom (normal beyond the table)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(dof: int) -> float:
    if dof <= 0:
        return float("nan")
    return _T95.get(dof) or next((v for k, v in sorted(_T95.items()) if k >= dof), 1.96)


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of its 95% confidence interval (nan with one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


@dataclass
class Run:
    path: Path
    config: dict
    evals: list[tuple[float, float]]  # (training seconds, sampled accuracy)
    inference_seconds: float  # mean per step: generate + reward
    update_seconds: float  # mean per step: logprobs + update
    other_seconds: float  # mean per step: select + advantages
    steps: int

    @property
    def arm(self) -> str:
        c = self.config
        if c["method"] == "grpo":
            return f"grpo {c['m']}/{c['m']}"
        if c["method"] == "grpo-ga":
            return f"grpo-ga {c['n']}"
        return f"pods {c['n']}->{c['m']} {c['rule']}"

    def accuracy_at(self, seconds: float) -> float:
        """Linear interpolation between evaluations (held at the ends)."""
        times, accs = zip(*self.evals)
        if seconds <= times[0]:
            return accs[0]
        for (t0, a0), (t1, a1) in zip(self.evals, self.evals[1:]):
            if seconds <= t1:
                return a0 + (a1 - a0) * (seconds - t0) / (t1 - t0) if t1 > t0 else a1
        return accs[-1]

    def time_to(self, accuracy: float) -> float | None:
        """First training time at which the (interpolated) curve reaches ``accuracy``."""
        for (t0, a0), (t1, a1) in zip(self.evals, self.evals[1:]):
            if a0 >= accuracy:
                return t0
            if a1 >= accuracy:
                return t0 + (t1 - t0) * (accuracy - a0) / (a1 - a0)
        return self.evals[-1][0] if self.evals and self.evals[-1][1] >= accuracy else None


def load_run(path: Path) -> Run:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    records = read_metrics(path / "metrics.jsonl")
    evals = [(r["train_seconds"], r["eval_accuracy"]) for r in records if r.get("eval_accuracy") is not None]
    steps = [r for r in records if r["step"] > 0]
    if not evals or not steps:
        raise ValueError(f"{path}: no training steps or evaluations in metrics.jsonl")

    def per_step(*keys):
        return statistics.fmean(sum(r.get(k) or 0.0 for k in keys) for r in steps)

    return Run(path, config, evals, per_step("time_generate", "time_reward"),
               per_step("time_logprobs", "time_update"), per_step("time_select", "time_advantages"), len(steps))


@dataclass
class Arm:
    name: str
    runs: list[Run]
    grid: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    half_width: list[float] = field(default_factory=list)

    def fill_curve(self, grid: list[float]) -> None:
        self.grid = [t for t in grid if t <= min(r.evals[-1][0] for r in self.runs)]
        curves = [[r.accuracy_at(t) for t in self.grid] for r in self.runs]
        stats = [mean_ci(list(column)) for column in zip(*curves)]
        self.mean = [m for m, _ in stats]
        self.half_width = [h for _, h in stats]

    def band(self) -> tuple[list[float], list[float]]:
        """The 95% band around the mean curve, clipped to [0, 1]: accuracy is bounded, the
        t-interval is not (with 2 seeds t = 12.7 spans far beyond 0 and 1)."""
        lower = [max(0.0, m - h) for m, h in zip(self.mean, self.half_width)]
        upper = [min(1.0, m + h) for m, h in zip(self.mean, self.half_width)]
        return lower, upper

    def mean_time_to(self, accuracy: float) -> float | None:
        return next((t for t, a in zip(self.grid, self.mean) if a >= accuracy), None)


def analyze(run_dirs: list[Path], baseline: str | None = None) -> dict:
    """Group runs into arms and compute curves, step times and the speedup table.

    ``baseline`` is an arm name or a method ('grpo', 'grpo-ga'); default: the first grpo
    arm, else the first arm.
    """
    runs = [load_run(p) for p in run_dirs]
    arms: dict[str, Arm] = {}
    for run in runs:
        arms.setdefault(run.arm, Arm(run.arm, [])).runs.append(run)
    horizon = max(r.evals[-1][0] for r in runs)
    grid = [horizon * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)]
    for arm in arms.values():
        arm.fill_curve(grid)
    names = list(arms)
    base_name = next((n for n in names if n == baseline or n.split()[0] == baseline), None) if baseline else None
    base_name = base_name or next((n for n in names if n.startswith("grpo ")), names[0])
    base = arms[base_name]
    target = TARGET_FRACTION * max(base.mean)
    base_times = [r.time_to(target) for r in base.runs]
    base_time = base.mean_time_to(target)
    rows = []
    for name, arm in arms.items():
        seed_times = [r.time_to(target) for r in arm.runs]
        ratios = [b / t for b, t in zip(base_times, seed_times) if b is not None and t]
        speedup, speedup_ci = mean_ci(ratios) if ratios else (float("nan"), float("nan"))
        mean_time = arm.mean_time_to(target)
        rows.append({
            "arm": name, "seeds": len(arm.runs), "steps_mean": statistics.fmean(r.steps for r in arm.runs),
            "peak_accuracy": max(arm.mean),
            "final_accuracy": mean_ci([r.evals[-1][1] for r in arm.runs])[0],
            "seconds_per_step": statistics.fmean(r.inference_seconds + r.update_seconds + r.other_seconds
                                                 for r in arm.runs),
            "inference_seconds_per_step": statistics.fmean(r.inference_seconds for r in arm.runs),
            "update_seconds_per_step": statistics.fmean(r.update_seconds for r in arm.runs),
            "time_to_target": mean_time,
            "seeds_reaching_target": sum(t is not None for t in seed_times),
            "speedup_vs_baseline": (base_time / mean_time) if (base_time and mean_time) else None,
            "speedup_per_seed_mean": speedup, "speedup_per_seed_ci95": speedup_ci,
        })
    return {"baseline": base_name, "target_accuracy": target, "arms": arms, "rows": rows}


def write_report(result: dict, output_dir: Path, title: str = "") -> dict[str, Path]:
    """compare.json, compare.md, accuracy.png (mean and 95% band per arm), step_time.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir.mkdir(parents=True, exist_ok=True)
    arms: dict[str, Arm] = result["arms"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in arms.values():
        minutes = [t / 60 for t in arm.grid]
        seeds = f"{len(arm.runs)} seed" + ("s" if len(arm.runs) > 1 else "")
        line, = ax.plot(minutes, [100 * a for a in arm.mean], label=f"{arm.name} ({seeds})")
        if len(arm.runs) > 1:
            lower, upper = arm.band()
            ax.fill_between(minutes, [100 * a for a in lower], [100 * a for a in upper], alpha=0.2,
                            color=line.get_color())
    ax.axhline(100 * result["target_accuracy"], color="gray", linestyle=":", linewidth=1,
               label=f"target: 99% of {result['baseline']} best")
    accuracy_png = output_dir / "accuracy.png"
    save_accuracy_figure(fig, ax, accuracy_png, title or "accuracy vs training time (mean, 95% CI)")

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.5 * len(rows)))
    names = [r["arm"] for r in rows]
    inference = [r["inference_seconds_per_step"] for r in rows]
    update = [r["update_seconds_per_step"] for r in rows]
    ax.barh(names, inference, label="inference (generate + reward)")
    ax.barh(names, update, left=inference, label="update (logprobs + backward + step)")
    ax.set_xlabel("seconds per step (measured)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    step_png = output_dir / "step_time.png"
    fig.savefig(step_png, dpi=120)
    plt.close(fig)

    table = format_table(result)
    (output_dir / "compare.md").write_text(table + "\n")
    (output_dir / "compare.json").write_text(json.dumps(
        {"baseline": result["baseline"], "target_accuracy": result["target_accuracy"], "rows": rows,
         "runs": {name: [str(r.path) for r in arm.runs] for name, arm in arms.items()}},
        indent=2, default=lambda x: None) + "\n")
    return {"accuracy": accuracy_png, "step_time": step_png, "table": output_dir / "compare.md"}


def _fmt(value, pattern="{:.1f}", missing="not reached") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return pattern.format(value)


def format_table(result: dict) -> str:
    lines = [f"baseline: {result['baseline']}; target: {100 * result['target_accuracy']:.1f}% "
             f"(99% of its best mean held-out accuracy)", "",
             "| arm | seeds | steps | s/step (inference + update) | peak acc | final acc | time to target (s) "
             "| speedup (mean curves) | speedup per seed (95% CI) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        per_seed = (f"{r['speedup_per_seed_mean']:.2f} +- {_fmt(r['speedup_per_seed_ci95'], '{:.2f}', 'n/a')}"
                    if not math.isnan(r["speedup_per_seed_mean"]) else "n/a")
        lines.append(
            f"| {r['arm']} | {r['seeds']} | {r['steps_mean']:.0f} | {r['seconds_per_step']:.3f} "
            f"({r['inference_seconds_per_step']:.3f} + {r['update_seconds_per_step']:.3f}) "
            f"| {100 * r['peak_accuracy']:.1f}% | {100 * r['final_accuracy']:.1f}% "
            f"| {_fmt(r['time_to_target'])} ({r['seeds_reaching_target']}/{r['seeds']} seeds) "
            f"| {_fmt(r['speedup_vs_baseline'], '{:.2f}x', 'n/a')} | {per_seed} |")
    return "\n".join(lines)


def arm_configs(base, methods: list[str], rules: list[str], n_values: list[int], m_values: list[int]) -> list[dict]:
    """Config overrides of every arm: grpo over m, grpo-ga over n, pods over n x m x rules."""
    arms = []
    for method in methods:
        if method == "grpo":
            arms += [{"method": "grpo", "m": m, "n": max(base.n, m)} for m in m_values]
        elif method == "grpo-ga":
            arms += [{"method": "grpo-ga", "n": n, "m": min(base.m, n)} for n in n_values]
        elif method == "pods":
            arms += [{"method": "pods", "n": n, "m": m, "rule": rule}
                     for n in n_values for m in m_values if m < n for rule in rules]
        else:
            raise ValueError(f"methods: unknown method {method!r}; use grpo, grpo-ga, pods")
    return arms


def arm_dir_name(overrides: dict) -> str:
    if overrides["method"] == "grpo":
        return f"grpo-m{overrides['m']}"
    if overrides["method"] == "grpo-ga":
        return f"grpo-ga-n{overrides['n']}"
    return f"pods-n{overrides['n']}-m{overrides['m']}-{overrides['rule']}"


def run_comparison(base, arms: list[dict], seeds: int, budget_minutes: float, output_dir: Path,
                   log=print) -> list[Path]:
    """Train every arm x seed one after another on this machine with the same training-time
    budget. Finished runs are reused and interrupted ones resumed, so a long comparison can
    be restarted."""
    import dataclasses

    from podsrl.config import validate
    from podsrl.trainer import train

    run_dirs = []
    plan = [(arm, base.seed + k) for arm in arms for k in range(seeds)]
    for i, (arm, seed) in enumerate(plan, start=1):
        run_dir = output_dir / arm_dir_name(arm) / f"seed{seed}"
        run_dirs.append(run_dir)
        if (run_dir / "summary.json").exists():
            log(f"[{i}/{len(plan)}] {run_dir}: done earlier, reused")
            continue
        cfg = dataclasses.replace(base, **arm, seed=seed, max_minutes=budget_minutes, steps=10**9,
                                  output_dir=str(run_dir), progress=False,
                                  resume=(run_dir / "metrics.jsonl").exists())
        validate(cfg)
        result = train(cfg)
        log(f"[{i}/{len(plan)}] {run_dir}: {result.steps} steps, accuracy "
            f"{100 * result.initial['eval_accuracy']:.1f}% -> {100 * result.final['eval_accuracy']:.1f}%")
    return run_dirs

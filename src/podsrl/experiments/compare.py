"""Compare methods the way the paper does: held-out accuracy against training time.

``analyze`` groups run directories into arms (same method, rule, n, m; different seeds),
puts every seed's accuracy curve on a common time grid, and reports per arm: the mean
curve with a 95% band, seconds per step split into inference (generate + reward) and
update, accuracy at fixed fractions of the budget, peak accuracy, and the speedup metric
of the authors' plotting code: the time the baseline needs to reach 99% of its own best
mean accuracy, divided by the time each arm needs to reach that same accuracy.

Honest reading (docs/reproducing.md, "Reading the speedup honestly"): the speedup is given on the
mean curves and per seed (runs paired by seed, mean with an exact t interval). A run that
never reaches the target is **censored** at the end of its budget, not dropped: its time
counts as its whole budget, so the pair's ratio is a bound (an upper bound when the arm
missed, a lower bound when the baseline missed), and the table says how many pairs are
censored. Reports state the commit, dates and machine the runs recorded themselves
(``environment.json``) and the order in which they ran.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from podsrl.config import RESUME_AUTO, parse_value, validate
from podsrl.experiments.levels import headline, headline_lines
from podsrl.experiments.noise import evaluation_noise, noise_lines
from podsrl.experiments.plots import save_accuracy_figure
from podsrl.experiments.runs import FinishedRun, arm_variants, largest_logged, load_run
from podsrl.experiments.seeds import warn_unlike_seeds
from podsrl.experiments.stats import mean_ci
from podsrl.methods import METHODS
from podsrl.prompt_selection import PROMPT_SELECTORS
from podsrl.registry import split_specs
from podsrl.trainer import train

TARGET_FRACTION = 0.99  # of the baseline's best mean accuracy (authors' plotting code)
BUDGET_FRACTIONS = (0.25, 0.5, 1.0)  # accuracy reported at these fractions of the common budget
GRID_POINTS = 200


@dataclass
class Arm:
    name: str
    runs: list[FinishedRun]
    grid: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    half_width: list[float] = field(default_factory=list)

    def fill_curve(self, grid: list[float]) -> None:
        """The mean curve on ``grid`` up to the shortest run's end, and at that end itself (so
        the peak and the time to target see the last evaluation every run has)."""
        end = min(r.budget_seconds for r in self.runs)
        self.grid = [t for t in grid if t < end] + [end]
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

    def by_seed(self) -> dict:
        return {run.seed: run for run in self.runs}


def paired_speedups(base: Arm, arm: Arm, target: float) -> list[dict]:
    """Per seed present in both arms: the baseline's time to ``target`` over the arm's.

    A run that misses the target is censored at its budget, so the ratio is a bound:
    ``censored`` is 'arm' (the ratio is an upper bound), 'baseline' (a lower bound),
    'both' (no bound either way) or '' (observed)."""
    base_runs, arm_runs = base.by_seed(), arm.by_seed()
    pairs = []
    for seed in sorted(set(base_runs) & set(arm_runs), key=str):
        base_time, base_censored = base_runs[seed].censored_time_to(target)
        arm_time, arm_censored = arm_runs[seed].censored_time_to(target)
        if arm_time > 0:
            ratio = base_time / arm_time
        else:  # the arm started at or above the target
            ratio = 1.0 if base_time == 0 else math.inf
        censored = {(False, False): "", (True, False): "baseline", (False, True): "arm",
                    (True, True): "both"}[(base_censored, arm_censored)]
        pairs.append({"seed": seed, "ratio": ratio, "baseline_seconds": base_time, "arm_seconds": arm_time,
                      "censored": censored})
    return pairs


def run_order(runs: list[FinishedRun]) -> list[str]:
    """Arm of each run in the order the runs started (from their environment.json)."""
    started = [(r.environment[0].get("unix_time", 0.0), r.environment[0]["date"], r.arm)
               for r in runs if r.environment]
    return [arm for *_, arm in sorted(started)]


def provenance(runs: list[FinishedRun]) -> dict:
    """What the runs recorded about themselves: commits, first/last start, machines."""
    entries = [e for r in runs for e in r.environment]
    if not entries:
        return {}
    dates = sorted(e["date"] for e in entries)
    return {"commits": sorted({e["commit"] for e in entries}), "first_start": dates[0], "last_start": dates[-1],
            "machines": sorted({e["machine"] for e in entries}),
            "torch": sorted({f"{e['torch']}, {e['torch_threads']} threads" for e in entries}),
            "runs_without_record": sum(not r.environment for r in runs), "order": run_order(runs)}


def analyze(run_dirs: list[Path], baseline: str | None = None) -> dict:
    """Group runs into arms and compute curves, step times and the speedup table.

    ``baseline`` is an arm name or a method ('grpo', 'grpo-ga'); default: the first grpo
    arm, else the first arm.
    """
    runs = [load_run(p) for p in run_dirs]
    arms: dict[str, Arm] = {}
    for run in runs:
        arms.setdefault(run.arm, Arm(run.arm, [])).runs.append(run)
    horizon = max(r.budget_seconds for r in runs)
    grid = [horizon * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)]
    for arm in arms.values():
        warn_unlike_seeds(arm.name, arm.runs)
        arm.fill_curve(grid)
    names = list(arms)
    base_name = next((n for n in names if n == baseline or n.split()[0] == baseline), None) if baseline else None
    base_name = base_name or next((n for n in names if n.startswith("grpo ")), names[0])
    base = arms[base_name]
    target = TARGET_FRACTION * max(base.mean)
    base_time = base.mean_time_to(target)
    budget = min(r.budget_seconds for r in runs)  # every run has a curve up to here
    rows = []
    for name, arm in arms.items():
        pairs = paired_speedups(base, arm, target)
        speedup, speedup_ci = mean_ci([p["ratio"] for p in pairs]) if pairs else (math.nan, math.nan)
        mean_time = arm.mean_time_to(target)
        rows.append({
            "arm": name, "seeds": len(arm.runs), "steps_mean": statistics.fmean(r.steps for r in arm.runs),
            "peak_accuracy": max(arm.mean),
            "final_accuracy": statistics.fmean(r.evals[-1][1] for r in arm.runs),
            "accuracy_at_budget": {str(f): statistics.fmean(r.accuracy_at(f * budget) for r in arm.runs)
                                   for f in BUDGET_FRACTIONS},
            "seconds_per_step": statistics.fmean(r.inference_seconds + r.update_seconds + r.other_seconds
                                                 for r in arm.runs),
            "inference_seconds_per_step": statistics.fmean(r.inference_seconds for r in arm.runs),
            "update_seconds_per_step": statistics.fmean(r.update_seconds for r in arm.runs),
            "time_to_target": mean_time,  # None: the mean curve never reaches it within the arm's budget
            "mean_curve_end": arm.grid[-1] if arm.grid else 0.0,
            "seeds_reaching_target": sum(r.time_to(target) is not None for r in arm.runs),
            "speedup_vs_baseline": (base_time / mean_time) if (base_time is not None and mean_time) else None,
            "speedup_per_seed_mean": speedup, "speedup_per_seed_ci95": speedup_ci,
            "seed_pairs": pairs, "censored_pairs": sum(bool(p["censored"]) for p in pairs),
            **{key: largest_logged(r.update_memory_mb.get(key) for r in arm.runs)
               for key in ("update_activation_mb", "update_peak_cuda_mb")},
            "rollout_ms": [statistics.fmean(ms) for ms in zip(*(r.rollout_milliseconds() for r in arm.runs))],
            **evaluation_noise(arm.runs),
            **(headline(base.runs, arm.runs, budget) if arm is not base else {}),
        })
    return {"baseline": base_name, "target_accuracy": target, "budget_seconds": budget, "arms": arms,
            "rows": rows, "provenance": provenance(runs)}


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
        {"baseline": result["baseline"], "target_accuracy": result["target_accuracy"],
         "budget_seconds": result["budget_seconds"], "rows": rows, "provenance": result["provenance"],
         "runs": {name: [str(r.path) for r in arm.runs] for name, arm in arms.items()}},
        indent=2, default=lambda x: None) + "\n")
    return {"accuracy": accuracy_png, "step_time": step_png, "table": output_dir / "compare.md"}


def _fmt(value, pattern="{:.1f}", missing="n/a") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return pattern.format(value)


def _provenance_lines(prov: dict) -> list[str]:
    if not prov:
        return ["runs: no environment.json (written by podsrl before this report existed): commit, dates and "
                "machine unknown"]
    short = {arm: f"{chr(65 + i)}" for i, arm in enumerate(dict.fromkeys(prov["order"]))}
    order = " ".join(short[a] for a in prov["order"])
    legend = ", ".join(f"{letter} = {arm}" for arm, letter in short.items())
    lines = [f"runs started {prov['first_start']} to {prov['last_start']} (UTC); code {', '.join(prov['commits'])}; "
             f"machine: {'; '.join(prov['machines'])}; torch {'; '.join(prov['torch'])}",
             f"run order (by start time): {order} ({legend})"]
    if prov["runs_without_record"]:
        lines.append(f"{prov['runs_without_record']} run(s) have no environment.json")
    return lines


def format_table(result: dict) -> str:
    """The comparison's table; runs that logged the update's memory (podsrl since #29) get a
    column for it: activations of the largest micro-batch / CUDA peak, in MiB."""
    fractions = " / ".join(f"{int(100 * f)}%" for f in BUDGET_FRACTIONS)
    memory = any(r.get("update_activation_mb") is not None for r in result["rows"])
    lines = [f"baseline: {result['baseline']}; target: {100 * result['target_accuracy']:.1f}% "
             f"(99% of its best mean held-out accuracy); common budget: {result['budget_seconds']:.0f} s of training",
             *_provenance_lines(result["provenance"]), "",
             f"| arm | seeds | steps | s/step (inference + update) | acc at {fractions} of budget | peak acc "
             f"| time to target (s) | speedup (mean curves) | speedup per seed (95% CI) |"
             + (" update memory, MiB (activations / CUDA peak) |" if memory else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if memory else "")]
    notes = []
    for r in result["rows"]:
        at_budget = " / ".join(f"{100 * v:.1f}%" for v in r["accuracy_at_budget"].values())
        reach = (f"{r['time_to_target']:.1f} (" if r["time_to_target"] is not None
                 else f"> {r['mean_curve_end']:.1f} (censored; ")
        pairs = len(r["seed_pairs"])
        per_seed = (f"{_fmt(r['speedup_per_seed_mean'], '{:.2f}')} +- {_fmt(r['speedup_per_seed_ci95'], '{:.2f}')} "
                    f"({pairs} pair{'s' if pairs != 1 else ''}"
                    + (f", {r['censored_pairs']} censored" if r["censored_pairs"] else "") + ")")
        lines.append(
            f"| {r['arm']} | {r['seeds']} | {r['steps_mean']:.0f} | {r['seconds_per_step']:.3f} "
            f"({r['inference_seconds_per_step']:.3f} + {r['update_seconds_per_step']:.3f}) | {at_budget} "
            f"| {100 * r['peak_accuracy']:.1f}% | {reach}{r['seeds_reaching_target']}/{r['seeds']} seeds) "
            f"| {_fmt(r['speedup_vs_baseline'], '{:.2f}x')} | {per_seed} |"
            + (f" {_fmt(r.get('update_activation_mb'), '{:.0f}')} / {_fmt(r.get('update_peak_cuda_mb'), '{:.0f}')} |"
               if memory else ""))
        for p in r["seed_pairs"]:
            if p["censored"]:
                bound = {"arm": "an upper bound: the arm missed the target within its budget",
                         "baseline": "a lower bound: the baseline missed the target within its budget",
                         "both": "no bound: neither run reached the target"}[p["censored"]]
                notes.append(f"- {r['arm']}, seed {p['seed']}: ratio {p['ratio']:.2f} is {bound} (times "
                             f"{p['baseline_seconds']:.1f} s / {p['arm_seconds']:.1f} s, censored at the budget)")
    if notes:
        lines += ["", "Censored pairs (a run that misses the target counts its whole budget):", *notes]
    return "\n".join(lines + headline_lines(result) + noise_lines(result["rows"]))


def arm_specs(field: str, text: str) -> list:
    """``--rules`` / ``--prompt_selectors``: names or JSON mappings ``{"name": ..., argument: value}``,
    each parsed as the config ``field`` parses its value (a mapping stays a mapping);
    ``--dynamic_sampling``: true / false."""
    return [parse_value(field, item) for item in split_specs(text)]


def arm_configs(base, methods: list[str], rules: list[str], n_values: list, m_values: list[int],
                selectors: list[str] = (), dynamic_sampling: list[bool] = ()) -> list[dict]:
    """Config overrides of every arm: a method that generates m sweeps m; one that trains on
    all n sweeps n; one that selects sweeps n x m x rules (m < n). An n of 'auto' is an
    adaptive_n arm of pods starting at the config's n. With ``selectors``, each of those
    arms runs once per prompt selector; with ``dynamic_sampling``, once per value."""
    arms = _method_arms(base, methods, rules, n_values, m_values)
    for name in selectors:
        PROMPT_SELECTORS.resolve(name)  # an unknown one fails before any run
    arms = [{**arm, "prompt_selector": name} for arm in arms for name in selectors] if selectors else arms
    return [{**arm, "dynamic_sampling": on} for arm in arms for on in dynamic_sampling] if dynamic_sampling else arms


def _method_arms(base, methods: list[str], rules: list[str], n_values: list, m_values: list[int]) -> list[dict]:
    arms = []
    for name in methods:
        if name not in METHODS:
            raise ValueError(f"methods: unknown method {name!r}; use {', '.join(METHODS)}")
        method = METHODS[name]
        if not method.generates_n:
            arms += [{"method": name, "num_kept": m, "num_generations": max(base.num_generations, m)}
                     for m in m_values]
        elif not method.selects:
            arms += [{"method": name, "num_generations": n, "num_kept": min(base.num_kept, n)}
                     for n in n_values if n != "auto"]
        else:
            arms += [{"method": name, "num_generations": n, "num_kept": m, "downsampling_rule": rule}
                     for n in n_values if n != "auto" for m in m_values if m < n for rule in rules]
            arms += [{"method": name, "num_generations": base.num_generations, "adaptive_n": True, "num_kept": m,
                      "downsampling_rule": rule} for n in n_values if n == "auto" for m in m_values for rule in rules]
    return arms


def arm_dir_name(overrides: dict) -> str:
    n = "auto" if overrides.get("adaptive_n") else overrides["num_generations"]
    name = METHODS[overrides["method"]].dir_name(n, overrides["num_kept"], overrides.get("downsampling_rule", ""))
    return "-".join([name, *(re.sub(r"[^A-Za-z0-9_.]", "_", v) for v in arm_variants(overrides))])


def run_plan(arms: list[dict], seeds: list[int]) -> list[tuple[dict, int]]:
    """The order of the runs: seed-major, the arms' order reversed every other seed
    (A B, B A, A B, ...). Machine speed drifts (1.8x between days was seen on the
    development machine); running every seed of one arm before the next would confound
    that drift with the arm, while interleaving spreads it over all arms, and alternating
    the order cancels a steady drift within each pair of seeds."""
    return [(arm, seed) for k, seed in enumerate(seeds) for arm in (arms if k % 2 == 0 else arms[::-1])]


def run_comparison(base, arms: list[dict], seeds: int, budget_minutes: float, output_dir: Path,
                   log=print, budget_steps: int = 0) -> list[Path]:
    """Train every arm x seed on this machine with the same training-time budget (and/or the
    same number of steps, ``budget_steps``; 0 = no limit), in the
    interleaved order of :func:`run_plan`. Every run's config is validated before the first
    runs (an arm that cannot run fails the comparison at once, naming the arm). Finished runs
    are reused and interrupted ones resumed from their checkpoint (one stopped before its first
    checkpoint is started afresh in its folder), so a long comparison can be restarted."""
    run_dirs = []
    plan = run_plan(arms, [base.seed + k for k in range(seeds)])
    configs = [_run_config(base, arm, seed, budget_minutes, output_dir / arm_dir_name(arm) / f"seed{seed}",
                           budget_steps) for arm, seed in plan]
    for (arm, _), cfg in zip(plan, configs):
        try:
            validate(cfg)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"arm {arm_dir_name(arm)}: {err}") from None
    for i, cfg in enumerate(configs, start=1):
        run_dir = Path(cfg.output_dir)
        run_dirs.append(run_dir)
        if (run_dir / "summary.json").exists():
            log(f"[{i}/{len(plan)}] {run_dir}: done earlier, reused")
            continue
        result = train(cfg)
        log(f"[{i}/{len(plan)}] {run_dir}: {result.steps} steps, accuracy "
            f"{100 * result.initial['eval_accuracy']:.1f}% -> {100 * result.final['eval_accuracy']:.1f}%")
    return run_dirs


def _run_config(base, arm: dict, seed: int, budget_minutes: float, run_dir: Path, budget_steps: int = 0):
    """The config of one run of a comparison: the arm's overrides of the shared ``base``, its
    seed and budget; it resumes where it has a checkpoint (``resume auto``, whatever ``base`` says)."""
    return dataclasses.replace(base, **arm, seed=seed, max_minutes=budget_minutes, max_steps=budget_steps or 10**9,
                               output_dir=str(run_dir), progress=False, resume=RESUME_AUTO)

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
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from podsrl.experiments.conversions import check_one_conversion, folder_record
from podsrl.experiments.levels import headline
from podsrl.experiments.noise import evaluation_noise
from podsrl.experiments.report import BUDGET_FRACTIONS, format_table, write_report  # noqa: F401 (this module's API)
from podsrl.experiments.reuse import NO_STEP_LIMIT, check_reusable, holds_a_run
from podsrl.experiments.runs import (
    FinishedRun,
    arm_name,
    arm_variants,
    largest_logged,
    load_comparable,
    load_run,
    name_swept_rates,
    once_each,
    swept_rates,
)
from podsrl.experiments.seeds import warn_unlike_seeds
from podsrl.experiments.stats import mean_ci
from podsrl.experiments.warmup import run_to_warm_up, warm_up
from podsrl.methods import METHODS
from podsrl.prompt_selection import PROMPT_SELECTORS
from podsrl.registry import split_specs
from podsrl.trainer import train
from podsrl.trainer.config import RESUME_AUTO, parse_value, validate

TARGET_FRACTION = 0.99  # of the baseline's best mean accuracy (authors' plotting code)
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


def baseline_name(names: list[str], baseline: str | None) -> str:
    """The arm ``baseline`` names (an arm's name, or the method of the first arm of it); without
    one, the first grpo arm, else the first arm. A name that matches no arm is refused, listing
    the arms: a comparison against another baseline than asked for is silently wrong."""
    if not baseline:
        return next((n for n in names if n.startswith("grpo ")), names[0])
    found = next((n for n in names if n == baseline or n.split()[0] == baseline), None)
    if found is None:
        raise ValueError(f"baseline: {baseline!r} names no arm of this comparison; its arms: {'; '.join(names)} "
                         f"(give an arm's name or its method)")
    return found


def planned_arm_names(base, arms: list[dict]) -> list[str]:
    """The names reports will give the arms of ``arm_configs``, before any of them runs."""
    configs = [{**base.to_dict(), **arm} for arm in arms]
    return list(dict.fromkeys(arm_name(c, named) for c, named in zip(configs, swept_rates(configs))))


def analyze(run_dirs: list[Path], baseline: str | None = None,
            left_out: Callable[[str], None] | None = None) -> dict:
    """Group runs into arms and compute curves, step times and the speedup table.

    ``baseline`` is an arm name or a method ('grpo', 'grpo-ga'); default: the first grpo
    arm, else the first arm. With ``left_out``, a run with no curve (no evaluation, or no
    training step) is left out, and ``left_out`` told so in one line; without, it is an error.
    """
    runs = load_comparable(run_dirs, left_out) if left_out else [load_run(p) for p in run_dirs]
    runs = name_swept_rates(once_each(runs, left_out or (lambda line: print(f"warning: {line}", file=sys.stderr))))
    if not runs:
        raise ValueError(f"none of the {len(run_dirs)} runs found has training steps "
                         "and evaluations to compare")
    check_one_conversion([(r.path, r.config, r.environment) for r in runs])
    arms: dict[str, Arm] = {}
    for run in runs:
        arms.setdefault(run.arm, Arm(run.arm, [])).runs.append(run)
    horizon = max(r.budget_seconds for r in runs)
    grid = [horizon * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)]
    for arm in arms.values():
        warn_unlike_seeds(arm.name, arm.runs)
        arm.fill_curve(grid)
    base_name = baseline_name(list(arms), baseline)
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
            "off_policy": mean_numbers([r.off_policy for r in arm.runs]),
            **evaluation_noise(arm.runs),
            **(headline(base.runs, arm.runs, budget) if arm is not base else {}),
        })
    return {"baseline": base_name, "target_accuracy": target, "budget_seconds": budget, "arms": arms,
            "rows": rows, "provenance": provenance(runs),
            "budget_set_by": str(min(runs, key=lambda r: r.budget_seconds).path)}


def mean_numbers(numbers: list[dict[str, float]]) -> dict[str, float]:
    """Each key's mean over the runs that have it (staleness_max: the largest)."""
    keys = dict.fromkeys(key for run in numbers for key in run)
    return {key: (max if key == "staleness_max" else statistics.fmean)([run[key] for run in numbers if key in run])
            for key in keys}


def arm_specs(field: str, text: str) -> list:
    """``--rules`` / ``--prompt_selectors``: names or JSON mappings ``{"name": ..., argument: value}``,
    each parsed as the config ``field`` parses its value (a mapping stays a mapping);
    ``--dynamic_sampling`` / ``--partial_rollouts``: true / false."""
    return [parse_value(field, item) for item in split_specs(text)]


def arm_configs(base, methods: list[str], rules: list[str], n_values: list, m_values: list[int],
                selectors: list[str] = (), dynamic_sampling: list[bool] = (),
                partial_rollouts: list[bool] = (), learning_rates: list[float] = ()) -> list[dict]:
    """Config overrides of every arm: a method that generates m sweeps m; one that trains on
    all n sweeps n; one that selects sweeps n x m x rules (m < n). An n of 'auto' is an
    adaptive_n arm of pods starting at the config's n. With ``selectors``, each of those
    arms runs once per prompt selector; with ``dynamic_sampling``, ``partial_rollouts`` and
    ``learning_rates``, once per value of each."""
    arms = _method_arms(base, methods, rules, n_values, m_values)
    for name in selectors:
        PROMPT_SELECTORS.resolve(name)  # an unknown one fails before any run
    arms = [{**arm, "prompt_selector": name} for arm in arms for name in selectors] if selectors else arms
    for setting, values in (("dynamic_sampling", dynamic_sampling), ("partial_rollouts", partial_rollouts),
                            ("learning_rate", learning_rates)):
        arms = [{**arm, setting: on} for arm in arms for on in values] if values else arms
    return arms


def _method_arms(base, methods: list[str], rules: list[str], n_values: list,
                 m_values: list[int]) -> list[dict]:
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
    rate = [f"lr{overrides['learning_rate']:g}"] if "learning_rate" in overrides else []  # an arm of a sweep
    return "-".join([name, *(re.sub(r"[^A-Za-z0-9_.]", "_", v) for v in [*arm_variants(overrides), *rate])])


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
    checkpoint is started afresh in its folder), so a long comparison can be restarted; a run
    whose config is not this command's is refused before any run (:mod:`podsrl.experiments.reuse`).
    With generation_static_cache, one untimed step warms the compile first (:mod:`.warmup`)."""
    run_dirs = []
    plan = run_plan(arms, [base.seed + k for k in range(seeds)])
    configs = [_run_config(base, arm, seed, budget_minutes, output_dir / arm_dir_name(arm) / f"seed{seed}",
                           budget_steps) for arm, seed in plan]
    for (arm, _), cfg in zip(plan, configs):
        try:
            validate(cfg)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"arm {arm_dir_name(arm)}: {err}") from None
    for cfg in configs:  # a run of another command is never reported as this one's
        check_reusable(cfg)
    warmed = run_to_warm_up(configs)
    if warmed:  # the static cache's compile, paid here instead of inside the first timed run's budget
        warm_up(warmed, train, log)
    for i, cfg in enumerate(configs, start=1):
        run_dir = Path(cfg.output_dir)
        run_dirs.append(run_dir)
        if (run_dir / "summary.json").exists():
            log(f"[{i}/{len(plan)}] {run_dir}: done earlier, reused")
            continue
        result = train(cfg)
        log(f"[{i}/{len(plan)}] {run_dir}: {result.steps} steps, accuracy "
            f"{100 * result.initial['eval_accuracy']:.1f}% -> {100 * result.final['eval_accuracy']:.1f}%")
        # a run of another conversion than the runs reused: refused now, not after every other run
        check_one_conversion([folder_record(Path(c.output_dir)) for k, c in enumerate(configs)
                              if (k < i or holds_a_run(Path(c.output_dir)))
                              and (Path(c.output_dir) / "config.json").is_file()])
    return run_dirs


def _run_config(base, arm: dict, seed: int, budget_minutes: float, run_dir: Path, budget_steps: int = 0):
    """The config of one run of a comparison: the arm's overrides of the shared ``base``, its
    seed and budget; it resumes where it has a checkpoint (``resume auto``, whatever ``base`` says)."""
    return dataclasses.replace(base, **arm, seed=seed, max_minutes=budget_minutes,
                               max_steps=budget_steps or NO_STEP_LIMIT, output_dir=str(run_dir), progress=False,
                               resume=RESUME_AUTO)

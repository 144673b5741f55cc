"""A comparison's headline that no single evaluation can move (#51).

The paper's speedup (the time the baseline needs to reach 99% of its best mean accuracy, over
the time an arm needs) lets one evaluation set it: when the baseline's best is its last
evaluation, the target is that evaluation's noise. On #39's CPU headroom comparison "2.00x"
became 1.20x with each run's last evaluation dropped (docs/reproducing.md). So the headline
here is a statistic of whole curves:

* **Levels.** K accuracy levels evenly spaced above the baseline mean curve's first value, up
  to the highest value that curve reached within the first LEVEL_SPAN of its budget: a target
  in the last part of the baseline's budget, where a plateau lets one evaluation decide when
  it is crossed, never enters.
* **Time to each level** on each curve: the first time its (interpolated) accuracy reaches
  the level; a curve that never does is censored at its end (the true time is later).
* **Headline**: the baseline's mean time to its levels over the arm's, sum over sum: how many
  times sooner the arm reaches, on average, the accuracies the baseline reached. One
  evaluation changes one curve between its two neighbours, so it moves the times of the
  levels crossed there only, and the sum weighs them by their share of the range. The
  ratio per level (the speedup curve) is reported beside it.

The same on steps instead of seconds gives the paper's first claim (more accuracy per step),
which does not depend on the hardware. :func:`sensitivity` recomputes a headline with each
run's last evaluation dropped and with any one evaluation dropped; a headline that moves by
HEADLINE_TOLERANCE or more is reported, not headlined.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from podsrl.experiments.stats import mean_ci

LEVEL_SPAN = 0.75  # levels: what the baseline reached within this share of its budget
LEVEL_COUNT = 40
LEVEL_TOP = 0.9  # of the baseline's rise in that span: its flat top is left out
HEADLINE_TOLERANCE = 0.10  # a headline any one evaluation moves this much (relative) is not headlined
GRID_POINTS = 200

Curve = list[tuple[float, float]]  # (seconds or steps, accuracy), x increasing


def first_passage(curve: Curve, level: float) -> float | None:
    """The first x at which the piecewise-linear ``curve`` reaches ``level``, or None."""
    if curve[0][1] >= level:
        return curve[0][0]
    for (x0, a0), (x1, a1) in zip(curve, curve[1:]):
        if a1 >= level:
            return x0 + (x1 - x0) * (level - a0) / (a1 - a0)
    return None


def value_at(curve: Curve, x: float) -> float:
    """Linear interpolation, held at the ends."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, a0), (x1, a1) in zip(curve, curve[1:]):
        if x <= x1:
            return a0 + (a1 - a0) * (x - x0) / (x1 - x0) if x1 > x0 else a1
    return curve[-1][1]


def mean_curve(curves: list[Curve], points: int = GRID_POINTS) -> Curve:
    """The mean of ``curves`` on an even grid up to the shortest one's end (every curve has a
    value there), that end included."""
    end = min(c[-1][0] for c in curves)
    grid = [end * i / (points - 1) for i in range(points)]
    return [(x, statistics.fmean(value_at(c, x) for c in curves)) for x in grid]


def levels_of(baseline: Curve, span: float = LEVEL_SPAN, count: int = LEVEL_COUNT,
              top: float = LEVEL_TOP) -> list[float]:
    """``count`` levels evenly spaced above the baseline curve's first value up to ``top`` of its
    rise by ``span`` of its end (its highest value by then): [] when it never rose above its
    start there. Not the whole rise: where the curve flattens, the time it first touches its
    highest values is one evaluation's noise, as the paper's target was."""
    start, end = baseline[0][1], span * baseline[-1][0]
    reached = max(max(a for x, a in baseline if x <= end), value_at(baseline, end))
    if reached <= start:
        return []
    return [start + top * (reached - start) * k / count for k in range(1, count + 1)]


def times_to(curve: Curve, levels: list[float]) -> list[tuple[float, bool]]:
    """(x, censored) per level: the first passage, or the curve's end when it never reaches it."""
    out = []
    for level in levels:
        x = first_passage(curve, level)
        out.append((curve[-1][0], True) if x is None else (x, False))
    return out


@dataclass
class LevelSpeedup:
    """An arm against the baseline at the baseline's levels."""

    levels: list[float]
    baseline: list[tuple[float, bool]]  # (time, censored) per level
    arm: list[tuple[float, bool]]

    @property
    def ratio(self) -> float:
        """Sum of the baseline's times over the arm's (nan without levels)."""
        arm = sum(t for t, _ in self.arm)
        if not self.levels:
            return math.nan
        return sum(t for t, _ in self.baseline) / arm if arm > 0 else math.inf

    @property
    def censored(self) -> str:
        """'arm' (the arm missed levels: the ratio is an upper bound), 'baseline' (a lower
        bound), 'both' or ''."""
        arm, base = any(c for _, c in self.arm), any(c for _, c in self.baseline)
        return {(False, False): "", (True, False): "arm", (False, True): "baseline",
                (True, True): "both"}[(arm, base)]

    def curve(self, every: int = 8) -> list[dict]:
        """The speedup at every ``every``-th level (and the last): the level, both times, their ratio."""
        picked = (sorted({*range(every - 1, len(self.levels), every), len(self.levels) - 1}) if self.levels
                  else [])
        return [{"level": self.levels[i], "baseline": self.baseline[i][0], "arm": self.arm[i][0],
                 "ratio": self.baseline[i][0] / self.arm[i][0] if self.arm[i][0] > 0 else math.inf,
                 "censored": self.arm[i][1] or self.baseline[i][1]} for i in picked]


def level_speedup(baseline: Curve, arm: Curve, levels: list[float]) -> LevelSpeedup:
    return LevelSpeedup(levels, times_to(baseline, levels), times_to(arm, levels))


def geometric_ci(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of positive finite ratios and its 95% t-interval (computed on their
    logarithms: ratios multiply); nan bounds with fewer than two."""
    logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    if not logs:
        return math.nan, math.nan, math.nan
    mean, half = mean_ci(logs)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


@dataclass
class Sensitivity:
    """How much a headline moves when evaluations are dropped (relative changes)."""

    last_dropped: float  # every run's last evaluation dropped at once
    worst: float  # the largest move from dropping any one evaluation
    worst_drop: str  # which one

    def headlined(self, tolerance: float = HEADLINE_TOLERANCE) -> bool:
        return abs(self.last_dropped) < tolerance and abs(self.worst) < tolerance


def sensitivity(curves: dict[str, Curve], headline: Callable[[dict[str, Curve]], float]) -> Sensitivity:
    """``headline`` of ``curves`` (a run's name -> its evaluations) recomputed with each run's
    last evaluation dropped (all at once), then with each single evaluation after the first
    dropped in turn (a curve keeps at least two). The first is every run's evaluation of the
    same initial model: dropping it would not remove an evaluation's noise but carry the run's
    later accuracy back to time 0."""
    base = headline(curves)

    def moved(changed: dict[str, Curve]) -> float:
        value = headline(changed)
        if math.isnan(base) or math.isnan(value):
            return math.nan
        return value / base - 1 if base not in (0, math.inf) else (0.0 if value == base else math.inf)

    last = moved({name: c[:-1] if len(c) > 2 else c for name, c in curves.items()})
    worst, worst_drop = 0.0, ""
    for name, curve in curves.items():
        for i in range(1, len(curve)) if len(curve) > 2 else ():
            change = moved({**curves, name: curve[:i] + curve[i + 1:]})
            if not abs(change) <= abs(worst):  # nan and inf count as the worst
                worst, worst_drop = change, f"{name}, evaluation at {curve[i][0]:.4g}"
    return Sensitivity(last, worst, worst_drop)


def paper_speedup(baseline: Curve, arm: Curve, fraction: float = 0.99) -> float:
    """The authors' statistic on two mean curves, for its sensitivity beside the headline's: the
    baseline's time to ``fraction`` of its best over the arm's (the arm censored at its end)."""
    target = fraction * max(a for _, a in baseline)
    base_time, arm_time = first_passage(baseline, target), first_passage(arm, target)
    arm_time = arm[-1][0] if arm_time is None else arm_time
    return base_time / arm_time if arm_time > 0 else math.inf


def _mean_headline(statistic: Callable[[Curve, Curve], float], base_names: list[str], arm_names: list[str]):
    """A headline of named run curves: ``statistic`` of the baseline's and the arm's mean curves."""
    def headline(curves: dict[str, Curve]) -> float:
        return statistic(mean_curve([curves[n] for n in base_names]),
                         mean_curve([curves[n] for n in arm_names]))
    return headline


def _level_ratio(baseline: Curve, arm: Curve) -> float:
    return level_speedup(baseline, arm, levels_of(baseline)).ratio


def axis_report(base_runs: list, arm_runs: list, axis: str) -> dict:
    """On ``axis`` ('seconds' or 'steps'): the headline on the mean curves, its levels, bound and
    speedup curve, the paired per-seed ratios (geometric mean, 95% CI), and how far dropping
    evaluations moves it (and the paper's statistic, for contrast)."""
    curves = {**{f"baseline seed {r.seed}": r.curve(axis) for r in base_runs},
              **{f"arm seed {r.seed}": r.curve(axis) for r in arm_runs}}
    base_names = [n for n in curves if n.startswith("baseline")]
    arm_names = [n for n in curves if n.startswith("arm")]
    base_mean, arm_mean = (mean_curve([curves[n] for n in base_names]),
                           mean_curve([curves[n] for n in arm_names]))
    levels = levels_of(base_mean)
    mean = level_speedup(base_mean, arm_mean, levels)
    arms_by_seed = {r.seed: r for r in arm_runs}
    pairs = [(r.seed, level_speedup(r.curve(axis), arms_by_seed[r.seed].curve(axis), levels))
             for r in base_runs if r.seed in arms_by_seed]
    ratios = [p.ratio for _, p in pairs]
    geometric, low, high = geometric_ci(ratios)
    moved = sensitivity(curves, _mean_headline(_level_ratio, base_names, arm_names)) if levels else None
    paper = sensitivity(curves, _mean_headline(paper_speedup, base_names, arm_names))
    return {"speedup": mean.ratio, "bound": mean.censored,
            "levels": [levels[0], levels[-1]] if levels else [], "curve": mean.curve(),
            "per_seed": [{"seed": s, "ratio": p.ratio, "bound": p.censored} for s, p in pairs],
            "per_seed_geometric_mean": geometric, "per_seed_ci95": [low, high],
            "sensitivity": moved.__dict__ if moved else None,
            "headlined": bool(levels) and moved.headlined() and not mean.censored,
            "paper_speedup": paper_speedup(base_mean, arm_mean), "paper_sensitivity": paper.__dict__}


def budget_differences(base_runs: list, arm_runs: list, budget: float,
                       fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)) -> list[dict]:
    """The arm's accuracy minus the baseline's at matched training time, paired by seed: mean
    and 95% t half-width, in accuracy units, at each fraction of the common ``budget``."""
    arms_by_seed = {r.seed: r for r in arm_runs}
    pairs = [(r, arms_by_seed[r.seed]) for r in base_runs if r.seed in arms_by_seed]
    out = []
    for fraction in fractions:
        seconds = fraction * budget
        diffs = [arm.accuracy_at(seconds) - base.accuracy_at(seconds) for base, arm in pairs]
        mean, half = mean_ci(diffs) if diffs else (math.nan, math.nan)
        out.append({"fraction": fraction, "difference": mean, "ci95": half, "pairs": len(diffs)})
    return out


def headline_note(seconds: dict) -> str:
    """Why the seconds headline is not headlined ('' when it is)."""
    if not seconds["levels"]:
        return "the baseline's mean curve did not rise above its start within the first 75% of its budget"
    if seconds["bound"]:
        side = "the arm" if seconds["bound"] in ("arm", "both") else "the baseline"
        return f"{side} did not reach every level within its budget: the ratio is a bound"
    moved = seconds["sensitivity"]
    if not abs(moved["last_dropped"]) < HEADLINE_TOLERANCE:
        return f"dropping each run's last evaluation {_moved_by(moved['last_dropped'])}"
    if not abs(moved["worst"]) < HEADLINE_TOLERANCE:
        return f"dropping one evaluation ({moved['worst_drop']}) {_moved_by(moved['worst'])}"
    return ""


def headline(base_runs: list, arm_runs: list, budget: float) -> dict:
    """A non-baseline arm's row fields in compare.json: ``headline_speedup`` (the seconds
    headline, a number), ``headlined`` and ``headline_note`` (why not), both axes' reports
    and the paired accuracy differences at matched budgets."""
    seconds, steps = axis_report(base_runs, arm_runs, "seconds"), axis_report(base_runs, arm_runs, "steps")
    return {"headline_speedup": seconds["speedup"], "headlined": seconds["headlined"],
            "headline_note": headline_note(seconds), "by_seconds": seconds, "by_steps": steps,
            "accuracy_difference": budget_differences(base_runs, arm_runs, budget)}


def _ratio(report: dict) -> str:
    bound = {"arm": "<= ", "baseline": ">= ", "both": "~ "}.get(report["bound"], "")
    return f"{bound}{report['speedup']:.2f}x" if math.isfinite(report["speedup"]) else "n/a"


def _per_seed(report: dict) -> str:
    low, high = report["per_seed_ci95"]
    interval = f" [{low:.2f}, {high:.2f}]" if math.isfinite(low) else ""
    mean = report["per_seed_geometric_mean"]
    return f"{mean:.2f}x{interval}" if math.isfinite(mean) else "n/a"


def _change(change: float) -> str:
    """A relative change of a headline as a table cell: a percentage; 'unbounded' where dropping an
    evaluation sends the ratio to infinity (a time to the levels falls to 0) or from it; 'n/a'
    where it leaves no ratio at all (no levels, no time)."""
    if math.isnan(change):
        return "n/a"
    return "unbounded" if math.isinf(change) else f"{100 * change:+.0f}%"


def _moved_by(change: float) -> str:
    """The same change in a sentence: 'moves it ...'."""
    if math.isnan(change):
        return "leaves no ratio to compare"
    return "moves it without bound" if math.isinf(change) else f"moves it by {100 * change:+.0f}%"


def _moves(report: dict) -> str:
    moved = report["sensitivity"]
    if not moved:
        return "n/a"
    return f"{_change(moved['last_dropped'])} / {_change(moved['worst'])}"


def _paper(speedup: float, moved: dict) -> str:
    if not math.isfinite(speedup):
        return "n/a"
    changes = [moved["last_dropped"], moved["worst"]]
    finite = [abs(c) for c in changes if math.isfinite(c)]
    largest = ("unbounded" if any(math.isinf(c) for c in changes) else
               f"{100 * max(finite):.0f}%" if finite else "n/a")
    return f"{speedup:.2f}x ({largest})"


def _difference(d: dict) -> str:
    """An accuracy difference at a matched budget, in points, with its 95% half-width if any."""
    if not math.isfinite(d["difference"]):
        return "n/a"  # no seed paired
    return f"{100 * d['difference']:+.1f}" + (f" +- {100 * d['ci95']:.1f}" if math.isfinite(d["ci95"])
                                              else "")


def headline_lines(result: dict) -> list[str]:
    """The report's headline section: per non-baseline arm, the level speedup in seconds and in
    steps (mean curves; per seed: geometric mean, 95% CI), how far one evaluation moves it, the
    paper's statistic and how far it moves, paired accuracy differences at matched budgets, and
    the cost of a generated and of a trained rollout (every arm)."""
    rows = [r for r in result["rows"] if "headline_speedup" in r]
    if not rows:
        return []
    levels = rows[0]["by_seconds"]["levels"]
    span = f"{100 * levels[0]:.1f}% to {100 * levels[1]:.1f}%" if levels else "none"
    lines = ["", "Headline: how many times sooner each arm reaches the baseline's accuracy levels "
                 f"({LEVEL_COUNT} levels, {span}: what {result['baseline']} reached in its first "
                 f"{int(100 * LEVEL_SPAN)}% of its budget), mean time over the levels, on the mean curves; "
                 "per seed paired, geometric mean [95% CI]; moved by: dropping each run's last evaluation / "
                 "the worst single evaluation (docs/reproducing.md)",
             "",
             "| arm | headline (seconds) | per seed | moved by | in steps | per seed | moved by | paper's "
             "statistic (moved by one evaluation) | accuracy - baseline at 25 / 50 / 75 / 100% of budget "
             "(points, 95% CI) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for r in rows:
        seconds, steps = r["by_seconds"], r["by_steps"]
        paper = seconds["paper_sensitivity"]
        differences = " / ".join(_difference(d) for d in r["accuracy_difference"])
        lines.append(f"| {r['arm']} | {_ratio(seconds)} | {_per_seed(seconds)} | {_moves(seconds)} | "
                     f"{_ratio(steps)} | {_per_seed(steps)} | {_moves(steps)} | "
                     f"{_paper(seconds['paper_speedup'], paper)} | {differences} |")
        notes.append(f"- {r['arm']}: " + (f"headlined: {_ratio(seconds)} sooner in seconds" if r["headlined"]
                                          else f"not headlined: {r['headline_note']}"))
    costs = "; ".join(f"{r['arm']} {r['rollout_ms'][0]:.1f} / {r['rollout_ms'][1]:.1f}"
                      for r in result["rows"] if r.get("rollout_ms"))
    return [*lines, "", *notes, "- ms per generated / trained rollout (inference / update seconds per step "
                                "over the rollouts generated / trained per step; generated: as the steps "
                                "logged them, else prompts x the arm's n; trained: prompts x its m, or n for "
                                f"grpo-ga): {costs}"]

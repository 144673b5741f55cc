"""The comparison's headline (podsrl.experiments.levels): against brute force and exact
oracles (a curve run k times faster is k times sooner at every level), and the case it exists
for: a plateau whose last evaluation jumps sets the paper's statistic and not the headline."""

import json
import math
import random
import re

import pytest

from podsrl.experiments.compare import analyze, format_table
from podsrl.experiments.levels import (
    HEADLINE_TOLERANCE,
    first_passage,
    level_speedup,
    levels_of,
    mean_curve,
    paper_speedup,
    sensitivity,
    value_at,
)
from tests.test_compare import fake_run


def random_curve(rng: random.Random, points: int = 12, end: float = 100.0) -> list[tuple[float, float]]:
    """A noisy rising accuracy curve on uneven evaluation times, starting at time 0."""
    times = sorted(rng.uniform(0, end) for _ in range(points - 2))
    accuracy, curve = rng.uniform(0.1, 0.3), []
    for x in [0.0, *times, end]:
        curve.append((x, accuracy))
        accuracy = min(1.0, max(0.0, accuracy + rng.uniform(-0.03, 0.08)))
    return curve


def brute_first_passage(curve, level, samples=200_001):
    """The first x on a fine grid where the interpolated curve reaches level (None: never)."""
    end = curve[-1][0]
    for i in range(samples):
        x = end * i / (samples - 1)
        if value_at(curve, x) >= level:
            return x
    return None


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_first_passage_matches_a_fine_grid_search(seed):
    rng = random.Random(seed)
    curve = random_curve(rng)
    for level in (rng.uniform(0.1, 0.6) for _ in range(10)):
        found, brute = first_passage(curve, level), brute_first_passage(curve, level)
        assert (found is None) == (brute is None)
        if found is not None:
            assert found == pytest.approx(brute, abs=curve[-1][0] / 200_000 + 1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_an_arm_k_times_faster_is_k_times_sooner_at_every_level_and_in_the_headline(seed):
    rng = random.Random(seed)
    base = random_curve(rng)
    k = rng.uniform(0.3, 4.0)
    arm = [(x / k, a) for x, a in base]  # the same accuracies, k times sooner
    levels = levels_of(base)
    speedup = level_speedup(base, arm, levels)
    assert levels and speedup.ratio == pytest.approx(k) and not speedup.censored
    assert all(point["ratio"] == pytest.approx(k) for point in speedup.curve() if point["arm"] > 0)


def test_levels_stop_at_what_the_baseline_reached_in_the_first_part_of_its_budget():
    base = [(0, 0.2), (10, 0.3), (20, 0.35), (30, 0.35), (40, 0.5)]  # the jump comes in the last quarter
    levels = levels_of(base)
    assert levels[0] > 0.2 and levels[-1] == pytest.approx(0.2 + 0.9 * 0.15)  # 0.35 reached by 30 = 75% of 40
    assert levels_of([(0, 0.3), (10, 0.3), (20, 0.2), (30, 0.25), (40, 0.6)]) == []  # no rise in the first 75%


def test_the_mean_curve_ends_where_the_shortest_curve_ends():
    curves = [[(0, 0.0), (10, 1.0)], [(0, 0.0), (5, 0.5), (8, 0.5)]]
    mean = mean_curve(curves, points=5)
    assert mean[-1][0] == 8 and mean[0] == (0, 0.0)
    assert mean[2][1] == pytest.approx((0.4 + 0.4) / 2)  # x = 4: 0.4 and 0.4


def test_an_arm_that_misses_levels_is_censored_and_its_ratio_an_upper_bound():
    base = [(0, 0.2), (10, 0.4), (20, 0.5)]
    arm = [(0, 0.2), (10, 0.3), (20, 0.35)]
    speedup = level_speedup(base, arm, levels_of(base))
    assert speedup.censored == "arm" and speedup.ratio < 1


def test_dropping_a_collinear_evaluation_moves_nothing():
    """Two straight lines, one twice as steep: twice as soon at every level, whichever points
    (last ones included) describe them."""
    curves = {"a": [(0, 0.1), (10, 0.2), (20, 0.3), (30, 0.4)], "b": [(0, 0.1), (5, 0.2), (10, 0.3), (15, 0.4),
                                                                     (20, 0.5), (25, 0.6), (30, 0.7)]}

    def headline(c):
        return level_speedup(c["a"], c["b"], levels_of(c["a"])).ratio

    moved = sensitivity(curves, headline)
    assert headline(curves) == pytest.approx(2.0)
    assert moved.worst == pytest.approx(0.0, abs=1e-9) and moved.last_dropped == pytest.approx(0.0, abs=1e-9)


def plateau_then_jump(jump: float, seed: int) -> list[tuple[float, float]]:
    """The baseline's curve in #39's CPU comparison: rising to a plateau near 35% by 40% of
    the budget, flat with noise until its last evaluation jumps."""
    rng = random.Random(seed)
    curve = [(0, 0.17), (100, 0.23), (200, 0.29), (300, 0.33), (400, 0.35)]
    curve += [(x, 0.35 + rng.uniform(-0.01, 0.01)) for x in (500, 600, 700, 800, 900, 1000, 1100)]
    return curve + [(1200, 0.35 + jump)]


@pytest.mark.slow
def test_a_last_evaluation_that_jumps_moves_the_papers_statistic_and_not_the_headline(tmp_path):
    """The case #51 names: a baseline whose best is its last evaluation. Dropping that evaluation
    moves the paper's speedup far beyond 10% and the headline under it; the report headlines
    the one and says how far the other moves."""
    runs = []
    for seed in range(3):
        base = plateau_then_jump(0.04, seed)
        arm = [(x * 0.6, a) for x, a in base[:-1]] + [(1200, 0.39)]  # the same curve, 0.6x the time
        runs.append(fake_run(tmp_path, "grpo", "grpo", seed, base))
        runs.append(fake_run(tmp_path, "pods", "pods", seed, arm))
    result = analyze(runs)
    pods = next(r for r in result["rows"] if r["arm"].startswith("pods"))
    seconds = pods["by_seconds"]
    assert abs(seconds["paper_sensitivity"]["last_dropped"]) > 2 * HEADLINE_TOLERANCE
    assert abs(seconds["sensitivity"]["last_dropped"]) < HEADLINE_TOLERANCE / 2
    assert abs(seconds["sensitivity"]["worst"]) < HEADLINE_TOLERANCE
    assert pods["headlined"] and pods["headline_note"] == ""
    assert pods["headline_speedup"] == pytest.approx(1 / 0.6, rel=0.1)
    assert "| pods 16->4 max_variance | 1.6" in format_table(result)


def test_compare_json_carries_the_headline_and_why_it_is_not_headlined(tmp_path):
    """Four evaluations, the arm's gain all in its last: one evaluation sets any ratio, so the
    report gives the number and says it is not headlined, and why."""
    runs = []
    for seed in range(2):
        runs.append(fake_run(tmp_path, "grpo", "grpo", seed, [(0, 0.1), (24, 0.1), (48, 0.2), (72, 0.5)]))
        runs.append(fake_run(tmp_path, "pods", "pods", seed, [(0, 0.1), (24, 0.12), (48, 0.15), (72, 0.55)]))
    from podsrl.experiments.compare import write_report

    write_report(analyze(runs), tmp_path / "report")
    rows = json.loads((tmp_path / "report" / "compare.json").read_text())["rows"]
    pods = next(r for r in rows if r["arm"].startswith("pods"))
    assert isinstance(pods["headline_speedup"], float) and math.isfinite(pods["headline_speedup"])
    assert pods["headlined"] is False and "moves it by" in pods["headline_note"]
    assert "headline_speedup" not in next(r for r in rows if r["arm"].startswith("grpo"))
    assert "not headlined: " in (tmp_path / "report" / "compare.md").read_text()


def test_the_papers_statistic_is_the_time_to_99_percent_of_the_baselines_best():
    base, arm = [(0, 0.5), (10, 0.6), (20, 0.8), (30, 0.8)], [(0, 0.5), (5, 0.7), (10, 0.9)]
    assert paper_speedup(base, arm) == pytest.approx(19.6 / 7.3)


def test_a_flat_baseline_prints_no_nan_or_inf(tmp_path):
    # the baseline never rises, so there are no levels and no ratio: the table says n/a
    from podsrl.experiments.compare import analyze, format_table
    from tests.test_compare import fake_run

    runs = [fake_run(tmp_path, "grpo", "grpo", seed, [(0, 0.5), (10, 0.5), (20, 0.4)]) for seed in (0, 1)]
    runs += [fake_run(tmp_path, "pods", "pods", seed, [(0, 0.5), (10, 0.6), (20, 0.7)]) for seed in (0, 1)]
    table = format_table(analyze(runs))
    assert "did not rise above its start" in table
    assert not re.search(r"\bnan\b|\binfx|\bnanx", table), table

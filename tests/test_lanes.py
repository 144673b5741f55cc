"""Global grouping of the length-aware schedule (podsrl.rollout.lanes) against brute force."""

import itertools
import random

import pytest

from podsrl.rollout.lanes import balance_lanes, longest_first, lower_bound, makespan


def brute_force_makespan(lengths: list[float], lanes: int) -> float:
    return min(makespan(lengths, list(a), lanes) for a in itertools.product(range(lanes), repeat=len(lengths)))


def random_instances(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        lanes, jobs = rng.randint(1, 4), rng.randint(1, 8)
        if lanes ** jobs > 70_000:
            jobs = 6
        yield [float(rng.randint(1, 96)) for _ in range(jobs)], lanes


@pytest.mark.parametrize("seed", range(3))
def test_exact_search_finds_the_brute_force_optimum(seed):
    for lengths, lanes in random_instances(40, seed):
        assignment = balance_lanes(lengths, lanes, tolerance=0.0, node_budget=10**7)
        assert len(assignment) == len(lengths) and all(0 <= lane < lanes for lane in assignment)
        assert makespan(lengths, assignment, lanes) == brute_force_makespan(lengths, lanes), (lengths, lanes)


@pytest.mark.parametrize("seed", range(3))
def test_lpt_within_grahams_bound_and_tolerance_certified(seed):
    for lengths, lanes in random_instances(40, seed + 10):
        optimum = brute_force_makespan(lengths, lanes)
        assert lower_bound(lengths, lanes) <= optimum
        assert makespan(lengths, longest_first(lengths, lanes), lanes) <= (4 / 3 - 1 / (3 * lanes)) * optimum + 1e-9
        for tolerance in (0.05, 0.2):
            result = makespan(lengths, balance_lanes(lengths, lanes, tolerance=tolerance, node_budget=10**7), lanes)
            assert result <= max(optimum, (1 + tolerance) * lower_bound(lengths, lanes)) + 1e-9


def test_a_case_lpt_gets_wrong_is_solved_exactly():
    # Graham's worst case for 2 lanes: LPT puts 3 and 3 apart, then 2, 2, 2 -> 7; the optimum is 6 (3+3, 2+2+2)
    lengths = [3.0, 3.0, 2.0, 2.0, 2.0]
    assert makespan(lengths, longest_first(lengths, 2), 2) == 7.0
    assert makespan(lengths, balance_lanes(lengths, 2, tolerance=0.0), 2) == 6.0


def test_many_jobs_stay_near_the_bound_without_search():
    rng = random.Random(0)
    lengths = [float(rng.randint(3, 96)) for _ in range(512)]
    assignment = balance_lanes(lengths, 64)
    assert makespan(lengths, assignment, 64) <= 1.02 * lower_bound(lengths, 64)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="lanes"):
        balance_lanes([1.0], 0)
    with pytest.raises(ValueError, match="finite"):
        balance_lanes([1.0, float("nan")], 2)

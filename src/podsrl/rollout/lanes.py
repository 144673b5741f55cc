"""Global grouping for the length-aware schedule: samples into decoding lanes of balanced length.

Infinite Sampling (Wang et al., arXiv 2506.22950) plans generation in two stages: a global
grouping of the samples by predicted length, then shortest-job-first refill at run time.
With continuous refill every one of the g decoding slots works through its samples back to
back, so the decode steps of a call are the largest total length any slot is given: the
makespan of scheduling jobs on g identical machines (P||Cmax). Stage one is therefore a
partition of the samples into g lanes of balanced predicted length.

The paper solves it with an FPTAS. P||Cmax has one only for a fixed number of machines
(Sahni 1976: a dynamic programme over load vectors, exponential in g), and g is 64 or more
here, so: longest-processing-time first (Graham 1969: within 4/3 - 1/(3g) of the optimum),
kept when it is within ``tolerance`` of the lower bound max(longest job, total / g), which
certifies it within that factor of the optimum; otherwise an exact branch and bound where
the instance is small. Many short jobs per lane (the usual case) leave LPT within a few
percent of the bound; few long jobs per lane are where the search pays.
"""

from __future__ import annotations

import math


def lower_bound(lengths: list[float], lanes: int) -> float:
    """No partition into ``lanes`` lanes has a smaller makespan."""
    return max(max(lengths, default=0.0), sum(lengths) / lanes)


def makespan(lengths: list[float], assignment: list[int], lanes: int) -> float:
    """The largest total length of a lane under ``assignment`` (job -> lane)."""
    loads = [0.0] * lanes
    for length, lane in zip(lengths, assignment):
        loads[lane] += length
    return max(loads, default=0.0)


def longest_first(lengths: list[float], lanes: int) -> list[int]:
    """LPT: jobs longest first, each to the lane with the least load (ties: lowest lane)."""
    loads, assignment = [0.0] * lanes, [0] * len(lengths)
    for job in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        lane = min(range(lanes), key=lambda i: (loads[i], i))
        assignment[job] = lane
        loads[lane] += lengths[job]
    return assignment


def _branch_and_bound(lengths: list[float], lanes: int, incumbent: list[int], target: float,
                      node_budget: int) -> list[int]:
    """Depth-first search over lanes for jobs longest first, pruning partial assignments whose
    makespan reaches the incumbent's; lanes with equal loads are interchangeable, so only
    the first of them is tried. Stops at ``target`` or after ``node_budget`` nodes."""
    order = sorted(range(len(lengths)), key=lambda j: (-lengths[j], j))
    best = [makespan(lengths, incumbent, lanes), list(incumbent)]
    loads, current, nodes = [0.0] * lanes, [0] * len(lengths), 0

    def search(depth: int) -> bool:  # True: stop searching
        nonlocal nodes
        if depth == len(order):
            value = max(loads)
            if value < best[0]:
                best[0], best[1] = value, list(current)
            return best[0] <= target
        nodes += 1
        if nodes > node_budget:
            return True
        job, tried = order[depth], set()
        for lane in sorted(range(lanes), key=lambda i: (loads[i], i)):
            if loads[lane] in tried or loads[lane] + lengths[job] >= best[0]:
                continue
            tried.add(loads[lane])
            loads[lane] += lengths[job]
            current[job] = lane
            stop = search(depth + 1)
            loads[lane] -= lengths[job]
            if stop:
                return True
        return False

    search(0)
    return best[1]


def balance_lanes(lengths: list[float], lanes: int, tolerance: float = 0.02, max_search_jobs: int = 48,
                  node_budget: int = 20_000) -> list[int]:
    """Partition jobs of the given lengths into ``lanes`` lanes, minimising the largest lane total.

    Returns the lane of every job. The result's makespan is within ``1 + tolerance`` of the
    lower bound (hence of the optimum), or the optimum itself when the search finishes on
    at most ``max_search_jobs`` jobs within ``node_budget`` nodes, or else LPT's (at most
    4/3 of the optimum). ``tolerance`` 0 and a large budget give the exact optimum."""
    if lanes < 1:
        raise ValueError(f"balance_lanes: lanes must be >= 1, got {lanes}")
    if any(not math.isfinite(x) or x < 0 for x in lengths):
        raise ValueError("balance_lanes: lengths must be finite and >= 0")
    assignment = longest_first(lengths, lanes)
    target = (1 + tolerance) * lower_bound(lengths, lanes)
    if makespan(lengths, assignment, lanes) <= target or len(lengths) > max_search_jobs:
        return assignment
    return _branch_and_bound(lengths, lanes, assignment, target, node_budget)

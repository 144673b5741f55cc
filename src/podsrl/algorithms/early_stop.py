"""When more rollouts of a prompt cannot help max-variance down-sampling: lossless early stop.

PODS keeps the m rewards of largest variance among the n it generated (``select.max_variance``).
Adding samples never lowers that maximum (the old best subset is still there), and when the
reward has known bounds [lo, hi] the maximum can never exceed the variance of m values all at
the bounds, floor(m/2) at one and ceil(m/2) at the other:

    bound(m) = (hi - lo)^2 * floor(m/2) * ceil(m/2) / m^2

(the variance is strictly convex in each value, so its maximum over [lo, hi]^m is only reached
at vertices, and among vertices the most balanced split wins). A group whose finished samples
already contain such a subset is **saturated**: generating its remaining samples cannot raise
the variance of what PODS keeps, so they can be skipped without loss of kept variance. Which
equally-good subset is kept may change (ties), and the samples that finish first are the
short ones: the kept set's length is measured in benchmarks, not assumed unchanged.

Every function works on a [P, k] reward tensor, one row per prompt group; NaN marks a sample
not finished (or never generated), so rows may hold different numbers of finished samples.
"""

from __future__ import annotations

import torch


def max_kept_variance(m: int, low: float, high: float) -> float:
    """The largest population variance any m rewards in [low, high] can have."""
    return (high - low) ** 2 * (m // 2) * (m - m // 2) / m**2


# x (high - low): a reward this close to a bound is at it (float32 sums such as 0.8 + 0.2)
BOUND_TOLERANCE = 1e-6


def at_bounds(rewards: torch.Tensor, low: float, high: float,
              tolerance: float = BOUND_TOLERANCE) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards (any shape; NaN: not finished) -> (at the low bound, at the high bound), bool each."""
    slack = tolerance * (high - low)
    return rewards <= low + slack, rewards >= high - slack


def saturated(rewards: torch.Tensor, m: int, low: float, high: float,
              tolerance: float = BOUND_TOLERANCE) -> torch.Tensor:
    """rewards [P, k] (NaN = not finished) -> [P] bool: the finished samples of the group
    already hold m rewards whose variance is :func:`max_kept_variance`.

    That takes at least floor(m/2) rewards at one bound and ceil(m/2) at the other. A reward
    counts as at a bound within ``tolerance`` x (high - low), so that weighted sums such as
    0.8 + 0.2 that round in float32 still count; a wider tolerance would stop groups that
    could still gain. With m = 1 the variance is always 0: nothing to gain, every group with
    one finished sample is saturated.
    """
    if high <= low:
        raise ValueError(f"reward bounds: need low < high, got [{low}, {high}]")
    finished = ~rewards.isnan()
    if m == 1:
        return finished.any(dim=1)
    low_bound, high_bound = at_bounds(rewards, low, high, tolerance)
    at_high = (finished & high_bound).sum(dim=1)  # [P]
    at_low = (finished & low_bound).sum(dim=1)  # [P]
    fewer, more = m // 2, m - m // 2
    return ((at_high >= more) & (at_low >= fewer)) | ((at_high >= fewer) & (at_low >= more))


def fill_skipped(rewards: torch.Tensor, generated: torch.Tensor | None) -> torch.Tensor:
    """rewards [P, n] (NaN where a sample was skipped), generated [P, n] -> rewards for
    selection, skipped samples at their group's mean.

    Only saturated groups have skipped samples, and their best m-subset lies entirely at the
    bounds; a value strictly inside the bounds (the mean of a group that holds both) lowers the
    variance of any subset it joins, so max-variance selection never keeps a filled sample.
    """
    if generated is None:
        return rewards
    mean = rewards.nanmean(dim=1, keepdim=True)  # [P, 1] over the generated samples
    return rewards.where(generated, mean)

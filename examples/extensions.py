"""Extending podsrl without editing it: a down-sampling rule, named in the config as
``examples/extensions.py:max_variance_no_ties`` (docs/algorithms.md, "Your own rule, engine,
task or reward"). A rule takes rewards [P, n], m and the run's seeded generator, and returns
the kept indices [P, m], sorted within each row."""

import torch

from podsrl.algorithms.select import max_variance


def max_variance_no_ties(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """max_variance after a tiny seeded jitter: among equally good subsets, a random one
    rather than the smallest-k one the built-in rule's tie-break picks."""
    jitter = torch.rand(rewards.shape, generator=generator, dtype=torch.float64) * 1e-9  # [P, n]
    return max_variance(rewards.double() + jitter, m)

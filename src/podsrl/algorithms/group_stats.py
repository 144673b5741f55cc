"""What shows whether down-sampling works, for every integration alike (podsrl's trainer,
``podsrl.trl``): reward mean, mean within-group spread and the share of constant groups
(zero variance: no learning signal), of the generated and of the kept rollouts.

rewards [P, k] -> numbers; pure tensor code.
"""

from __future__ import annotations

import math

import torch


def is_constant(rewards: torch.Tensor) -> torch.Tensor:
    """[P] True where every generated reward of the group [P, k] is the same (NaN = not
    generated): no learning signal. The one test of constancy (advantages, selection
    statistics, dynamic sampling)."""
    generated = ~rewards.isnan()  # [P, k]
    high = torch.where(generated, rewards, -math.inf).amax(1)
    low = torch.where(generated, rewards, math.inf).amin(1)
    return ~(high > low)


def group_stats(prefix: str, rewards: torch.Tensor) -> dict[str, float]:
    """Mean, mean within-group std and zero-variance fraction of rewards [P, k]; NaN entries
    (samples early stop skipped) are left out."""
    constant_frac = float(is_constant(rewards).float().mean())
    if not rewards.isnan().any():
        return {f"{prefix}_mean": float(rewards.mean()),
                f"{prefix}_std": float(rewards.std(dim=1, correction=0).mean()),
                f"{prefix}_zero_var_frac": constant_frac}
    mean = rewards.nanmean(dim=1, keepdim=True)  # [P, 1]
    std = (rewards - mean).square().nanmean(dim=1).sqrt()  # [P]
    return {f"{prefix}_mean": float(rewards.nanmean()), f"{prefix}_std": float(std.mean()),
            f"{prefix}_zero_var_frac": constant_frac}

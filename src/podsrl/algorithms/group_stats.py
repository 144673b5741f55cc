"""What shows whether down-sampling works, for every integration alike (podsrl's trainer,
``podsrl.trl``): reward mean, mean within-group spread and the share of constant groups
(zero variance: no learning signal), of the generated and of the kept rollouts.

rewards [P, k] -> numbers; pure tensor code.
"""

from __future__ import annotations

import torch


def group_stats(prefix: str, rewards: torch.Tensor) -> dict[str, float]:
    """Mean, mean within-group std and zero-variance fraction of rewards [P, k]; NaN entries
    (samples early stop skipped) are left out."""
    present = ~rewards.isnan()
    if present.all():
        return {f"{prefix}_mean": float(rewards.mean()),
                f"{prefix}_std": float(rewards.std(dim=1, correction=0).mean()),
                f"{prefix}_zero_var_frac": float((rewards.amax(1) == rewards.amin(1)).float().mean())}
    mean = rewards.nanmean(dim=1, keepdim=True)  # [P, 1]
    std = (rewards - mean).square().nanmean(dim=1).sqrt()  # [P]
    filled = rewards.where(present, mean)  # the mean changes neither max nor min
    return {f"{prefix}_mean": float(rewards.nanmean()), f"{prefix}_std": float(std.mean()),
            f"{prefix}_zero_var_frac": float((filled.amax(1) == filled.amin(1)).float().mean())}

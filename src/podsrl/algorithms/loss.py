"""The token-level clipped policy-gradient loss of GRPO / PODS, as a pure tensor function.

Shapes: B sequences in a (micro-)batch, Lc completion tokens.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["sequence", "token"]
# TRL's loss_type values that podsrl implements -> their aggregation (TRL's grpo_trainer.py:
# "grpo" averages each sequence's tokens then the sequences; "dapo" divides by the token count
# of the whole accumulated step, over all processes)
LOSS_TYPES: dict[str, Aggregation] = {"grpo": "sequence", "dapo": "token"}


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float = 0.2,
                ref_logp: torch.Tensor | None = None, beta: float = 0.0,
                aggregation: Aggregation = "sequence", num_sequences: int | None = None,
                num_tokens: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped policy-gradient loss (PPO clip, GRPO/PODS objective).

    logp, old_logp, mask [B, Lc]; advantages [B]; ref_logp [B, Lc] or None.
    ratio = exp(logp - old_logp); per token ``-min(ratio*A, clip(ratio, 1-epsilon,
    1+epsilon_high)*A) + beta * KL``, KL by the k3 estimator ``exp(q) - q - 1`` with
    ``q = ref_logp - logp`` (unbiased, non-negative). With one iteration per batch,
    old_logp = logp.detach(): the ratio is 1 and the loss is REINFORCE with a group baseline.

    Aggregation: ``"sequence"`` = token mean per sequence, then mean over sequences (the
    paper; TRL's loss_type "grpo"); ``"token"`` = mean over all tokens of the batch (DAPO;
    TRL's "dapo"). For gradient accumulation pass the *whole* batch's ``num_sequences`` /
    ``num_tokens``: the micro-batch losses then add up to the full-batch loss exactly.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)  # [B, Lc]
    adv = advantages.unsqueeze(1).to(logp.dtype)  # [B, 1]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # [B, Lc]
    stats = {"clip_fraction": float(((unclipped != clipped).to(logp.dtype) * mask).sum() / mask.sum().clamp_min(1))}
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        q = ref_logp - logp
        kl = torch.exp(q) - q - 1  # [B, Lc] k3 estimator
        per_token = per_token + beta * kl
        stats["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp_min(1))
    if aggregation == "sequence":
        per_sequence = (per_token * mask).sum(1) / mask.sum(1).clamp_min(1)  # [B]
        loss = per_sequence.sum() / (num_sequences or logp.shape[0])
    elif aggregation == "token":
        loss = (per_token * mask).sum() / (num_tokens or mask.sum().clamp_min(1))
    else:
        raise ValueError(f"aggregation: unknown aggregation {aggregation!r}; use 'sequence' or 'token'")
    return loss, stats

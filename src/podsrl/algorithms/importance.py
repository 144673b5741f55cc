"""Importance weights between the engine that sampled the rollouts and the policy being
trained: an inference engine (vLLM) computes its own logits, so the tokens it samples come
from a distribution slightly different from the policy's, and the policy gradient is off-policy
by that much (Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", 2025). TRL corrects it with a truncated or masked importance ratio
(``vllm_importance_sampling_*``); these are its four modes, with the same meaning.

Shapes: B sequences, Lc completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SAMPLER_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# partial rollouts' alternative to weighting (partial_stale_correction mask): a token drawn by an
# earlier policy (a log-prob reported for it) is left out of the loss, weight 0; the others weigh 1
STALE_MASK = "stale_mask"


@dataclass(frozen=True)
class SamplerCorrection:
    mode: str = "sequence_mask"  # one of SAMPLER_CORRECTION_MODES (TRL's default)
    clip_min: float = 0.0  # C_min (0: no lower bound, ratios are never negative)
    clip_max: float = 3.0  # C_max


def importance_ratios(policy_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor,
                      per_sequence: bool) -> torch.Tensor:
    """pi_policy / pi_sampler per token [B, Lc], or per sequence [B, 1] (the product of its
    tokens' ratios); a NaN sampling log-prob (none reported) counts as ratio 1, as in TRL."""
    log_ratio = ((policy_logp - sampling_logp) * mask).nan_to_num(0.0)  # [B, Lc]
    if per_sequence:
        log_ratio = log_ratio.sum(-1, keepdim=True)  # [B, 1]
    return log_ratio.exp()


def sampler_importance_weights(policy_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor,
                               correction: SamplerCorrection) -> torch.Tensor:
    """The weight of each token's loss term: pi_policy / pi_sampler, truncated or masked.

    policy_logp, sampling_logp, mask [B, Lc] -> weights [B, Lc] (token modes) or [B, 1]
    (sequence modes: the product of the sequence's token ratios, one weight for all its
    tokens). ``*_truncate`` clips the ratio to [clip_min, clip_max]; ``*_mask`` sets a ratio
    outside it to 0; :data:`STALE_MASK` gives 0 to every token with a reported log-prob.
    """
    if correction.mode == STALE_MASK:
        return sampling_logp.isnan().to(policy_logp.dtype)  # [B, Lc]
    if correction.mode not in SAMPLER_CORRECTION_MODES:
        raise ValueError(f"vllm_importance_sampling_mode: unknown mode {correction.mode!r}; known: "
                         f"{', '.join(SAMPLER_CORRECTION_MODES)}")
    ratio = importance_ratios(policy_logp, sampling_logp, mask,
                              per_sequence=correction.mode.startswith("sequence"))
    if correction.mode.endswith("truncate"):
        return ratio.clamp(min=correction.clip_min, max=correction.clip_max)
    outside = (ratio < correction.clip_min) | (ratio > correction.clip_max)
    return ratio.masked_fill(outside, 0.0)


def sampler_logp_difference(policy_logp: torch.Tensor, sampling_logp: torch.Tensor,
                            mask: torch.Tensor) -> tuple[float, float, float]:
    """|log pi_policy - log pi_sampler| over the completion tokens of ``mask`` [B, Lc]: its
    sum, the token count and its largest value (how far the engine's numerics are from the
    policy's; 0 for the same model and numerics). TRL logs the same as
    sampling/sampling_logp_difference."""
    difference = ((policy_logp - sampling_logp).abs() * mask).nan_to_num(0.0)  # [B, Lc]
    return float(difference.sum()), float(mask.sum()), float(difference.max()) if difference.numel() else 0.0

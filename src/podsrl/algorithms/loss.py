"""The token-level clipped policy-gradient loss of GRPO / PODS, as a pure tensor function,
and the ways its per-token terms are reduced to one number (``loss_type``).

Shapes: B sequences in a (micro-)batch, Lc completion tokens.

A loss type (the one name of this reduction, TRL's ``loss_type``) is a function
``loss_type(per_token [B, Lc], mask [B, Lc], num_sequences, num_tokens) -> scalar``, where
``num_sequences`` / ``num_tokens`` count the *whole* step (all micro-batches; tokens averaged
over processes), so that micro-batch losses add up to the step's loss. Registered in
``LOSSES`` under TRL's ``loss_type`` names, or named in the config as ``module:function``
(:mod:`podsrl.registry`).
"""

from __future__ import annotations

from typing import Callable

import torch

from podsrl.contracts import broken, tensor_like
from podsrl.registry import Registry

LossType = Callable[[torch.Tensor, torch.Tensor, int, float], torch.Tensor]


def loss_value(value, args: tuple, field: str, spec: str) -> torch.Tensor:
    """A loss type's contract: one floating-point number, finite wherever the per-token
    terms are (a non-finite term is the model's: the step is skipped, as documented), carrying
    the gradient of the terms."""
    per_token = args[0]
    loss = tensor_like(value.reshape(()) if isinstance(value, torch.Tensor) and value.numel() == 1 else value,
                       field, spec, (), floating=True)
    if not bool(torch.isfinite(loss)) and bool(torch.isfinite(per_token).all()):
        raise broken(field, spec, f"{float(loss.detach())} from finite per-token terms")
    if per_token.requires_grad and not loss.requires_grad:
        raise broken(field, spec, "a loss without a gradient (detached from the per-token terms)")
    return loss


# TRL's loss_type values that podsrl implements (TRL's grpo_trainer.py: "grpo" averages each
# sequence's tokens then the sequences; "dapo" divides by the token count of the whole
# accumulated step, over all processes)
LOSSES = Registry("loss", "loss_type", takes="(per_token, mask, num_sequences, num_tokens)", arity=4,
                  check_output=loss_value)


@LOSSES.register("grpo")
def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor, num_sequences: int,
                  num_tokens: float) -> torch.Tensor:
    """Token mean per sequence, then the mean over the step's sequences (the paper; TRL's "grpo")."""
    per_sequence = (per_token * mask).sum(1) / mask.sum(1).clamp_min(1)  # [B]
    return per_sequence.sum() / num_sequences


@LOSSES.register("dapo")
def token_mean(per_token: torch.Tensor, mask: torch.Tensor, num_sequences: int,
               num_tokens: float) -> torch.Tensor:
    """Sum over tokens divided by the step's token count (DAPO; TRL's "dapo")."""
    return (per_token * mask).sum() / num_tokens


def loss_type_named(name: str) -> LossType:
    """The loss type registered in ``LOSSES`` as ``name``."""
    if name not in LOSSES:
        raise ValueError(f"loss_type: unknown loss type {name!r}; use one of {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float = 0.2,
                ref_logp: torch.Tensor | None = None, beta: float = 0.0,
                loss_type: str | LossType = "grpo", num_sequences: int | None = None,
                num_tokens: float | None = None, sampler_weights: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped policy-gradient loss (PPO clip, GRPO/PODS objective).

    logp, old_logp, mask [B, Lc]; advantages [B]; ref_logp [B, Lc] or None.
    ratio = exp(logp - old_logp); per token ``-min(ratio*A, clip(ratio, 1-epsilon,
    1+epsilon_high)*A) + beta * KL``, KL by the k3 estimator ``exp(q) - q - 1`` with
    ``q = ref_logp - logp`` (unbiased, non-negative). With one iteration per batch,
    old_logp = logp.detach(): the ratio is 1 and the loss is REINFORCE with a group baseline.

    ``loss_type``: a ``LOSSES`` name, ``"grpo"`` = token mean per sequence, then mean over
    sequences (the paper), ``"dapo"`` = mean over all tokens of the batch (DAPO), as TRL's
    loss_type; or any loss type function. For gradient accumulation pass
    the *whole* batch's ``num_sequences`` / ``num_tokens``: the micro-batch losses then add up
    to the full-batch loss exactly.

    ``sampler_weights`` [B, Lc] or [B, 1]: importance weights between the engine that sampled
    the rollouts and the policy (:mod:`podsrl.algorithms.importance`), multiplying the
    policy-gradient term before the KL term is added, as TRL does.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)  # [B, Lc]
    adv = advantages.unsqueeze(1).to(logp.dtype)  # [B, 1]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # [B, Lc]
    stats = {"clip_fraction": float(((unclipped != clipped).to(logp.dtype) * mask).sum()
                                    / mask.sum().clamp_min(1))}
    if sampler_weights is not None:
        per_token = per_token * sampler_weights.to(logp.dtype)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        q = ref_logp - logp
        kl = torch.exp(q) - q - 1  # [B, Lc] k3 estimator
        per_token = per_token + beta * kl
        stats["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp_min(1))
    reduce = loss_type_named(loss_type) if isinstance(loss_type, str) else loss_type
    loss = reduce(per_token, mask, num_sequences or logp.shape[0], num_tokens or mask.sum().clamp_min(1))
    return loss, stats

"""Advantages and the policy-gradient loss, as pure tensor functions.

Shapes: P prompts, m kept rollouts per prompt, B = P*m sequences in a (micro-)batch,
Lc completion tokens.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["sequence", "token"]


def group_advantages(rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """``A_i = (r_i - mean_S r) / (std_S r + eps)`` over each group's kept set S.

    rewards [P, m] -> advantages [P, m]. The paper normalises over the m *kept* rollouts,
    not the n generated. ``std`` is the sample standard deviation (correction 1, as TRL and
    the authors' code); ``scale_by_std=False`` only centres (Dr. GRPO). A group whose kept
    rewards are all equal gets exactly 0, never NaN (it carries no learning signal).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, m], got shape {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [P, m]
    constant = (rewards.amax(dim=1) == rewards.amin(dim=1)).unsqueeze(1)  # [P, 1]
    if scale_by_std and rewards.shape[1] > 1:
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)
    return centred.masked_fill(constant, 0.0)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   num_completion_tokens: int) -> torch.Tensor:
    """Log-probabilities of the last ``num_completion_tokens`` tokens of each row.

    input_ids, attention_mask [B, Lp + Lc] (prompt left-padded, completion right-padded)
    -> logp [B, Lc] in float32. Position ids count real tokens only, so a left-padded row
    sees the same positions as it would unpadded.
    """
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_min(0)  # [B, L]
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids).logits  # [B, L, V]
    logits = logits[:, -num_completion_tokens - 1:-1].float()  # [B, Lc, V] predicts each completion token
    targets = input_ids[:, -num_completion_tokens:]  # [B, Lc]
    chosen = logits.gather(2, targets.unsqueeze(2)).squeeze(2)  # [B, Lc]
    return chosen - torch.logsumexp(logits, dim=2)


def shared_prompt_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                 num_completion_tokens: int) -> torch.Tensor:
    """:func:`token_logprobs` with each prompt run through the model once per group.

    Consecutive rows with the same prompt (a group's kept rollouts) share one forward pass
    of the prompt: its KV cache, with its autograd graph, is repeated for the group's rows
    and only the completion tokens are run on top. The log-probabilities and the gradient
    are those of the full rows (tested against :func:`token_logprobs`), at the cost of
    P x Lp + B x Lc tokens instead of B x (Lp + Lc).
    """
    prompt_cols = input_ids.shape[1] - num_completion_tokens
    prompt_ids, prompt_mask = input_ids[:, :prompt_cols], attention_mask[:, :prompt_cols]  # [B, Lp]
    starts = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    starts[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(1) | (prompt_mask[1:] != prompt_mask[:-1]).any(1)
    if bool(starts.all()) or prompt_cols < 1:  # nothing to share
        return token_logprobs(model, input_ids, attention_mask, num_completion_tokens)
    first_rows = starts.nonzero().squeeze(1)  # [u]
    repeats = torch.diff(first_rows, append=first_rows.new_tensor([input_ids.shape[0]]))  # [u] rows per prompt
    from transformers import DynamicCache

    cache = DynamicCache(config=getattr(model, "module", model).config)  # (DDP keeps the model in .module)
    unique_ids, unique_mask = prompt_ids[first_rows], prompt_mask[first_rows]  # [u, Lp]
    out = model(input_ids=unique_ids, attention_mask=unique_mask,
                position_ids=(unique_mask.cumsum(1) - 1).clamp_min(0), past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    first_logits = out.logits[:, -1].float().repeat_interleave(repeats, dim=0)  # [B, V] predicts token 0
    for layer in cache.layers:  # [u, ...] -> [B, ...]; repeat_interleave keeps the graph to the prompt pass
        layer.keys = layer.keys.repeat_interleave(repeats, dim=0)
        layer.values = layer.values.repeat_interleave(repeats, dim=0)
    completion_ids = input_ids[:, prompt_cols:]  # [B, Lc]
    positions = (attention_mask.cumsum(dim=1) - 1).clamp_min(0)[:, prompt_cols:]  # [B, Lc]
    rest = model(input_ids=completion_ids, attention_mask=attention_mask, position_ids=positions,
                 past_key_values=cache, use_cache=True).logits[:, :-1].float()  # [B, Lc - 1, V]
    logits = torch.cat([first_logits.unsqueeze(1), rest], dim=1)  # [B, Lc, V]
    chosen = logits.gather(2, completion_ids.unsqueeze(2)).squeeze(2)  # [B, Lc]
    return chosen - torch.logsumexp(logits, dim=2)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_eps_low: float = 0.2, clip_eps_high: float = 0.2,
                ref_logp: torch.Tensor | None = None, beta: float = 0.0,
                aggregation: Aggregation = "sequence", num_sequences: int | None = None,
                num_tokens: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped policy-gradient loss (PPO clip, GRPO/PODS objective).

    logp, old_logp, mask [B, Lc]; advantages [B]; ref_logp [B, Lc] or None.
    ratio = exp(logp - old_logp); per token ``-min(ratio*A, clip(ratio, 1-eps_low,
    1+eps_high)*A) + beta * KL``, KL by the k3 estimator ``exp(q) - q - 1`` with
    ``q = ref_logp - logp`` (unbiased, non-negative). With one iteration per batch,
    old_logp = logp.detach(): the ratio is 1 and the loss is REINFORCE with a group baseline.

    Aggregation: ``"sequence"`` = token mean per sequence, then mean over sequences (the
    paper); ``"token"`` = mean over all tokens of the batch (DAPO). For gradient
    accumulation pass the *whole* batch's ``num_sequences`` / ``num_tokens``: the
    micro-batch losses then add up to the full-batch loss exactly.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)  # [B, Lc]
    adv = advantages.unsqueeze(1).to(logp.dtype)  # [B, 1]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv
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
        raise ValueError(f"loss_aggregation: unknown aggregation {aggregation!r}; use 'sequence' or 'token'")
    return loss, stats

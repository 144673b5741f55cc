"""Token sampling with transformers' semantics, for podsrl's own decoder (the slots engine).

logits in float32, temperature then top-p (nucleus) filtering, one categorical draw per
token (the exponential race); greedy (argmax) at temperature 0. Tested against transformers' logits warpers.
"""

from __future__ import annotations

import torch


def warp_logits(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Temperature, then nucleus (top-p) filtering, as transformers' warpers do.

    logits [B, V] (float32) -> [B, V] with filtered tokens at -inf. Of the tokens sorted by
    probability, those whose ascending cumulative probability is <= 1 - top_p are removed;
    the most likely token is always kept.
    """
    logits = logits / temperature
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)  # [B, V]
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def next_tokens(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits [B, V] -> tokens [B]: argmax when temperature == 0, else one multinomial draw each."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = warp_logits(logits.float(), temperature, top_p).softmax(dim=-1)
    # The exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) drawn independently is token i with
    # probability p_i, as torch.multinomial (which races the same way with exponential_) draws it;
    # E = -log U from uniform draws is 4x faster on the CPU at [256, 317] (1.9 -> 0.4 ms a step).
    # U = 0 (p = 2^-24 per entry) gives E = inf: that entry weighs 0 in that one draw.
    race = torch.rand_like(probs).log_().neg_()
    return (probs / race).argmax(dim=-1)

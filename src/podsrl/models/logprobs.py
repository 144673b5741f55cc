"""Per-token log-probabilities of completions under a causal LM: the forward pass of the
update and of the no-grad old / reference log-probs.

Shapes: B sequences, Lp prompt columns (left-padded), Lc completion columns.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


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
    # [u] rows per prompt
    repeats = torch.diff(first_rows, append=first_rows.new_tensor([input_ids.shape[0]]))
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

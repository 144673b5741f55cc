"""Generation with Hugging Face ``generate``: n samples per prompt, group axis kept."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from podsrl.types import Rollouts, completion_mask_from_eos


def _generate_group(model, ids: torch.Tensor, mask: torch.Tensor, num_samples: int, share_prefill: bool,
                    **generate_kwargs) -> torch.Tensor:
    """ids, mask [p, Lp] -> sequences [p * n, Lp + Lc], grouped by prompt.

    With ``share_prefill`` the prompt is run through the model once per prompt, not once
    per sample: its KV cache (all tokens but the last, which ``generate`` must see to
    produce the first logits) is copied n times and decoding continues from it. The
    samples drawn are the same as without sharing (same RNG draws, same shapes); logits
    can differ in the last float bits because the prompt is computed in a smaller batch.
    """
    if not share_prefill or num_samples == 1 or ids.shape[1] < 2:
        return model.generate(input_ids=ids, attention_mask=mask, num_return_sequences=num_samples,
                              **generate_kwargs)
    cache = DynamicCache(config=model.config)
    position_ids = (mask.cumsum(dim=1) - 1).clamp_min(0)  # [p, Lp], as generate computes them
    model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position_ids[:, :-1],
          past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(num_samples)  # [p, ...] -> [p * n, ...], grouped by prompt
    return model.generate(input_ids=ids.repeat_interleave(num_samples, dim=0),
                          attention_mask=mask.repeat_interleave(num_samples, dim=0),
                          past_key_values=cache, **generate_kwargs)


# With a static cache the prompt width is rounded up to a multiple of this: the cache's length
# (prompt width + max_new_tokens) and so the compiled decode step's shapes change only when the
# longest prompt crosses a multiple, not at every step.
STATIC_PROMPT_WIDTH_STEP = 64


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], num_samples: int, *, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, batch_size: int | None = None,
             share_prefill: bool = True, min_new_tokens: int = 0, static_cache: bool = False,
             compile_config=None) -> Rollouts:
    """Sample ``num_samples`` completions per prompt (greedy when ``temperature == 0``).

    Prompts are left-padded so every row's completion starts at the same column.
    Sampling draws from torch's global RNG: seed it (or save its state) for reproducibility.
    ``batch_size`` bounds the number of sequences decoded at once (whole prompt groups).
    ``share_prefill`` computes each prompt's KV cache once for its n samples (PODS
    generates many rollouts per prompt, so the prompt would otherwise be paid n times).
    ``min_new_tokens``: no EOS before that many tokens (benchmarks force every row to one length).
    ``static_cache``: transformers' static KV cache, whose decode step transformers compiles on
    a GPU (``compile_config``: a ``transformers.CompileConfig``, None = its default); the prefill
    is then not shared (a static cache cannot be copied to n rows) and prompts are padded to a
    multiple of STATIC_PROMPT_WIDTH_STEP tokens, so the compiled shapes rarely change.
    """
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False,
                    pad_to_multiple_of=STATIC_PROMPT_WIDTH_STEP if static_cache else None)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]  # [P, Lp]
    num_prompts = len(prompts)
    prompts_per_call = num_prompts if not batch_size else max(1, batch_size // num_samples)
    sampling = dict(do_sample=False) if temperature == 0 else dict(
        do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    if min_new_tokens:
        sampling["min_new_tokens"] = min_new_tokens
    if static_cache:
        sampling.update(cache_implementation="static", compile_config=compile_config)
        share_prefill = False
    was_training = model.training
    model.eval()
    chunks = []
    for start in range(0, num_prompts, prompts_per_call):
        ids = prompt_ids[start:start + prompts_per_call].to(model.device)
        mask = prompt_mask[start:start + prompts_per_call].to(model.device)
        out = _generate_group(model, ids, mask, num_samples, share_prefill, max_new_tokens=max_new_tokens,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sampling)
        chunks.append(out[:, ids.shape[1]:].cpu())  # [p * n, <=max_new_tokens]: rollouts live on the CPU
    model.train(was_training)
    width = max(c.shape[1] for c in chunks)
    completion_ids = torch.cat(
        [torch.nn.functional.pad(c, (0, width - c.shape[1]), value=tokenizer.pad_token_id)
         for c in chunks]).view(num_prompts, num_samples, width)  # [P, n, Lc]
    prompt_width = int(prompt_mask.sum(dim=1).max())  # the static cache's extra left padding: not the update's work
    rollouts = to_rollouts(tokenizer, prompt_ids[:, -prompt_width:], prompt_mask[:, -prompt_width:], completion_ids)
    rollouts.stats["decode_steps"] = sum(c.shape[1] - 1 for c in chunks)  # the first token comes from the prefill
    return rollouts


def to_rollouts(tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                completion_ids: torch.Tensor, generated: torch.Tensor | None = None) -> Rollouts:
    """Rollouts from generated tokens [P, n, Lc] (anything after a row's first EOS is ignored);
    ``generated`` [P, n]: False for samples never generated (masked out entirely)."""
    num_prompts, num_samples, width = completion_ids.shape
    completion_mask = completion_mask_from_eos(completion_ids, tokenizer.eos_token_id)
    if generated is not None:
        completion_mask = completion_mask * generated.unsqueeze(-1)  # [P, n, Lc]
    rows = zip(completion_ids.view(-1, width).tolist(), completion_mask.view(-1, width).tolist())
    decoded = tokenizer.batch_decode([[t for t, keep in zip(ids, mask) if keep] for ids, mask in rows],
                                     skip_special_tokens=True)
    texts = [decoded[p * num_samples:(p + 1) * num_samples] for p in range(num_prompts)]
    return Rollouts(prompt_ids, prompt_mask, completion_ids, completion_mask, texts,
                    stats={"generated_tokens": int(completion_mask.sum())}, generated=generated)

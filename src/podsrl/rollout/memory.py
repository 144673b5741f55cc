"""Estimated generation memory: what grows with the number of sequences decoded at once.

Used by ``generation_memory_mb`` to size the slots engine and to bound the hf engine.
"""

from __future__ import annotations

import torch


def kv_bytes_per_token(model_config) -> int:
    """Bytes of keys + values one token occupies in the cache, over all layers."""
    text = model_config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    dtype = getattr(text, "dtype", None) or torch.float32
    element = torch.finfo(getattr(torch, dtype) if isinstance(dtype, str) else dtype).bits // 8
    return text.num_hidden_layers * 2 * kv_heads * head_dim * element


def generation_memory_bytes(model_config, rows: int, seq_len: int, prompts: int = 0, prompt_len: int = 0,
                            stored_tokens: int = 0) -> int:
    """Estimated peak of the memory that grows with what is decoded: the KV cache of ``rows``
    sequences of ``seq_len`` tokens, their float32 logits and sampling probabilities, and
    (slots engine) the stored prefills of ``prompts`` prompts with their last logits and
    ``stored_tokens`` more cached tokens held outside the slots (the length-aware probe's).
    Weights and activations of one decode step are not counted (they do not grow with n)."""
    vocab = model_config.get_text_config(decoder=True).vocab_size
    per_token = kv_bytes_per_token(model_config)
    return (rows * seq_len * per_token + rows * vocab * 4 * 2
            + (prompts * prompt_len + stored_tokens) * per_token + prompts * vocab * 4)

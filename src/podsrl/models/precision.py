"""Mixed precision and activation checkpointing for the policy's forward passes.

Mixed precision (``bf16``) keeps the weights, gradients and optimizer state in float32 and
runs the forward passes under ``torch.autocast`` in bfloat16: matmuls get bfloat16's speed
and memory, while updates far smaller than bfloat16's resolution (2^-8 relative: an lr of
1e-6 on a weight of 0.01) still reach the float32 master weights. Training with
``dtype: bfloat16`` instead rounds every such update away.

Activation checkpointing is switched on only around the update's forward/backward:
transformers turns the KV cache off in checkpointed layers of a model in training mode,
which generation (no gradient, but the same model in training mode) needs.
"""

from __future__ import annotations

import contextlib

import torch

AUTOCAST_DTYPES = {"": None, "bfloat16": torch.bfloat16}


def autocast(device: torch.device | str, dtype: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type ('' = off: full precision)."""
    if not dtype:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=AUTOCAST_DTYPES[dtype])


@contextlib.contextmanager
def activation_checkpointing(model: torch.nn.Module, enabled: bool):
    """Recompute each decoder layer's activations in backward instead of storing them
    (non-reentrant, so inputs need not require grad); off again on exit."""
    if not enabled:
        yield
        return
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # new name (5.23 has it, 5.16.1 not)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        disable = model.activation_checkpointing_disable
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        disable = model.gradient_checkpointing_disable
    try:
        yield
    finally:
        disable()

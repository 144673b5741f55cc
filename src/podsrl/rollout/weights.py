"""The policy's weights as an inference engine loads them: checkpoint names, LoRA merged.

An engine that keeps its own copy of the weights (vLLM) is fed from here after every
optimizer step; :func:`weights_version` tells it whether anything changed since.
"""

from __future__ import annotations

from typing import Iterator

import torch


def weights_version(model: torch.nn.Module) -> tuple[int, ...]:
    """A fingerprint that changes whenever a parameter is modified in place (torch counts every
    in-place change of a tensor: optimizer steps, ``load_state_dict``, ``copy_``) or replaced."""
    return tuple(value for p in model.parameters() for value in (id(p), p._version))


@torch.no_grad()
def inference_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight under the names of the model's own checkpoint
    (``model.layers.0.self_attn.q_proj.weight``), with each active LoRA adapter merged into
    its base weight out of place (W + scaling * B @ A): the policy itself is not modified, so
    no merge / unmerge rounding accumulates in its base weights. Tensors are yielded one at
    a time (a merged copy lives only until the consumer moves on)."""
    if not hasattr(model, "peft_config"):
        yield from ((name, p.detach()) for name, p in model.named_parameters())
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    lora_layers = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, p in base.named_parameters():
        if ".lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        layer_name = owner.removesuffix(".base_layer")
        layer = lora_layers.get(layer_name) if owner.endswith(".base_layer") else None
        if layer is None:
            yield name, p.detach()
            continue
        weight = p.detach()
        if leaf == "weight" and not layer.merged:
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
        yield f"{layer_name}.{leaf}", weight

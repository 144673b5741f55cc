"""A copy of the policy to generate from: LoRA merged, in the dtype generation is fastest in.

The policy keeps what the update needs (float32 master weights, unmerged LoRA adapters, bf16
autocast); sampling needs none of it. Decoding through unmerged adapters costs two extra small
matmuls per adapted layer and token, and float32 weights under autocast are cast to bfloat16 at
every forward pass (what a copy saves, measured: benchmarks/RESULTS.md, "The hf engine's
generation copy (#39)"). The copy is a plain transformers model built once from the
policy's config; its weights are refreshed in place (``copy_``: the same tensors, so a compiled
decode step stays valid) whenever a policy parameter changed (:func:`weights_version`), with each
adapter merged out of place (:func:`inference_weights`: the policy is not modified).
"""

from __future__ import annotations

import time

import torch

from podsrl.rollout.weights import inference_weights, weights_version

COPY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class GenerationCopy:
    """``copy(policy)`` -> a plain model in ``dtype`` holding the policy's current weights."""

    def __init__(self, dtype: str) -> None:
        if dtype not in COPY_DTYPES:
            raise ValueError(f"generation_dtype: expected one of {', '.join(COPY_DTYPES)}, got {dtype!r}")
        self.dtype = COPY_DTYPES[dtype]
        self.model: torch.nn.Module | None = None
        self.version: tuple | None = None  # the policy's parameter versions the copy holds
        self.refresh_seconds = 0.0  # time spent refreshing the copy since the last step_record

    def __call__(self, policy: torch.nn.Module) -> torch.nn.Module:
        if self.model is None:
            self.model = self._build(policy)
        version = weights_version(policy)
        if version != self.version:
            start = time.perf_counter()
            self._refresh(policy)
            self.version = version
            self.refresh_seconds += time.perf_counter() - start
        return self.model

    def _build(self, policy: torch.nn.Module) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        base = getattr(policy, "get_base_model", lambda: policy)()
        # the copy's random initial weights are overwritten at once: they must not draw from the
        # trainer's RNG streams (a run with the copy samples what a run built without it would)
        with torch.random.fork_rng(devices=[policy.device] if policy.device.type == "cuda" else []):
            model = AutoModelForCausalLM.from_config(base.config, dtype=self.dtype)
        model.generation_config = base.generation_config
        return model.to(policy.device).eval().requires_grad_(False)

    @torch.no_grad()
    def _refresh(self, policy: torch.nn.Module) -> None:
        own = dict(self.model.named_parameters())
        filled = set()
        for name, weight in inference_weights(policy):
            if name not in own:
                raise ValueError(f"generation_dtype: the policy's weight {name} has no place in its "
                                 "generation copy (a model class transformers builds differently from its "
                                 "config)")
            own[name].copy_(weight)
            filled.add(name)
        missing = sorted(set(own) - filled)
        if missing:
            raise ValueError(f"generation_dtype: the generation copy's weights {missing[:3]} "
                             "are not in the policy")

    def step_record(self) -> dict[str, float]:
        """Seconds spent refreshing the copy since the last record (part of time_generate, or
        of the evaluation's time when it came first), under the vllm engine's name for the same."""
        record, self.refresh_seconds = {"weight_sync_seconds": self.refresh_seconds}, 0.0
        return record

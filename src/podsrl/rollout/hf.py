"""The ``hf`` engine (:class:`HFEngine`): Hugging Face ``generate`` on whole prompt groups,
n samples per prompt, group axis kept (:func:`generate`, also evaluation's sampler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers import DynamicCache

from podsrl.options import option
from podsrl.rollout.base import (
    MB,
    Capabilities,
    EngineOptions,
    MemoryCapOptions,
    Sampling,
    Stateless,
    Watcher,
    longest_prompt,
    megabytes,
    refuse_watchers,
    rows_within,
    to_rollouts,
)
from podsrl.rollout.generation_copy import COPY_DTYPES, GenerationCopy
from podsrl.rollout.memory import generation_memory_bytes
from podsrl.rollout.registries import ENGINES
from podsrl.types import Rollouts


@dataclass(frozen=True)
class HFOptions(MemoryCapOptions):
    """The ``hf`` engine's options (their flat config names: podsrl.options.flat_names). A call
    decodes the prompts it is given together, fewer groups at once under ``memory_mb``; the
    trainer's calls are already at most generation_batch_size sequences."""

    run_fields: ClassVar[frozenset[str]] = EngineOptions.run_fields | {"compute_dtype", "sharded", "compile_config"}

    share_prefill: bool = option(True, "Compute each prompt's KV cache once and copy it to its n samples (same "
                                       "samples, less prompt compute).")
    copy_dtype: str = option("auto", "hf engine: generate and evaluate from a copy of the policy in this dtype "
                                     "('bfloat16', 'float32'), LoRA merged, refreshed after every update; '' = from "
                                     "the policy; 'auto' = bfloat16 when the forward passes run in bfloat16 (bf16 or "
                                     "dtype bfloat16), else ''. The update is unchanged (generation.md).")
    static_cache: bool = option(False, "With a generation copy: transformers' static KV cache, its decode step "
                                       "compiled on GPUs once per batch shape; prefill then not shared.")
    # the policy's forward passes' dtype (bfloat16 under bf16 or bfloat16 weights)
    compute_dtype: str = "float32"
    sharded: bool = False  # FSDP: no process holds whole weights, so no copy
    compile_config: object = None  # static_cache: a transformers.CompileConfig (None = transformers' default)

    def copy(self) -> str:
        """The copy's dtype ('' = none). 'auto': bfloat16 where the policy computes in bfloat16,
        measured faster there; none in float32, where the copy gained nothing on the CPU and
        generating from the policy keeps samples exact (benchmarks/RESULTS.md, "The hf engine's
        generation copy (#39)"), and none under FSDP."""
        if self.copy_dtype != "auto":
            return self.copy_dtype
        return "bfloat16" if self.compute_dtype == "bfloat16" and not self.sharded else ""

    def check(self) -> None:
        if self.copy_dtype not in ("", "auto", *COPY_DTYPES):
            raise ValueError(f"generation_dtype: expected '', 'auto', {' or '.join(COPY_DTYPES)}, got "
                             f"{self.copy_dtype!r}")
        if self.sharded and self.copy_dtype not in ("", "auto"):
            raise ValueError("generation_dtype: the generation copy is not supported with FSDP (it is refreshed from "
                             "whole weights); use DDP, or generation_dtype auto (no copy under FSDP)")
        if self.static_cache and not self.copy():
            raise ValueError("generation_static_cache: needs a generation copy (generation_dtype bfloat16 or float32, "
                             "or auto with bf16): the static cache is compiled over the copy, whose weights are "
                             "refreshed in place")


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
# (prompt width + max_completion_length) and so the compiled decode step's shapes change only when the
# longest prompt crosses a multiple, not at every step.
STATIC_PROMPT_WIDTH_STEP = 64


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], num_samples: int, sampling: Sampling, *,
             share_prefill: bool = True, static_cache: bool = False, compile_config=None) -> Rollouts:
    """Sample ``num_samples`` completions per prompt as ``sampling`` says (greedy when its
    temperature is 0; ``sampling.batch_size`` bounds the sequences decoded at once, in whole
    prompt groups; 0 = all).

    Prompts are left-padded so every row's completion starts at the same column.
    Sampling draws from torch's global RNG: seed it (or save its state) for reproducibility.
    ``share_prefill`` computes each prompt's KV cache once for its n samples (PODS
    generates many rollouts per prompt, so the prompt would otherwise be paid n times).
    ``static_cache``: transformers' static KV cache, whose decode step transformers compiles on
    a GPU (``compile_config``: a ``transformers.CompileConfig``, None = its default); the prefill
    is then not shared (a static cache cannot be copied to n rows) and prompts are padded to a
    multiple of STATIC_PROMPT_WIDTH_STEP tokens, so the compiled shapes rarely change.
    """
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False,
                    pad_to_multiple_of=STATIC_PROMPT_WIDTH_STEP if static_cache else None)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]  # [P, Lp]
    num_prompts = len(prompts)
    batch_size = sampling.batch_size
    prompts_per_call = num_prompts if not batch_size else max(1, batch_size // num_samples)
    # transformers' generate keywords
    options = dict(do_sample=False) if sampling.temperature == 0 else dict(
        do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
    options["max_new_tokens"] = sampling.max_completion_length
    if sampling.min_completion_length:
        options["min_new_tokens"] = sampling.min_completion_length
    if static_cache:
        options.update(cache_implementation="static", compile_config=compile_config)
        share_prefill = False
    was_training = model.training
    model.eval()
    chunks = []
    for start in range(0, num_prompts, prompts_per_call):
        ids = prompt_ids[start:start + prompts_per_call].to(model.device)
        mask = prompt_mask[start:start + prompts_per_call].to(model.device)
        out = _generate_group(model, ids, mask, num_samples, share_prefill, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, **options)
        chunks.append(out[:, ids.shape[1]:].cpu())  # [p * n, <=max_completion_length]: rollouts live on the CPU
    model.train(was_training)
    width = max(c.shape[1] for c in chunks)
    completion_ids = torch.cat(
        [torch.nn.functional.pad(c, (0, width - c.shape[1]), value=tokenizer.pad_token_id)
         for c in chunks]).view(num_prompts, num_samples, width)  # [P, n, Lc]
    # the static cache's extra left padding: not the update's work
    prompt_width = int(prompt_mask.sum(dim=1).max())
    rollouts = to_rollouts(tokenizer, prompt_ids[:, -prompt_width:], prompt_mask[:, -prompt_width:], completion_ids)
    # the first token comes from the prefill
    rollouts.stats["decode_steps"] = sum(c.shape[1] - 1 for c in chunks)
    return rollouts


@ENGINES.register("hf")
class HFEngine(Stateless):
    """transformers ``generate`` on whole prompt groups; learns nothing across steps. With a
    copy (``HFOptions.copy()``) it generates (and evaluates, through :meth:`generate`) from a
    :class:`GenerationCopy` of the policy, refreshed when the policy changed."""

    name = "hf"
    capabilities = Capabilities()  # whole groups at once: nothing to cancel, no quota to stop at
    options_type = HFOptions

    def __init__(self, options: HFOptions) -> None:
        self.options = options
        copy_dtype = options.copy()
        self.copy = GenerationCopy(copy_dtype) if copy_dtype else None
        if self.copy is not None:  # only then: without a copy the run's metrics keep their fields
            self.step_record = self.copy.step_record

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 watchers: tuple[Watcher, ...] = ()) -> Rollouts:
        refuse_watchers(self, watchers)
        options = self.options
        batch_size = 0  # all at once
        if options.memory_mb:
            longest = longest_prompt(tokenizer, prompts)
            rows = rows_within(options, model, longest)
            if rows < num_samples:
                need = generation_memory_bytes(model.config, num_samples, longest + options.max_completion_length) / MB
                raise MemoryError(
                    f"generation_memory_mb: one prompt group of n={num_samples} needs ~{megabytes(need)} to decode at "
                    f"once, over the cap of {options.memory_mb:g} MB; use generation_engine: slots "
                    f"(decodes in micro-groups) or raise the cap")
            batch_size = rows
        return self.generate(model, tokenizer, prompts, num_samples, options.sampling(batch_size))

    def generate(self, model, tokenizer, prompts: list[str], num_samples: int, sampling: Sampling) -> Rollouts:
        """:func:`generate` from the copy when there is one, else from ``model``."""
        options = self.options
        if self.copy is None:
            return generate(model, tokenizer, prompts, num_samples, sampling, share_prefill=options.share_prefill)
        return generate(self.copy(model), tokenizer, prompts, num_samples, sampling,
                        share_prefill=options.share_prefill, static_cache=options.static_cache,
                        compile_config=options.compile_config)

"""What every generation engine shares: the :class:`GenerationEngine` protocol (its required
and optional members, and the capabilities it declares), the :data:`Stopper` early stop
calls, :func:`to_rollouts`, and the memory cap's arithmetic. One module per engine builds on
it: :mod:`podsrl.rollout.hf`, :mod:`podsrl.rollout.slots`, :mod:`podsrl.rollout.vllm`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol

import torch

from podsrl.options import NON_NEGATIVE, POSITIVE, Range, option
from podsrl.rollout.memory import generation_memory_bytes
from podsrl.types import Rollouts, completion_mask_from_eos

MB = 2**20

# stopper(prompt_indices [N], completion_ids [N] token lists up to and including EOS) -> the
# prompts whose groups are saturated after these N newly finished samples
Stopper = Callable[[list[int], list[list[int]]], list[int]]

@dataclass(frozen=True)
class EngineOptions:
    """What every engine samples with: the run sets these (from max_completion_length,
    temperature and top_p), a spec's arguments do not. An engine's own options subclass it in
    the engine's module (:class:`podsrl.rollout.slots.SlotsOptions`), each field an
    :func:`~podsrl.options.option` (its help text and range travel with it), and the engine
    names the class as its ``options_type``; ``generation_engine: {name: slots, micro_group: 8}``
    sets a field (checked in type and range at validation, before any model loads)."""

    # fields the run sets, never a spec's arguments (a subclass adds its own: ClassVar, not a field)
    run_fields: ClassVar[frozenset[str]] = frozenset({"max_new_tokens", "temperature", "top_p"})

    max_new_tokens: int = option(8, "Completion length cap in tokens.", POSITIVE)
    temperature: float = option(1.0, "Sampling temperature (0: greedy).", NON_NEGATIVE)
    top_p: float = option(1.0, "Nucleus sampling threshold.", Range(0, 1, low_closed=False))

    def check(self) -> None:
        """Rules among this engine's own options, one line naming the field (at validation)."""

    def early_stop_refusal(self) -> str:
        """Why group_early_stop cannot run with these options ('' = it can)."""
        return ""


# what an engine that does not declare a capability is taken to have: config checks read these
# from the engine's class, so a capability is tested, never an engine's name
CAPABILITIES = {
    "early_stop_refusal": "declares no early_stop_refusal ('' = it takes the stopper group_early_stop passes)",
    "needs_whole_weights": False,  # each process's engine needs the whole weights (refused under FSDP)
    # Rollouts.sampling_logp: what the vllm_importance_sampling_* correction reads
    "reports_sampling_logp": False,
    # its options class (an EngineOptions): which options it reads, and what a spec's arguments may set
    "options_type": EngineOptions,
    # check_prompts(options, model_config, longest_prompt): refuse, before any step, prompts it cannot take
    "check_prompts": None,
    # generate_partial(model, tokenizer, prompts, n, *, carried, quota, version, stopper) -> PartialGeneration:
    # partial rollouts (podsrl.rollout.partial); None: the engine cannot stop at a quota and resume samples
    "generate_partial": None,
}


def capability(engine, name: str):
    """``engine``'s (an engine, its class, or a bound spec's) declared capability ``name``."""
    return getattr(engine, name, CAPABILITIES[name])


def reads_option(engine, option_name: str) -> bool:
    """Whether ``engine``'s options class has the option ``option_name``."""
    return option_name in {f.name for f in dataclasses.fields(capability(engine, "options_type"))}


class GenerationEngine(Protocol):
    """What the trainer asks of an engine, built as ``engine(options)`` from its ``options_type``.
    The live policy is passed to every call, so an engine always generates with the current
    weights (one that keeps its own copy of them, as vLLM does, takes them from there when
    they changed).

    Capabilities, class attributes (:data:`CAPABILITIES`: what an engine that does not declare
    one is taken to have): ``early_stop_refusal`` (why it cannot take a ``stopper``; "" = it
    can), ``needs_whole_weights``, ``reports_sampling_logp``, ``options_type``, ``check_prompts``,
    ``generate_partial`` (partial rollouts: :mod:`podsrl.rollout.partial`).

    Optional members, used where present: ``generate(model, tokenizer, prompts, num_samples, *,
    max_new_tokens, temperature, top_p, batch_size)`` as :func:`podsrl.rollout.generate` takes them
    (evaluation's sampler: evaluation then runs on the engine, at its speed), ``step_record() ->
    dict[str, float]`` (its numbers for each step's metrics record), ``close()`` (called when the
    run ends, however it ends)."""

    early_stop_refusal: str
    needs_whole_weights: bool
    reports_sampling_logp: bool
    options_type: type[EngineOptions]

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 stopper: Stopper | None = None) -> Rollouts:
        """Rollouts [P, num_samples, Lc] for the P prompts, the group axis kept."""

    def state_dict(self) -> dict:
        """A snapshot (copies) of what it learned across steps: checkpointed."""

    def check_state(self, state: dict) -> None:
        """Raise ValueError if ``state`` cannot be loaded into this engine (checked before loading)."""

    def load_state_dict(self, state: dict) -> None: ...


class Stateless:
    """The state methods of an engine that learns nothing across steps (``name``: in the
    refusal of a checkpoint that holds state for it)."""

    name = "?"

    def state_dict(self) -> dict:
        return {}

    def check_state(self, state: dict) -> None:
        if state:
            raise ValueError(f"generation engine '{self.name}' keeps no state, "
                             f"the checkpoint has {sorted(state)}")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)


def early_stop_refusal(engine, name: str) -> str:
    """The one line refusing group_early_stop with ``engine`` (``name``: as the config names it),
    "" when it takes a stopper. An engine that declares nothing is named: the line is about it."""
    refusal = capability(engine, "early_stop_refusal")
    if refusal and not hasattr(engine, "early_stop_refusal"):
        return (f"generation_engine: {name} {refusal}; "
                "group_early_stop needs an engine that stops groups early")
    return f"group_early_stop: {refusal}" if refusal else ""


def refuse_early_stop(engine, stopper: Stopper | None) -> None:
    """The one refusal of a stopper by an engine that cannot stop groups early (the config
    check refuses the combination first; this guards a direct call)."""
    refusal = early_stop_refusal(engine, getattr(engine, "name", type(engine).__name__))
    if stopper is not None and refusal:
        raise ValueError(refusal)


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


def longest_prompt(tokenizer, prompts: list[str]) -> int:
    return max(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])


def megabytes(value: float) -> str:
    """A memory estimate in MB readable at any size: '1234 MB', '12.3 MB', '0.0119 MB' (never '0 MB')."""
    return f"{value:.0f} MB" if value >= 100 else f"{value:.3g} MB"


def rows_within(options, model, prompt_len: int, prompts: int = 0, stored_prompt_len: int = 0,
                stored_tokens: int = 0) -> int:
    """Most sequences decoded at once whose estimated memory fits ``options.memory_mb``."""
    seq_len = prompt_len + options.max_new_tokens
    fixed = generation_memory_bytes(model.config, 0, seq_len, prompts, stored_prompt_len, stored_tokens)
    per_row = generation_memory_bytes(model.config, 1, seq_len)
    return max(0, int((options.memory_mb * MB - fixed) // per_row))

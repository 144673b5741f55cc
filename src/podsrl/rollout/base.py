"""What every generation engine shares: the :class:`GenerationEngine` protocol, the
:class:`Capabilities` an engine declares once, the :class:`Watcher` hook through which what
watches generation reaches an engine, :func:`to_rollouts`, and the memory cap's arithmetic. One
module per engine builds on it: :mod:`podsrl.rollout.hf`, :mod:`podsrl.rollout.slots`,
:mod:`podsrl.rollout.vllm`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from podsrl.options import Range, option
from podsrl.rollout.memory import generation_memory_bytes
from podsrl.types import Rollouts, completion_mask_from_eos

MB = 2**20

# The watcher kinds podsrl's engines run (an engine may declare kinds of its own: a kind is the
# contract between a watcher and the engines that declare it).
# shown samples as they finish; names groups whose unstarted samples are cancelled
STOP_GROUPS = "stop_groups"
# shown running samples at the lengths it asks for, with their pooled hidden states; names running samples to
# stop (podsrl.rollout.running_watch)
PRUNE_RUNNING = "prune_running"
# the methods each kind's watcher has besides __call__, which the engine calls (a user's watcher is
# held to them: podsrl.rollout.registries.CheckedWatcher)
KIND_METHODS = {STOP_GROUPS: (), PRUNE_RUNNING: ("lengths",)}


class Watcher(Protocol):
    """What watches a generation call's samples as they are generated: one per call, built by
    its factory for the call's prompts. ``kind`` names the contract it keeps with an engine, and
    an engine runs only the kinds its :class:`Capabilities` declare (the config refuses the
    rest in one line, before any model loads).

    Kind ``stop_groups`` (early stop, ``group_early_stop``; a user's own rule through
    ``generation_watchers``): called with the samples finished since its last call, prompt
    indices [N] among the call's prompts and their token lists up to and including EOS; returns
    the prompts whose groups need no more samples. The engine cancels those groups' samples that
    have not started (those running are decoded to the end; see
    :meth:`podsrl.rollout.slot_decoder.SlotDecoder.stop_saturated`).

    Kind ``prune_running`` (#72; at most one a call): ``lengths(prompt)`` gives the completion
    lengths at which it is shown a running sample of that prompt, and it is called with the
    samples that reached one, their lengths and pooled hidden states and every running sample,
    returning samples to stop: running ones stop at once, unstarted ones never start
    (:mod:`podsrl.rollout.running_watch`)."""

    kind: ClassVar[str]

    def __call__(self, prompt_index: list[int], completion_ids: list[list[int]]) -> list[int]: ...


def group_stopper(watchers: tuple[Watcher, ...]) -> Watcher | None:
    """A call's ``stop_groups`` watchers as one, or None when it has none."""
    chosen = tuple(watcher for watcher in watchers if watcher.kind == STOP_GROUPS)
    if len(chosen) < 2:
        return chosen[0] if chosen else None
    return StopGroupsTogether(chosen)


def running_watcher(watchers: tuple[Watcher, ...]) -> Watcher | None:
    """A call's ``prune_running`` watcher, or None (two would each stop what the other keeps: refused)."""
    chosen = [watcher for watcher in watchers if watcher.kind == PRUNE_RUNNING]
    if len(chosen) > 1:
        raise ValueError(f"generation_watchers: {len(chosen)} watchers of kind {PRUNE_RUNNING}; a call runs "
                         "one")
    return chosen[0] if chosen else None


@dataclass(frozen=True)
class StopGroupsTogether:
    """``stop_groups`` watchers as one: each sees every report; the prompts any names, once, in order."""

    watchers: tuple[Watcher, ...]
    kind: ClassVar[str] = STOP_GROUPS

    def __call__(self, prompt_index: list[int], completion_ids: list[list[int]]) -> list[int]:
        return sorted({prompt for watcher in self.watchers
                       for prompt in watcher(prompt_index, completion_ids)})


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared once as its class attribute ``capabilities``; an engine
    that declares none can do none of it. Config checks read this (and the engine's options),
    never an engine's name, so a user's engine is held to the same rules as the built-ins."""

    watches: frozenset[str] = frozenset()  # the watcher kinds it runs (Watcher.kind)
    # partial rollouts (podsrl.rollout.partial): its call takes partial=PartialCall(carried, quota, version)
    # and returns a PartialGeneration, stopping at a quota of complete groups and resuming samples
    partial_rollouts: bool = False
    needs_whole_weights: bool = False  # each process's engine needs the whole weights (refused under FSDP)
    # Rollouts.sampling_logp: what the vllm_importance_sampling_* correction reads
    reports_sampling_logp: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "watches", frozenset(self.watches))

    def declared_kinds(self) -> str:
        """The watcher kinds it runs, as a refusal lists them."""
        return ", ".join(sorted(self.watches)) or "none"


# what earlier versions had engines declare one attribute each: now fields of Capabilities
FORMER_CAPABILITIES = ("early_stop_refusal", "needs_whole_weights", "reports_sampling_logp")


def capabilities(engine, label: str = "") -> Capabilities:
    """``engine``'s (an engine, its class, or a bound spec's) declared :class:`Capabilities`;
    a one-line error naming it (``label``: as the config names it) when the declaration is not one."""
    label = label or getattr(engine, "name", None) or getattr(engine, "__name__", type(engine).__name__)
    former = [name for name in FORMER_CAPABILITIES if hasattr(engine, name)]
    if former:
        raise ValueError(f"generation_engine: {label} declares {', '.join(former)} as attributes; declare "
                         f"capabilities = podsrl.rollout.Capabilities(...) instead (docs/generation.md)")
    declared = getattr(engine, "capabilities", Capabilities())
    if not isinstance(declared, Capabilities):
        raise ValueError(f"generation_engine: {label}.capabilities is a {type(declared).__name__}, expected "
                         f"podsrl.rollout.Capabilities")
    return declared


def options_class(engine) -> type:
    """``engine``'s options class (its ``options_type``, an :class:`EngineOptions`): which
    options it reads, and what a spec's arguments may set."""
    return getattr(engine, "options_type", EngineOptions)


def refuse_watchers(engine, watchers: tuple) -> None:
    """The one refusal of watchers of kinds ``engine`` does not declare (the config check
    refuses the combination first; this guards a direct call)."""
    declared = capabilities(engine)
    unknown = sorted({watcher.kind for watcher in watchers} - declared.watches)
    if unknown:
        name = getattr(engine, "name", type(engine).__name__)
        raise ValueError(f"generation_engine {name} runs no watcher of kind {', '.join(unknown)} (it "
                         f"declares {declared.declared_kinds()})")


@dataclass(frozen=True)
class Sampling:
    """How one generation call samples: what evaluation asks of an engine's ``generate``
    (:class:`GenerationEngine`), and what an engine's options hand its own sampler
    (:meth:`EngineOptions.sampling`)."""

    max_completion_length: int  # tokens per completion, at most
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    batch_size: int = 0  # sequences decoded at once, at most (0: the engine's own choice)
    # no EOS before this many tokens (benchmarks force every row to one length)
    min_completion_length: int = 0


@dataclass(frozen=True)
class EngineOptions:
    """What every engine samples with: the run sets these (from max_completion_length,
    temperature and top_p), a spec's arguments do not. An engine's own options subclass it in
    the engine's module (:class:`podsrl.rollout.slots.SlotsOptions`), each field an
    :func:`~podsrl.options.option` (its help text and range travel with it), and the engine
    names the class as its ``options_type``; ``generation_engine: {name: slots, micro_group: 8}``
    sets a field (checked in type and range at validation, before any model loads)."""

    # fields the run sets, never a spec's arguments (a subclass adds its own: ClassVar, not a field)
    run_fields: ClassVar[frozenset[str]] = frozenset({"max_completion_length", "temperature", "top_p"})

    # the config's settings of these names (declared there), checked before they reach an engine
    max_completion_length: int = 8  # tokens per completion, at most
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0

    def check(self) -> None:
        """Rules among this engine's own options, one line naming the field (at validation)."""

    def sampling(self, batch_size: int = 0) -> Sampling:
        """How the run's calls sample, ``batch_size`` sequences at once (0: the engine's choice)."""
        return Sampling(self.max_completion_length, self.temperature, self.top_p, batch_size)

    def sampled(self, sampling: Sampling):
        """These options sampling as ``sampling`` does (its length, temperature and top_p)."""
        return dataclasses.replace(self, max_completion_length=sampling.max_completion_length,
                                   temperature=sampling.temperature, top_p=sampling.top_p)

    def watch_refusal(self, kind: str) -> str:
        """Why a watcher of ``kind`` (one the engine declares) cannot run with these options ('' = it can)."""
        return ""


@dataclass(frozen=True)
class MemoryCapOptions(EngineOptions):
    """Options of an engine that sizes what it decodes at once to a memory cap (hf, slots: the
    config's generation_memory_mb); vLLM sizes its own KV cache."""

    memory_mb: float = option(0.0, "Cap on the estimated memory of what is decoded at once (KV cache and "
                                   "logits, MiB; 0 = none): hf decodes fewer groups together and fails if "
                                   "one group exceeds it; slots sizes g to fit.", Range(0, why="0 = no cap"))


def reads_option(engine, option_name: str) -> bool:
    """Whether ``engine``'s options class has the option ``option_name``."""
    return option_name in {f.name for f in dataclasses.fields(options_class(engine))}


class GenerationEngine(Protocol):
    """What the trainer asks of an engine, built as ``engine(options)`` from its ``options_type``.
    The live policy is passed to every call, so an engine always generates with the current
    weights (one that keeps its own copy of them, as vLLM does, takes them from there when
    they changed). ``watchers``: this call's :class:`Watcher` objects, of the kinds its
    ``capabilities`` declare.

    Class attributes: ``capabilities`` (:class:`Capabilities`), ``options_type``. Optional
    members, used where present: ``check_prompts(options, model_config, longest_prompt)``
    (refuse, before any step, prompts it cannot take),
    ``generate(model, tokenizer, prompts, num_samples, sampling)``
    (a :class:`Sampling`; evaluation's sampler, as :func:`podsrl.rollout.generate`: evaluation
    then runs on the engine, at its speed),
    ``step_record() -> dict[str, float]`` (its numbers for each step's metrics record),
    ``close()`` (called when the run ends, however it ends)."""

    capabilities: Capabilities
    options_type: type[EngineOptions]

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 watchers: tuple[Watcher, ...] = ()) -> Rollouts:
        """Rollouts [P, num_samples, Lc] for the P prompts, the group axis kept. The one call: an
        engine that declares ``Capabilities.partial_rollouts`` also takes ``partial``, a
        :class:`~podsrl.rollout.partial.PartialCall` (None: every group wanted), and given one
        returns a :class:`~podsrl.rollout.partial.PartialGeneration` of the ``quota`` groups
        complete first and the rest to carry."""

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


def to_rollouts(tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                completion_ids: torch.Tensor, generated: torch.Tensor | None = None) -> Rollouts:
    """Rollouts from generated tokens [P, n, Lc] (anything after a row's first EOS is ignored);
    ``generated`` [P, n]: False for samples never generated (masked out entirely)."""
    num_prompts, num_samples, width = completion_ids.shape
    completion_mask = completion_mask_from_eos(completion_ids, tokenizer.eos_token_id)
    if generated is not None:
        completion_mask = completion_mask * generated.unsqueeze(-1)  # [P, n, Lc]
    # [P * n, Lc]; Lc may be 0 (every sample stopped before its first token was kept)
    rows = zip(completion_ids.reshape(num_prompts * num_samples, width).tolist(),
               completion_mask.reshape(num_prompts * num_samples, width).tolist())
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
    """Most sequences decoded at once whose estimated memory fits ``options.memory_mb``
    (:class:`MemoryCapOptions`)."""
    seq_len = prompt_len + options.max_completion_length
    fixed = generation_memory_bytes(model.config, 0, seq_len, prompts, stored_prompt_len, stored_tokens)
    per_row = generation_memory_bytes(model.config, 1, seq_len)
    return max(0, int((options.memory_mb * MB - fixed) // per_row))

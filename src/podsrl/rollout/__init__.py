"""The generate stage: prompts [P] -> Rollouts [P, n, Lc], by an engine registered by name.

``ENGINES.resolve(name)(options)`` builds an engine once per run from :class:`GenerationOptions`
(a registered name, or ``module:Class`` / ``file.py:Class``: :mod:`podsrl.registry`);
an engine is ``engine(model, tokenizer, prompts, num_samples, stopper=None) -> Rollouts``
with the group axis kept (``stopper``: early stop of saturated groups, ``slots`` only),
plus ``state_dict()`` (a snapshot: copies, not live references) / ``load_state_dict()`` /
``check_state()`` for what it learns across steps (checkpointed, so a resumed run generates
exactly what an uninterrupted one would). Both engines honour ``memory_mb``, a cap on the estimated memory
of what is decoded at once (:func:`podsrl.rollout.memory.generation_memory_bytes`).

- ``hf``: transformers ``generate`` on whole prompt groups (with the prompt prefill shared);
  the cap bounds how many groups are decoded together, and a single group that does not fit
  is an error. ``copy_dtype``: from a copy of the policy in that dtype with LoRA merged
  (:mod:`podsrl.rollout.generation_copy`), optionally with a static, compiled KV cache.
- ``slots``: podsrl's own decoder with a bounded number of slots (micro-groups, continuous
  refill, length-aware scheduling), so n is not bounded by memory.
- ``vllm``: a vLLM engine in the training process, fed the policy's weights when they
  change (:mod:`podsrl.rollout.vllm`); it reports its own log-probs of the sampled tokens
  (``Rollouts.sampling_logp``). Not bound by ``memory_mb``: vLLM sizes its own KV cache.

An engine may also have ``close()`` (called when the run ends, however it ends) and a
``generate`` with the signature of :func:`generate`, which evaluation then uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from podsrl.contracts import broken, calling
from podsrl.registry import Registry
from podsrl.rollout.generation_copy import GenerationCopy
from podsrl.rollout.hf import generate, to_rollouts
from podsrl.rollout.memory import generation_memory_bytes
from podsrl.rollout.schedule import REFILLS, SCHEDULES, LengthPredictor, PrefixLengthPredictor, Schedule
from podsrl.rollout.slots import Stopper, generate_in_slots
from podsrl.rollout.vllm import VLLMEngine, VLLMOptions
from podsrl.types import Rollouts

MB = 2**20


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int = 8  # completion length cap in tokens
    temperature: float = 1.0
    top_p: float = 1.0
    memory_mb: float = 0.0  # cap on the estimated memory of what is decoded at once (0 = none)
    batch_size: int = 0  # hf: sequences decoded at once, in whole prompt groups (0 = all)
    share_prefill: bool = True  # hf: each prompt's KV cache computed once for its n samples
    micro_group: int = 0  # slots: sequences decoded at once (0 = what memory_mb allows, or all)
    refill: str = "continuous"  # slots: "continuous" or "group"
    schedule: str = "fifo"  # slots: a name in SCHEDULES, or module:Schedule
    probe_tokens: int = 4  # slots, schedule length_aware: tokens decoded before the length prediction
    vllm: VLLMOptions = VLLMOptions()  # vllm: how the engine is built
    copy_dtype: str = ""  # hf: generate from a copy in this dtype with LoRA merged ('' = from the policy)
    static_cache: bool = False  # hf, with a copy: transformers' static KV cache (its decode step compiled on GPUs)
    compile_config: object = None  # static_cache: a transformers.CompileConfig (None = transformers' default)


class GenerationEngine(Protocol):
    """What the trainer asks of an engine. The live policy is passed to every call, so an
    engine always generates with the current weights (one that keeps its own copy of them, as
    vLLM does, takes them from there when they changed)."""

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 stopper: Stopper | None = None) -> Rollouts:
        """Rollouts [P, num_samples, Lc] for the P prompts, the group axis kept."""

    def state_dict(self) -> dict:
        """A snapshot (copies) of what it learned across steps: checkpointed."""

    def check_state(self, state: dict) -> None:
        """Raise ValueError if ``state`` cannot be loaded into this engine (checked before loading)."""

    def load_state_dict(self, state: dict) -> None: ...


def _longest_prompt(tokenizer, prompts: list[str]) -> int:
    return max(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])


def _rows_within(options: GenerationOptions, model, prompt_len: int, prompts: int = 0,
                 stored_prompt_len: int = 0, stored_tokens: int = 0) -> int:
    """Most sequences decoded at once whose estimated memory fits ``memory_mb``."""
    seq_len = prompt_len + options.max_new_tokens
    fixed = generation_memory_bytes(model.config, 0, seq_len, prompts, stored_prompt_len, stored_tokens)
    per_row = generation_memory_bytes(model.config, 1, seq_len)
    return max(0, int((options.memory_mb * MB - fixed) // per_row))


class HFEngine:
    """transformers ``generate`` on whole prompt groups; learns nothing across steps. With
    ``copy_dtype`` it generates (and evaluates, through :meth:`generate`) from a
    :class:`GenerationCopy` of the policy, refreshed when the policy changed."""

    def __init__(self, options: GenerationOptions) -> None:
        self.options = options
        self.copy = GenerationCopy(options.copy_dtype) if options.copy_dtype else None
        if self.copy is not None:  # only then: without a copy the run's metrics keep their fields
            self.step_record = self.copy.step_record

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 stopper: Stopper | None = None) -> Rollouts:
        if stopper is not None:
            raise ValueError("group_early_stop: the 'hf' engine generates whole groups at once; use "
                             "generation_engine: slots")
        options = self.options
        batch_size = options.batch_size or None
        if options.memory_mb:
            longest = _longest_prompt(tokenizer, prompts)
            rows = _rows_within(options, model, longest)
            if rows < num_samples:
                need = generation_memory_bytes(model.config, num_samples, longest + options.max_new_tokens) / MB
                raise MemoryError(
                    f"generation_memory_mb: one prompt group of n={num_samples} needs ~{need:.0f} MB to decode at "
                    f"once, over the cap of {options.memory_mb:g} MB; use generation_engine: slots "
                    f"(decodes in micro-groups) or raise the cap")
            batch_size = min(batch_size or rows, rows)
        return self.generate(model, tokenizer, prompts, num_samples, max_new_tokens=options.max_new_tokens,
                             temperature=options.temperature, top_p=options.top_p, batch_size=batch_size,
                             share_prefill=options.share_prefill)

    def generate(self, model, tokenizer, prompts: list[str], num_samples: int, **sampling) -> Rollouts:
        """:func:`generate` (same arguments) from the copy when there is one, else from ``model``."""
        if self.copy is None:
            return generate(model, tokenizer, prompts, num_samples, **sampling)
        return generate(self.copy(model), tokenizer, prompts, num_samples, static_cache=self.options.static_cache,
                        compile_config=self.options.compile_config, **sampling)

    def state_dict(self) -> dict:
        return {}

    def check_state(self, state: dict) -> None:
        if state:
            raise ValueError(f"generation engine 'hf' keeps no state, the checkpoint has {sorted(state)}")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)


class SlotsEngine:
    """Decoding slots refilled sample by sample (:func:`generate_in_slots`); with a
    length-aware schedule it carries a completion-length predictor learned across steps."""

    def __init__(self, options: GenerationOptions) -> None:
        self.options = options
        self.schedule = SCHEDULES.resolve(options.schedule)
        self.predictor = self.schedule.new_predictor()

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 stopper: Stopper | None = None) -> Rollouts:
        options = self.options
        slots = options.micro_group
        if options.memory_mb:
            longest = _longest_prompt(tokenizer, prompts)
            probe = options.probe_tokens - 1 if self.schedule.plans_lanes else 0
            rows = _rows_within(options, model, longest, prompts=len(prompts), stored_prompt_len=longest,
                                stored_tokens=len(prompts) * num_samples * probe)
            if rows < 1 or (slots and slots > rows):
                raise MemoryError(
                    f"generation_memory_mb: {slots or 1} decoding slot(s) need more than the cap of "
                    f"{options.memory_mb:g} MB (fits {rows}); lower generation_micro_group or raise the cap")
            slots = slots or rows
        return generate_in_slots(model, tokenizer, prompts, num_samples, max_new_tokens=options.max_new_tokens,
                                 temperature=options.temperature, top_p=options.top_p, slots=slots,
                                 refill=options.refill, schedule=self.schedule, predictor=self.predictor,
                                 stopper=stopper, probe_tokens=options.probe_tokens)

    def state_dict(self) -> dict:
        return {"length_predictor": self.predictor.state_dict()} if self.predictor is not None else {}

    def check_state(self, state: dict) -> None:
        if set(state) != set(self.state_dict()):
            raise ValueError(f"generation engine 'slots' with schedule {self.options.schedule!r} keeps "
                             f"{sorted(self.state_dict()) or 'no state'}, the checkpoint has {sorted(state) or 'none'}")
        if self.predictor is not None:
            self.predictor.check_state(state["length_predictor"])

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        if self.predictor is not None:
            self.predictor.load_state_dict(state["length_predictor"])


class CheckedEngine:
    """A user's engine held to its contract (:mod:`podsrl.contracts`): each call can be stopped,
    fails in one line naming it, and must return :class:`Rollouts` [P, num_samples, Lc] for its
    P prompts; everything else (``state_dict``, ``close``, ``generate``, ...) is the engine's."""

    def __init__(self, inner, field: str, spec: str) -> None:
        for method in ("state_dict", "load_state_dict", "check_state"):
            if not callable(getattr(inner, method, None)):
                raise ValueError(f"{field}: {spec} has no method {method}() (see podsrl.rollout.GenerationEngine)")
        self.inner, self.field, self.spec = inner, field, spec

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 stopper: Stopper | None = None) -> Rollouts:
        with calling(self.field, self.spec):
            rollouts = self.inner(model, tokenizer, prompts, num_samples, stopper=stopper)
        if not isinstance(rollouts, Rollouts):
            raise broken(self.field, self.spec, f"a {type(rollouts).__name__}, expected podsrl.types.Rollouts")
        expected = (len(prompts), num_samples)
        for name in ("completion_ids", "completion_mask"):
            shape = tuple(getattr(rollouts, name).shape)
            if shape[:2] != expected or len(shape) != 3:
                raise broken(self.field, self.spec, f"{name} of shape {list(shape)}, expected [{expected[0]}, "
                                                    f"{expected[1]}, Lc] ({expected[0]} prompts x {expected[1]})")
        if rollouts.prompt_ids.dim() != 2 or rollouts.prompt_ids.shape[0] != len(prompts):
            raise broken(self.field, self.spec, f"prompt_ids of shape {list(rollouts.prompt_ids.shape)}, "
                                                f"expected [{len(prompts)}, Lp]")
        return rollouts

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def checked_engine(value, args: tuple, field: str, spec: str):
    """The registry's contract for engines: a user's engine gets a :class:`CheckedEngine`."""
    return value if type(value) in (HFEngine, SlotsEngine, VLLMEngine) else CheckedEngine(value, field, spec)


ENGINES = Registry("engine", "generation_engine", {"hf": HFEngine, "slots": SlotsEngine, "vllm": VLLMEngine},
                   takes="(options)", arity=1, check_output=checked_engine)

__all__ = ["ENGINES", "REFILLS", "SCHEDULES", "GenerationCopy", "GenerationEngine", "GenerationOptions", "HFEngine",
           "LengthPredictor", "PrefixLengthPredictor", "Schedule", "SlotsEngine", "Stopper", "VLLMEngine",
           "VLLMOptions", "generate", "generate_in_slots", "generation_memory_bytes", "to_rollouts"]

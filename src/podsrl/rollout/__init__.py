"""The generate stage: prompts [P] -> Rollouts [P, n, Lc], by an engine registered by name.

``ENGINES.resolve(name)(options)`` builds an engine once per run from :class:`GenerationOptions`
(a registered name, or ``module:Class`` / ``file.py:Class``: :mod:`podsrl.registry`);
an engine is ``engine(model, tokenizer, prompts, num_samples, stopper=None) -> Rollouts``
with the group axis kept (``stopper``: early stop of saturated groups), plus ``state_dict()``
(a snapshot: copies, not live references) / ``load_state_dict()`` / ``check_state()`` for
what it learns across steps (checkpointed, so a resumed run generates exactly what an
uninterrupted one would), and the capabilities it declares: the protocol is
:class:`podsrl.rollout.base.GenerationEngine`. The ``hf`` and ``slots`` engines honour
``memory_mb``, a cap on the estimated memory of what is decoded at once
(:func:`podsrl.rollout.memory.generation_memory_bytes`). One module per engine:

- ``hf`` (:mod:`podsrl.rollout.hf`): transformers ``generate`` on whole prompt groups (with the prompt prefill shared);
  the cap bounds how many groups are decoded together, and a single group that does not fit
  is an error. ``copy_dtype``: from a copy of the policy in that dtype with LoRA merged
  (:mod:`podsrl.rollout.generation_copy`), optionally with a static, compiled KV cache.
- ``slots`` (:mod:`podsrl.rollout.slots`): podsrl's own decoder with a bounded number of slots (micro-groups, continuous
  refill, length-aware scheduling), so n is not bounded by memory.
- ``vllm`` (:mod:`podsrl.rollout.vllm`): a vLLM engine in the training process, fed the policy's weights when they
  change (:mod:`podsrl.rollout.vllm`); it reports its own log-probs of the sampled tokens
  (``Rollouts.sampling_logp``). Not bound by ``memory_mb``: vLLM sizes its own KV cache.

An engine may also have ``close()``, ``step_record()`` and a ``generate`` with the signature
of :func:`generate`, which evaluation then uses (:class:`~podsrl.rollout.base.GenerationEngine`).
"""

from __future__ import annotations

from dataclasses import dataclass

from podsrl.contracts import broken, calling
from podsrl.registry import Registry
from podsrl.rollout.base import GenerationEngine, Stopper, capability, early_stop_refusal, to_rollouts
from podsrl.rollout.generation_copy import GenerationCopy
from podsrl.rollout.hf import HFEngine, generate
from podsrl.rollout.memory import generation_memory_bytes
from podsrl.rollout.schedule import REFILLS, SCHEDULES, LengthPredictor, PrefixLengthPredictor, Schedule
from podsrl.rollout.slots import SlotsEngine, generate_in_slots
from podsrl.rollout.vllm import VLLMEngine, VLLMOptions
from podsrl.types import Rollouts


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
           "VLLMOptions", "capability", "early_stop_refusal", "generate", "generate_in_slots",
           "generation_memory_bytes", "to_rollouts"]

"""The generate stage: prompts [P] -> Rollouts [P, n, Lc], by an engine registered by name.

``ENGINES.resolve(spec)(options)`` builds an engine once per run from its own options class
(:func:`engine_options`; a registered name, or ``module:Class`` / ``file.py:Class``, or a mapping
of one and options to set: :mod:`podsrl.registry`);
an engine is ``engine(model, tokenizer, prompts, num_samples, watchers=()) -> Rollouts``
with the group axis kept (``watchers``: what watches the call's samples, :class:`Watcher`, of
the kinds its :class:`Capabilities` declare), plus ``state_dict()``
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

The registries and the contracts a user's engine and watchers are held to:
:mod:`podsrl.rollout.registries`. An engine may also have ``close()``, ``step_record()`` and a
``generate`` with the signature of :func:`generate`, which evaluation then uses
(:class:`~podsrl.rollout.base.GenerationEngine`).

The engines' parts:

- :mod:`~podsrl.rollout.base`: the engine protocol, :class:`Capabilities`, the :class:`Watcher` hook
- :mod:`~podsrl.rollout.memory`: estimated generation memory (``memory_mb``)
- :mod:`~podsrl.rollout.generation_copy`: a copy of the policy to generate from (LoRA merged)
- :mod:`~podsrl.rollout.partial`: what a call with a quota of complete groups hands back and is handed
- :mod:`~podsrl.rollout.slot_decoder`: the slots engine's decoder; its cache rows
  (:mod:`~podsrl.rollout.kv_rows`, :mod:`~podsrl.rollout.decode_step`), token sampling
  (:mod:`~podsrl.rollout.sampling`), which sample starts next (:mod:`~podsrl.rollout.schedule`,
  :mod:`~podsrl.rollout.lanes`) and what it keeps for a watcher of running samples
  (:mod:`~podsrl.rollout.running_watch`)
- :mod:`~podsrl.rollout.vllm_partial`: partial rollouts on the vllm engine; its weights
  (:mod:`~podsrl.rollout.weights`), config folders (:mod:`~podsrl.rollout.vllm_folders`) and
  expected log records (:mod:`~podsrl.rollout.vllm_logs`)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from podsrl.rollout.base import (
    KIND_METHODS,
    PRUNE_RUNNING,
    STOP_GROUPS,
    Capabilities,
    EngineOptions,
    GenerationEngine,
    MemoryCapOptions,
    Sampling,
    Watcher,
    capabilities,
    options_class,
    reads_option,
    to_rollouts,
)
from podsrl.rollout.generation_copy import GenerationCopy
from podsrl.rollout.hf import HFEngine, HFOptions, generate
from podsrl.rollout.memory import generation_memory_bytes
from podsrl.rollout.registries import ENGINES, WATCHERS, CheckedEngine, CheckedWatcher, WatcherFactory, watcher_kind
from podsrl.rollout.schedule import REFILLS, SCHEDULES, LengthPredictor, PrefixLengthPredictor, Schedule
from podsrl.rollout.slots import SlotsEngine, SlotsOptions, generate_in_slots
from podsrl.rollout.vllm import VLLMEngine, VLLMOptions


def engine_options(engine, flat: Mapping[str, Any], run: Mapping[str, Any]) -> EngineOptions:
    """The options ``engine`` (``ENGINES.resolve(spec)``) is built with: its ``options_type``
    filled from the config's ``flat`` values (by option name: the config's generation_* and TRL's
    vllm_* fields, each setting the option it spells in whichever engine's class has it,
    podsrl.options.flat_names) and the ``run``'s own values (max_completion_length, temperature,
    ...: each taken where the class has the field), then the spec's arguments over them (checked
    when the spec was resolved: ``{name: vllm, gpu_memory_utilization: 0.5}`` wins over
    vllm_gpu_memory_utilization)."""
    options_type = options_class(engine)
    names = {f.name for f in dataclasses.fields(options_type) if f.init}
    values = {option: value for option, value in flat.items() if option in names}
    values.update((name, value) for name, value in run.items() if name in names)
    return dataclasses.replace(options_type(**values), **getattr(engine, "fields", {}))


__all__ = ["Capabilities", "CheckedEngine", "CheckedWatcher", "ENGINES", "EngineOptions",
           "GenerationCopy", "GenerationEngine", "HFEngine", "HFOptions", "KIND_METHODS", "LengthPredictor",
           "MemoryCapOptions", "PRUNE_RUNNING", "PrefixLengthPredictor", "REFILLS", "SCHEDULES",
           "STOP_GROUPS", "Sampling", "Schedule",
           "SlotsEngine", "SlotsOptions", "VLLMEngine", "VLLMOptions", "WATCHERS", "Watcher", "WatcherFactory",
           "capabilities", "engine_options", "generate", "generate_in_slots", "generation_memory_bytes",
           "options_class", "reads_option", "to_rollouts", "watcher_kind"]

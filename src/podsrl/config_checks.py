"""Validation of a :class:`podsrl.trainer.config.Config`: every field against its registry or range,
and the combinations that cannot work, before any work; each error names the field.

``cfg`` is a :class:`podsrl.trainer.config.Config` throughout (not annotated: ``podsrl.trainer.config``
imports this module and re-exports ``validate``; kept apart so the field list stays readable).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path

from podsrl.algorithms.advantages import ADVANTAGES
from podsrl.algorithms.importance import SAMPLER_CORRECTION_MODES
from podsrl.algorithms.loss import LOSSES
from podsrl.algorithms.select import RULES
from podsrl.config_layouts import former_layout_refusal
from podsrl.methods import METHODS
from podsrl.models import check_model_name
from podsrl.models.loading import check_dtype
from podsrl.options import bind, check_numbers, flat_names
from podsrl.prompt_selection import PROMPT_SELECTORS
from podsrl.registry import component_label, spec_parts
from podsrl.rewards import REWARDS, load_reward_fn
from podsrl.rollout import (
    ENGINES,
    KIND_METHODS,
    PRUNE_RUNNING,
    SCHEDULES,
    STOP_GROUPS,
    WATCHERS,
    Capabilities,
    EngineOptions,
    capabilities,
    reads_option,
    watcher_kind,
)
from podsrl.tasks import TASKS, TaskOptions, check_task_options, is_known_task
from podsrl.tasks.data import is_local
from podsrl.tracking import tracker_names

# the fields that name a component, each by its registry: a name / module:function, or a mapping
# {name: ..., argument: value} whose arguments are bound (podsrl.registry; docs/algorithms.md)
COMPONENTS = {registry.field: registry for registry in (RULES, ADVANTAGES, LOSSES, ENGINES, SCHEDULES, TASKS, REWARDS,
                                                        PROMPT_SELECTORS, WATCHERS)}


# vLLM's importance-sampling correction: read where the engine reports its own sampling log-probs
SAMPLER_FIELDS = ("vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                  "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min")


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def parse_component(name: str, raw, source: str = ""):
    """A component field's value in mapping form (or its JSON text, as the command line gives
    it) as the config stores it; None for any other value or field (text, as before)."""
    registry = COMPONENTS.get(name)
    return None if registry is None else registry.parse(raw, source)


def validate(cfg) -> None:
    """Reject invalid values and combinations before any work, naming the field: numbers
    first (types, finiteness and ranges: podsrl.options, each field's range), then names, data and
    combinations."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    refusal = former_layout_refusal({name: getattr(cfg, name) for name, default in defaults.items()
                                     if getattr(cfg, name) != default}, defaults)
    require(not refusal, refusal)
    check_numbers(cfg)
    _check_owners(cfg)
    engine = _check_names(cfg)
    _check_data(cfg)
    _check_combinations(cfg, engine)


def _check_owners(cfg) -> None:
    """Each job's options that the config composes check their own rules (an options class's
    ``check()``, on its fields bound from the config), before anything spanning them."""
    for owner in type(cfg).__mro__[1:]:
        if dataclasses.is_dataclass(owner) and "check" in vars(owner):
            bind(owner, cfg).check()


class ConfiguredEngine:
    """The run's engine as the checks read it, its spec resolved once per validation: its label (as
    the config names it), the resolved spec, and on first use its declared capabilities (a check
    that needs none never asks) and the options it is built with."""

    def __init__(self, cfg) -> None:
        self.label = component_label(cfg.generation_engine)
        self.resolved = ENGINES.resolve(cfg.generation_engine)
        self._cfg = cfg

    @functools.cached_property
    def declared(self) -> Capabilities:
        return capabilities(self.resolved, self.label)

    @functools.cached_property
    def options(self) -> EngineOptions:
        return self._cfg.generation_options(engine=self.resolved)


def _check_names(cfg) -> ConfiguredEngine:
    """Fields that name something registered: each against its registry. Returns the engine."""
    require(isinstance(cfg.resume, bool) or cfg.resume == "auto",
            f"resume: expected true, false or auto, got {cfg.resume!r}")
    require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device) is not None,
             f"device: expected auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    require(cfg.method in METHODS, f"method: unknown method {cfg.method!r}; known: {', '.join(METHODS)}")
    # a registered name, or module:function (imported now: errors early), or a mapping of one and keyword
    # arguments, bound and checked against its signature now; here and below
    RULES.resolve(cfg.downsampling_rule)
    ADVANTAGES.resolve(cfg.advantage_estimator)
    PROMPT_SELECTORS.resolve(cfg.prompt_selector)
    engine = _check_engine(cfg)
    loss = spec_parts(cfg.loss_type, "loss_type")[0]
    require(loss in LOSSES or ":" in loss,
            f"loss_type: {loss!r} is not implemented; podsrl has {' and '.join(LOSSES)} (TRL's others run "
            f"in podsrl.trl), or name your own loss type as 'module:function'")
    LOSSES.resolve(cfg.loss_type)
    check_dtype(cfg.dtype)
    require(not cfg.fp16, "fp16: float16 mixed precision is not supported yet (it needs loss scaling); use bf16 "
                           "(GPUs since Ampere, and CPUs) or float32")
    require(not cfg.bf16 or cfg.dtype == "float32",
             f"bf16: mixed precision keeps float32 master weights, so dtype must be float32 (got {cfg.dtype!r})")
    require(cfg.vllm_importance_sampling_mode in SAMPLER_CORRECTION_MODES,
            f"vllm_importance_sampling_mode: unknown mode {cfg.vllm_importance_sampling_mode!r}; known: "
            f"{', '.join(SAMPLER_CORRECTION_MODES)}")
    require(cfg.vllm_importance_sampling_clip_min <= cfg.vllm_importance_sampling_clip_max,
            f"vllm_importance_sampling_clip_min: {cfg.vllm_importance_sampling_clip_min} is above "
            f"vllm_importance_sampling_clip_max {cfg.vllm_importance_sampling_clip_max}")
    require(cfg.reward_error_policy in ("raise", "zero"),
             f"reward_error_policy: must be 'raise' or 'zero', got {cfg.reward_error_policy!r}")
    tracker_names(cfg.report_to)  # a missing tracker package fails now, not after the model loads
    check_model_name(cfg.model)
    for spec in cfg.reward_specs:
        load_reward_fn(spec)  # import errors surface now, not mid-run
    weights = cfg.reward_weight_values  # without reward_funcs they weight train()'s, counted there
    require(not cfg.reward_specs or len(weights) == len(cfg.reward_specs),
             f"reward_weights: {len(weights)} weights for {len(cfg.reward_specs)} reward_funcs")
    return engine


def _check_engine(cfg) -> ConfiguredEngine:
    """The engine's spec (its arguments against its options class), its options' own rules, and
    the flat fields that only some engines read, by what the engine declares, never its name."""
    engine = ConfiguredEngine(cfg)
    engine.options.check()
    label = engine.label
    require(not cfg.generation_memory_mb or reads_option(engine.resolved, "memory_mb"),
            f"generation_memory_mb: caps what the hf and slots engines decode at once; generation_engine {label} "
            f"sizes its own memory (the vllm engine: vllm_kv_cache_memory_mb, vllm_gpu_memory_utilization)")
    require(cfg.generation_dtype in ("", "auto") or reads_option(engine.resolved, "copy_dtype"),
            f"generation_dtype: the generation copy is the hf engine's (got generation_engine {label}; vllm "
            f"computes in its own dtype, the slots engine generates from the policy)")
    return engine


def _check_data(cfg) -> None:
    require(is_known_task(cfg.task), f"task: unknown task {cfg.task!r}; known: {', '.join(sorted(TASKS))}, "
                                      f"reasoning_gym:NAME, or 'module:builder' / 'file.py:builder'")
    for name in ("train_data", "test_data"):
        spec = getattr(cfg, name)
        if spec and is_local(spec) and not Path(spec).expanduser().is_file():
            raise FileNotFoundError(f"{name}: file not found: {spec}")
    check_task_options(bind(TaskOptions, cfg))  # the spec's arguments and the task's own rules


def _check_combinations(cfg, engine: ConfiguredEngine) -> None:
    _check_groups(cfg)
    require(cfg.correct_weight + cfg.format_weight > 0,
            "correct_weight/format_weight: must not both be 0 (the task's reward would be 0 for every rollout)")
    require(cfg.num_kept <= cfg.num_generations or not METHODS[cfg.method].generates_n,
             f"num_kept: must be <= num_generations (got {cfg.num_kept} > {cfg.num_generations}); PODS keeps m of "
             f"the n rollouts it generates")
    group = cfg.num_generations_max if cfg.adaptive_n else cfg.generated_per_prompt
    require(not 0 < cfg.generation_batch_size < group,
            f"generation_batch_size: {cfg.generation_batch_size} is less than one prompt group ({group} rollouts per "
            f"prompt); engine calls take whole groups, so each would decode {group} anyway: set at least {group}, or "
            f"0 for the whole batch in one call")
    check_size = getattr(PROMPT_SELECTORS.resolve(cfg.prompt_selector), "check_size", None)  # optional
    if cfg.max_train_prompts and check_size is not None:
        try:
            check_size(cfg.max_train_prompts, cfg.prompt_selection_options())
        except ValueError as err:
            raise ValueError(f"max_train_prompts: {err}") from None
    if cfg.group_early_stop:
        _check_early_stop(cfg, engine)
    for spec in cfg.watcher_specs:
        _check_watcher(cfg, spec, engine)
    if cfg.partial_rollouts:
        _check_partial_rollouts(cfg, engine)
    if cfg.prune_running:
        _check_pruning(cfg, engine)
    if cfg.adaptive_n:
        require(METHODS[cfg.method].selects, f"adaptive_n: chooses how many rollouts pods selects from; method "
                                             f"{cfg.method} trains on what it generates")
        require(cfg.num_kept <= cfg.num_generations <= cfg.num_generations_max,
                f"num_generations_max: adaptive_n needs num_kept <= num_generations <= num_generations_max (got "
                f"{cfg.num_kept}, {cfg.num_generations}, {cfg.num_generations_max})")


def _check_groups(cfg) -> None:
    """Every method normalises advantages over the group of rollouts it trains on per prompt
    (m for pods and grpo, n for grpo-ga): a group of one has advantage 0, and training nothing."""
    method = METHODS[cfg.method]
    # the count that sets the group
    name = "num_kept" if method.trained_per_prompt(0, 1) == 1 else "num_generations"
    require(getattr(cfg, name) >= 2, f"{name}: must be at least 2 for method {cfg.method} (an advantage needs a "
                                     f"group: with 1 rollout per prompt trained on, every group-normalised "
                                     f"advantage is 0 and training does nothing), got {getattr(cfg, name)}")


def _check_early_stop(cfg, engine: ConfiguredEngine) -> None:
    # a rule's declaration
    lossless = getattr(RULES.resolve(cfg.downsampling_rule), "early_stop_lossless", False)
    require(METHODS[cfg.method].selects and lossless,
            f"group_early_stop: stops groups whose max-variance selection cannot improve; it needs method pods "
            f"with downsampling_rule max_variance (got {cfg.method} / {cfg.downsampling_rule})")
    require(STOP_GROUPS in engine.declared.watches,
            f"group_early_stop: generation_engine {engine.label} does not stop groups early (its capabilities "
            f"declare no watcher kind {STOP_GROUPS!r}); use generation_engine slots")
    _require_watch_allowed(engine, STOP_GROUPS, "group_early_stop")


def _require_watch_allowed(engine: ConfiguredEngine, kind: str, field: str) -> None:
    """The engine's options allow a watcher of ``kind`` (``field``: the setting that asked for it)."""
    refusal = engine.options.watch_refusal(kind)
    require(not refusal, f"{field}: {refusal}")


def _check_watcher(cfg, spec, engine: ConfiguredEngine) -> None:
    """A ``generation_watchers`` factory: a kind its engine declares, options that allow it, and
    (``stop_groups``, which leaves groups with fewer samples) a method that selects from them."""
    label, kind = component_label(spec), watcher_kind(spec)
    require(kind in engine.declared.watches, f"generation_watchers: {label} is a watcher of kind {kind!r}, and "
                                             f"generation_engine {engine.label} runs none of that kind (it "
                                             f"declares {engine.declared.declared_kinds()})")
    _require_watch_allowed(engine, kind, f"generation_watchers: {label}")
    factory = WATCHERS.resolve(spec)
    if isinstance(factory, type):  # a class is its watchers' type: it has the methods its kind calls
        missing = [name for name in KIND_METHODS.get(kind, ()) if not callable(getattr(factory, name, None))]
        require(not missing, f"generation_watchers: {label} is a watcher of kind {kind!r} without the "
                             f"method {''.join(missing[:1])}() its kind calls (podsrl.rollout.Watcher)")
    stops = {STOP_GROUPS: "stops groups early", PRUNE_RUNNING: "stops running samples"}
    require(kind not in stops or METHODS[cfg.method].selects,
            f"generation_watchers: {label} {stops.get(kind)}, and method {cfg.method} trains on every sample it "
            f"generates; use method pods")


def _check_pruning(cfg, engine: ConfiguredEngine) -> None:
    require(cfg.group_early_stop, "prune_running: needs group_early_stop true (it counts the finished samples early "
                                  "stop scores as they finish, against the reward's bounds)")
    require(PRUNE_RUNNING in engine.declared.watches,
            f"prune_running: generation_engine {engine.label} stops no running sample (its capabilities declare "
            f"no watcher kind {PRUNE_RUNNING!r}); use generation_engine slots")
    _require_watch_allowed(engine, PRUNE_RUNNING, "prune_running")
    require(not any(watcher_kind(spec) == PRUNE_RUNNING for spec in cfg.watcher_specs),
            "prune_running: a call runs one watcher of running samples, and generation_watchers names one too")


def _check_partial_rollouts(cfg, engine: ConfiguredEngine) -> None:
    label, declared = engine.label, engine.declared
    require(declared.partial_rollouts,
            f"partial_rollouts: generation_engine {label} cannot stop a step's generation at a quota and resume "
            f"samples in the next step (its capabilities do not declare partial_rollouts); use the slots or vllm "
            f"engine")
    refusal = getattr(engine.options, "partial_rollouts_refusal", lambda: "")()  # optional
    require(not refusal, f"partial_rollouts: {refusal}")
    require(cfg.partial_stale_correction != "mask" or not declared.reports_sampling_logp,
            f"partial_stale_correction: 'mask' leaves out the tokens with a sampling log-prob, and generation_engine "
            f"{label} reports one for every token (its numerics are not the policy's); use 'importance'")
    require(not cfg.adaptive_n, "partial_rollouts: not with adaptive_n (a group carried over keeps the n it started "
                                "with, and the next step may choose another)")
    require(not cfg.generation_batch_size, f"partial_rollouts: generation_batch_size {cfg.generation_batch_size} "
                                           f"splits a step's generation into calls, and the quota is per call; set it "
                                           f"to 0 (the slots engine bounds memory by generation_micro_group)")


# --- warnings: fields set that change nothing in this run (set_up says them once; the run goes on)
def ignored_fields(cfg) -> list[str]:
    """Warnings, one line each, about fields set away from their default that change nothing in
    this run: flat engine options the engine's options class does not have (a config copied
    between engines is common: warned, not refused), the importance-sampling correction where
    the engine reports no sampling log-probs, dynamic_sampling_rounds without dynamic_sampling."""
    changed = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != f.default}
    engine = ENGINES.resolve(cfg.generation_engine)
    warnings = []
    readers = {name: _readers(lambda engine, option=option: reads_option(engine, option))
               for name, option in flat_names(cfg, EngineOptions).items() if not reads_option(engine, option)}
    if not (capabilities(engine).reports_sampling_logp or cfg.partial_rollouts):
        reporters = _readers(lambda engine: capabilities(engine).reports_sampling_logp)
        readers.update(dict.fromkeys(SAMPLER_FIELDS, reporters))
    unread = [name for name in readers if name in changed]
    if unread:
        shown = ", ".join(f"{name} = {json.dumps(getattr(cfg, name))} (read by {readers[name]})" for name in unread)
        warnings.append(f"generation_engine {component_label(cfg.generation_engine)} does not read {shown}: "
                        f"{'it has' if len(unread) == 1 else 'they have'} no effect in this run")
    warnings += _switched_off(cfg, changed)
    if cfg.prune_running:
        warnings += _pruning_warnings(cfg)
    return warnings


def _switched_off(cfg, changed: set[str]) -> list[str]:
    """Fields set that only a switch, turned off, reads: each such field says so first in its help
    ("partial_rollouts: ...", "prune_running: ..."), so the list is taken from the declarations."""
    switches = {f.name for f in dataclasses.fields(cfg) if type(f.default) is bool}
    off: dict[str, list[str]] = {}
    for f in dataclasses.fields(cfg):
        switch = f.metadata.get("help", "").split(": ", 1)[0]
        if switch in switches and f.name in changed and not getattr(cfg, switch):
            off.setdefault(switch, []).append(f"{f.name} = {json.dumps(getattr(cfg, f.name))}")
    return [f"{', '.join(shown)}: read only with {switch} true; {'it has' if len(shown) == 1 else 'they have'} "
            f"no effect in this run" for switch, shown in off.items()]


def _pruning_warnings(cfg) -> list[str]:
    """prune_running set where it may never act: a warm-up that lasts the whole run, or a reward of
    several terms, which takes values strictly between its bounds (the rule counts only finished
    samples at a bound: on the chain task's correct + format reward it pruned nothing in any step)."""
    warnings = []
    if cfg.prune_warmup_steps >= cfg.max_steps:
        warnings.append(f"prune_warmup_steps = {cfg.prune_warmup_steps}: the head only watches for that many "
                        f"steps, and the run has max_steps = {cfg.max_steps}: prune_running prunes nothing in it")
    if cfg.reward_specs:
        terms = [f"{component_label(spec)} x {weight:g}"
                 for spec, weight in zip(cfg.reward_specs, cfg.reward_weight_values) if weight]
        fields = "reward_funcs, reward_weights"
    else:
        terms = [f"{name} {weight:g}" for name, weight in (("correct_weight", cfg.correct_weight),
                                                            ("format_weight", cfg.format_weight)) if weight]
        fields = "correct_weight, format_weight"
    if len(terms) > 1:
        warnings.append(f"prune_running: the reward sums {len(terms)} terms ({', '.join(terms)}), so it takes "
                        f"values strictly between its bounds, and pruning counts only finished samples at a "
                        f"bound (a wrong answer scored for its format fills neither class): it may prune "
                        f"nothing; give one term weight ({fields})")
    return warnings


def _readers(reads) -> str:
    """The built-in engines for which ``reads(engine)`` holds, by name: 'slots', 'hf or slots'."""
    return " or ".join(name for name, engine in ENGINES.items() if reads(engine)) or "none"

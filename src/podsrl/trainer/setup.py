"""From the run's Config to the run: the one place that maps config fields onto the stages'
option objects (the stages themselves never see the Config), and builds each stage, job and hook
with what it reads."""

from __future__ import annotations

import copy
import dataclasses
import filecmp
import functools
import json
import random
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from podsrl.algorithms.advantages import ADVANTAGES
from podsrl.algorithms.importance import STALE_MASK, SamplerCorrection
from podsrl.algorithms.loss import LOSSES
from podsrl.algorithms.rollout_budget import FixedGroupSize, GroupSizePolicy, RolloutBudget
from podsrl.config_checks import ignored_fields
from podsrl.contracts import check_reward_signature
from podsrl.distributed import Processes
from podsrl.generation.partial_rollouts import CarriedPool, PartialRolloutOptions, carried_pool
from podsrl.generation.prompt_source import PromptSource
from podsrl.generation.pruning import PruningOptions, RunPruning
from podsrl.generation.saturation import reward_bounds
from podsrl.methods import METHODS, Keeping
from podsrl.metrics import MetricsLog
from podsrl.models import load_model
from podsrl.models.precision import autocast
from podsrl.options import bind
from podsrl.prompt_selection import PROMPT_SELECTORS, PromptSelector
from podsrl.provenance import record_environment
from podsrl.registry import component_label
from podsrl.rewards import RewardFn, load_reward_fn
from podsrl.rewards.worker import reward_name
from podsrl.rollout import ENGINES, WatcherFactory, capabilities, generate
from podsrl.run_folder.claim import RESUME_SAFE_FIELDS, RunLock, claim_run_dir
from podsrl.scoring import Scorer, ScoringOptions
from podsrl.tasks import TaskOptions, build_task, prepare_split
from podsrl.trainer.checkpoints import CheckpointOptions, CheckpointSchedule, Resume
from podsrl.trainer.config import FIELDS, Config, validate
from podsrl.trainer.cores import CoreShare
from podsrl.trainer.evaluate import EvalOptions, Evaluator, eval_shortfall
from podsrl.trainer.fits import agreed, available_bytes, check_fits
from podsrl.trainer.hooks import step_hooks
from podsrl.trainer.jobs import Checkpointer, RunEvaluation, RunLog
from podsrl.trainer.limits import Limits, StopOptions
from podsrl.trainer.logging import LogOptions, say
from podsrl.trainer.run import Run
from podsrl.trainer.stages import (
    Advantages,
    ExtraLogprobs,
    PolicyUpdate,
    ProgressAt,
    RolloutGenerator,
    ScoreEverywhere,
    StepStages,
    StopperFactory,
)
from podsrl.trainer.state import GeneratorState, PerProcess, RunState
from podsrl.update import OptimizerOptions, UpdateOptions, make_optimizer

EVAL_SEED_OFFSET = 10_007  # evaluation's own seed stream: seed + offset + rank
PROMPT_SELECTOR_STATE = "prompt_selector"  # the prompt selector's learned part, named as its config field


# --- config fields -> the stages' options -------------------------------------------------------
def task_options(cfg: Config) -> TaskOptions:
    return bind(TaskOptions, cfg)


def reward_functions(cfg: Config, reward_funcs: Sequence[RewardFn | str] | None = None) -> list[RewardFn]:
    """The run's reward functions: those passed to ``train(cfg, reward_funcs=...)`` (callables,
    or names as ``reward_funcs`` takes them), else the config's ``reward_funcs``. Both at once
    is an error rather than a silent choice; so are weights that do not match."""
    if reward_funcs is not None and cfg.reward_specs:
        raise ValueError(f"reward_funcs: given both in the config ({cfg.reward_funcs!r}) and to train(); "
                         f"pass them in one place")
    fns = [load_reward_fn(f) if isinstance(f, str) else f for f in (reward_funcs or [])] or \
        [load_reward_fn(spec) for spec in cfg.reward_specs]
    for fn in fns:
        if not callable(fn):
            raise TypeError(f"reward_funcs: {fn!r} is not callable (expected fn(prompts, completions, **columns))")
        check_reward_signature(fn, "reward_funcs", reward_name(fn))
    if cfg.reward_weights and len(cfg.reward_weight_values) != len(fns):
        raise ValueError(f"reward_weights: {len(cfg.reward_weight_values)} weights for {len(fns)} reward functions")
    return fns


def scoring_options(cfg: Config, reward_funcs: list[RewardFn]) -> ScoringOptions:
    weights = cfg.reward_weight_values if cfg.reward_weights else [1.0] * len(reward_funcs)
    return bind(ScoringOptions, cfg, reward_funcs=tuple(reward_funcs), reward_weights=tuple(weights))


def update_options(cfg: Config) -> UpdateOptions:
    return bind(UpdateOptions, cfg, loss_type=LOSSES.checked(cfg.loss_type))


def sampler_correction(cfg: Config) -> SamplerCorrection | None:
    """TRL's importance-sampling correction of rollouts sampled by vLLM, or of the tokens partial
    rollouts carried over from an earlier policy (None: off); or partial rollouts' mask of those."""
    if cfg.partial_rollouts and cfg.partial_stale_correction == "mask":
        return SamplerCorrection(mode=STALE_MASK)
    if not cfg.vllm_importance_sampling_correction:
        return None
    return SamplerCorrection(mode=cfg.vllm_importance_sampling_mode, clip_min=cfg.vllm_importance_sampling_clip_min,
                             clip_max=cfg.vllm_importance_sampling_clip_max)


# --- building a run --------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _write_run_files(run_dir: Path, cfg: Config, task, splits, system_prompt: str, procs: Processes,
                     tokenizer) -> None:
    train_split, test_split = splits
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    # commit, date, machine, EOS: reports built from the run state them
    record_environment(run_dir, tokenizer)
    (run_dir / "data.json").write_text(json.dumps({
        "task": task.name, "train_prompts": len(train_split.examples), "test_prompts": len(test_split.examples),
        "dropped_train_prompts": train_split.dropped, "dropped_test_prompts": test_split.dropped,
        "system_prompt": system_prompt, "example_prompt": test_split.prompts[0],
        "processes": procs.world_size}, indent=2) + "\n")


def set_up(cfg: Config, reward_funcs: Sequence[RewardFn | str] | None = None) -> Run:
    """Data, model, reward, engine, optimizer and run folder of a run, in an order that keeps
    runs reproducible (the seed comes first: LoRA initialisation draws from it).
    ``reward_funcs``: Python reward functions replacing the task's reward (see
    :func:`reward_functions`). The run folder is checked and locked before anything loads;
    the lock is the returned Run's to release (or released here if set-up fails)."""
    validate(cfg)  # a Config built in Python is checked as the command line's is
    fns = reward_functions(cfg, reward_funcs)  # before any work: a mistake here should cost no time
    procs = Processes.from_env()
    for warning in ignored_fields(cfg) if procs.is_main else ():
        say(f"warning: {warning}")  # once, before anything loads; the run goes on
    run_dir, lock, resume = claim_run_dir(cfg, procs)
    # `auto` decided: config.json and the run read true or false
    cfg = dataclasses.replace(cfg, resume=resume)
    try:
        return _build_run(cfg, fns, procs, run_dir, lock)
    except BaseException:
        if lock:
            lock.release()
        raise


def _check_sharding(cfg: Config, procs: Processes) -> None:
    """Under FSDP no process holds whole weights: refuse an engine that needs them."""
    if procs.sharded and capabilities(ENGINES.resolve(cfg.generation_engine)).needs_whole_weights:
        raise ValueError(f"generation_engine: {component_label(cfg.generation_engine)} is not supported with FSDP "
                         f"(each process's engine needs whole weights); use DDP, or PODS inside TRL (podsrl.trl), "
                         f"whose vLLM path gathers them")


def _build_run(cfg: Config, fns: list[RewardFn], procs: Processes, run_dir: Path,
               lock: RunLock | None) -> Run:
    cores = CoreShare.of(cfg)  # what other processes use of the cores, from here on
    _check_sharding(cfg, procs)
    engine_options = cfg.generation_options(procs.world_size, procs.sharded)
    engine_options.check()  # again, now that the processes are known (FSDP)
    seed_everything(cfg.seed)
    task = build_task(task_options(cfg))
    if not task.test:  # before the model loads: data problems should cost no time
        raise ValueError(f"test_data: task {cfg.task!r} has no held-out prompts to evaluate on")
    scorer = Scorer.build(task, scoring_options(cfg, fns))
    bounds = reward_bounds(scorer) if cfg.group_early_stop else None  # fails before the model loads
    bundle = load_model(cfg.model, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                        dtype=cfg.dtype, lora_target_modules=cfg.lora_targets)
    system_prompt = cfg.system_prompt_for(task)
    splits = _checked_splits(cfg, task, bundle, procs, engine_options, system_prompt)
    # the same on every process; built before the run's files are written: a selector that
    # refuses the train split (pass_rate, fewer prompts than prompts_per_step) leaves no files
    selector = prompt_selector(cfg, len(splits[0].examples))
    engine = ENGINES.checked(cfg.generation_engine)(engine_options)
    if procs.is_main and not cfg.resume:  # a resume rewrites config.json only once a checkpoint is restored
        _write_run_files(run_dir, cfg, task, splits, system_prompt, procs, bundle.tokenizer)
    policy = bundle.model.to(procs.device(cfg.device))  # the bare model: generation, log-probs, saving
    policy.train()
    # KL reference: with LoRA the base model with the adapter disabled, else a frozen copy.
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if cfg.beta > 0 and not bundle.uses_lora else None
    optimizer, scheduler = make_optimizer((p for p in policy.parameters() if p.requires_grad),
                                          bind(OptimizerOptions, cfg), total_steps=cfg.max_steps)
    rule_stream = torch.Generator().manual_seed(cfg.seed + 1)  # the `random` rule's
    keeping = METHODS[cfg.method].bound(cfg.num_kept, cfg.downsampling_rule, rule_stream)  # m bound once, here
    group_size = group_size_policy(cfg, keeping)
    # prune_running: the quality head, a run part
    pruning = RunPruning.of(bind(PruningOptions, cfg), bundle.model.config.get_text_config().hidden_size,
                            keeping.m, cfg.max_completion_length)
    # what a checkpoint restores besides the weights, a step snapshots and an abandoned step rolls back
    state = RunState(parts={PROMPT_SELECTOR_STATE: selector, "group_size": group_size,
                            "generation_engine": PerProcess(engine),
                            "rule_generator": GeneratorState(keeping.generator)}
                     | ({"quality_head": pruning} if pruning is not None else {}))
    progress = ProgressAt(max_steps=cfg.max_steps, prompts_per_step=cfg.prompts_per_step,
                          train_prompts=len(splits[0].examples), is_main=procs.is_main,
                          is_local_main=getattr(procs.accelerator, "is_local_main_process", True))
    generator = rollout_generator(cfg, procs, bundle.tokenizer, scorer, engine, policy, pruning, keeping,
                                  bounds, progress)
    score = ScoreEverywhere(scorer, procs, progress)
    prompts = prompt_source(cfg, procs, bundle.tokenizer, splits[0], generator, score, selector,
                            carried_pool(bind(PartialRolloutOptions, cfg), state))
    stages = step_stages(cfg, procs, prompts, group_size, keeping, policy, reference, scheduler)
    run = _run(cfg, procs, run_dir, lock, state, stages, bundle, policy, optimizer, scheduler, scorer, engine,
               evaluator(cfg, bundle, task, splits[1], procs, engine),
               step_hooks(cfg, procs, policy, engine, group_size, cores, pruning))
    cores.follow()  # the threads of the first evaluation and step: the cores left free during set-up
    return run


def _run(cfg: Config, procs: Processes, run_dir: Path, lock: RunLock | None, state: RunState,
         stages: StepStages, bundle, policy: torch.nn.Module, optimizer, scheduler, scorer: Scorer, engine,
         run_evaluator: Evaluator, hooks: list) -> Run:
    """The run and its jobs, each built with what it reads."""
    limits, resumed = Limits(bind(StopOptions, cfg)), resume(cfg)
    forward_precision = functools.partial(autocast, policy.device, "bfloat16" if cfg.bf16 else "")
    log_options = bind(LogOptions, cfg)
    logs = ((MetricsLog(run_dir / "metrics.jsonl"), MetricsLog(run_dir / "rollouts.jsonl")) if procs.is_main
            else (None, None))  # only the main process writes
    checkpoints = Checkpointer(procs, state, CheckpointSchedule(bind(CheckpointOptions, cfg)), resumed,
                               run_dir, policy, optimizer, scheduler, bundle.tokenizer, bundle.uses_lora,
                               tuple(log for log in logs if log is not None))
    log = RunLog(procs, state, *logs, log_options.trackers(run_dir, procs.is_main), log_options, cfg.method,
                 scorer, hooks, checkpoints.stopped_here)
    evaluation = RunEvaluation(run_evaluator, procs, state, limits, forward_precision)
    return Run(stages, state, limits, resumed, procs, evaluation, log, checkpoints, forward_precision, policy,
               optimizer, scorer, engine, run_dir, cfg.to_dict(), bundle.tokenizer, lock)


def _checked_splits(cfg: Config, task, bundle, procs: Processes, engine_options, system_prompt: str) -> list:
    """The train and held-out splits as the model reads them, refused where no prompt is usable or
    the run's settings exceed what the engine, the data, the model or the memory hold (before
    anything is generated); what trains but not as meant is said once."""
    train = task.train[:cfg.max_train_prompts] if cfg.max_train_prompts else task.train
    splits = [prepare_split(examples, bundle.tokenizer, system_prompt=system_prompt,
                            use_chat_template=cfg.chat_template, max_prompt_tokens=cfg.max_prompt_tokens)
              for examples in (train, task.test)]
    if (splits[0].dropped or splits[1].dropped) and procs.is_main:
        say(f"max_prompt_tokens={cfg.max_prompt_tokens}: dropped {splits[0].dropped} train and "
            f"{splits[1].dropped} held-out prompts that are longer")
    if not splits[0].examples:
        raise ValueError(f"train_data: no usable train prompts for task {cfg.task!r}")
    if not splits[1].examples:
        raise ValueError(f"test_data: no held-out prompts for task {cfg.task!r} to evaluate on")
    longest = max(split.longest_prompt for split in splits)
    check_prompts = getattr(ENGINES.resolve(cfg.generation_engine), "check_prompts", None)  # optional
    if check_prompts is not None:  # every prompt now, not the first long one some steps in
        check_prompts(engine_options, bundle.model.config, longest)
    fit_warnings = agreed(procs, lambda: check_fits(cfg, engine_options, bundle.model.config, longest,
                                                    len(splits[0].examples), procs.world_size,
                                                    available_bytes(procs.device(cfg.device))))
    for warning in [*fit_warnings, *data_warnings(cfg, train, splits[1].examples)] if procs.is_main else ():
        say(f"warning: {warning}")  # once, at set-up; the run goes on
    return splits


def evaluator(cfg: Config, bundle, task, split, procs: Processes, engine) -> Evaluator:
    """The run's evaluation on the held-out ``split``, with its own seed stream per process,
    decoding on the engine where it has a sampler of its own (slots, vllm)."""
    return Evaluator(bind(EvalOptions, cfg), bundle, task, split, cfg.max_completion_length,
                     seed=cfg.seed + EVAL_SEED_OFFSET + procs.rank, procs=procs,
                     generate_fn=getattr(engine, "generate", generate))


def resume(cfg: Config) -> Resume:
    return Resume(wanted=cfg.resume, part_labels={PROMPT_SELECTOR_STATE: component_label(cfg.prompt_selector),
                                                  "generation_engine": component_label(cfg.generation_engine)},
                  keeps=frozenset(FIELDS) - RESUME_SAFE_FIELDS)


def rollout_generator(cfg: Config, procs: Processes, tokenizer, scorer: Scorer, engine,
                      policy: torch.nn.Module, pruning: RunPruning | None, keeping: Keeping,
                      reward_bounds: tuple[float, float] | None, progress: ProgressAt) -> RolloutGenerator:
    """The generate stage: the engine's calls on the step's prompts, with early stop's watcher (and
    pruning's beside it) when ``group_early_stop`` is on, and the user's watchers."""
    early_stop = (StopperFactory(scorer, tokenizer, keeping, reward_bounds, progress, pruning)
                  if cfg.group_early_stop else None)
    return RolloutGenerator(engine, policy, tokenizer, procs, keeping, cfg.generation_batch_size,
                            cfg.prompts_per_step, cfg.seed, early_stop,
                            tuple(map(WatcherFactory, cfg.watcher_specs)))


def prompt_source(cfg: Config, procs: Processes, tokenizer, train_split, generate: RolloutGenerator,
                  score: ScoreEverywhere, selector: PromptSelector,
                  carried: CarriedPool | None) -> PromptSource:
    """Where the step's prompt groups come from: rounds of one generation call each, over partial
    rollouts' groups in flight (``carried``: their pool, None when they are off) and fresh prompts,
    one per step or dynamic sampling's."""
    return PromptSource(selector, cfg.prompts_per_step, train_split, generate, score, procs,
                        extra_rounds=cfg.dynamic_sampling_rounds if cfg.dynamic_sampling else None,
                        pad_token_id=tokenizer.pad_token_id, pool=carried)


def step_stages(cfg: Config, procs: Processes, prompts: PromptSource, group_size: GroupSizePolicy,
                keeping: Keeping, policy: torch.nn.Module, reference: torch.nn.Module | None,
                scheduler) -> StepStages:
    """The step's stages, each bound to the config values it needs (the loop reads none), those
    that need m to ``keeping`` (the select stage); ``reference``: the KL's frozen model (None: none,
    or LoRA's adapter-free base)."""
    needs_old, needs_ref = cfg.num_iterations > 1, cfg.beta > 0
    logprobs = (ExtraLogprobs(policy, reference, cfg.micro_batch_size, cfg.share_prompt_in_update,
                              old=needs_old, ref=needs_ref) if needs_old or needs_ref else None)
    return StepStages(
        group_size=group_size, prompts=prompts, select=keeping,
        advantages=Advantages(ADVANTAGES.checked(cfg.advantage_estimator), cfg.scale_rewards), logprobs=logprobs,
        update=PolicyUpdate(scheduler, update_options(cfg), procs, cfg.num_iterations,
                            sampler_correction(cfg)))


def data_warnings(cfg: Config, train: list, test: list) -> list[str]:
    """Data that trains and evaluates, but not as the user likely meant (one line each): the
    held-out file is the train file, held-out prompts are train prompts too (a subset or a
    reordering of the train file), the train data repeats prompts (they are drawn more often),
    or the held-out split is smaller than ``eval_prompts``."""
    warnings = []
    same = _same_file(cfg.train_data, cfg.test_data)
    if same:
        warnings.append(f"train_data, test_data: {cfg.train_data} and {cfg.test_data} are {same}: held-out "
                        f"accuracy is measured on the prompts trained on")
    trained = {_prompt_key(example) for example in train}
    shared = [key for key in map(_prompt_key, test) if key in trained]
    if shared and not same:
        where = f"test_data {cfg.test_data}" if cfg.test_data else f"task {cfg.task!r}"
        warnings.append(f"{where}: {len(shared)} of {len(test)} held-out prompts are also train prompts (e.g. "
                        f"{shared[0][:60]!r}): held-out accuracy is partly measured on prompts trained on")
    repeated, first = _repeated_prompts(train)
    if repeated:
        where = f"train_data {cfg.train_data}" if cfg.train_data else f"task {cfg.task!r}"
        warnings.append(f"{where}: {repeated} of {len(train)} train prompts repeat an earlier one (same prompt text, "
                        f"e.g. {first[:60]!r}); they are trained on more often")
    shortfall = eval_shortfall(len(test), cfg.eval_prompts)
    if shortfall:
        warnings.append(shortfall)
    return warnings


def _prompt_key(example) -> str:
    """An example's prompt as comparable text: the text, or the conversation as JSON."""
    return example.prompt if isinstance(example.prompt, str) else json.dumps(example.prompt, sort_keys=True)


def _repeated_prompts(train: list) -> tuple[int, str]:
    """How many train examples repeat an earlier prompt (text, or conversation), and the first."""
    seen, repeated, first = set(), 0, ""
    for example in train:
        key = _prompt_key(example)
        if key in seen:
            repeated, first = repeated + 1, first or key
        seen.add(key)
    return repeated, first


def _same_file(train_data: str, test_data: str) -> str:
    """'the same file' / 'files with the same content' for two local data files, else ''."""
    paths = [Path(spec).expanduser() for spec in (train_data, test_data)]
    if not (train_data and test_data and all(path.is_file() for path in paths)):
        return ""
    if paths[0].resolve() == paths[1].resolve():
        return "the same file"
    return "files with the same content" if filecmp.cmp(paths[0], paths[1], shallow=False) else ""


def prompt_selector(cfg: Config, train_prompts: int) -> PromptSelector:
    """Which train prompts each step generates for (podsrl.prompt_selection)."""
    return PROMPT_SELECTORS.checked(cfg.prompt_selector)(train_prompts, cfg.prompt_selection_options())


def group_size_policy(cfg: Config, keeping: Keeping) -> GroupSizePolicy:
    """n per step: adaptive_n's controller (for the run's m), or num_generations every step."""
    if cfg.adaptive_n:
        return RolloutBudget(keeping.m, cfg.num_generations, cfg.num_generations_max, cfg.prompts_per_step)
    return FixedGroupSize(cfg.num_generations)

"""Validation of a :class:`podsrl.config.Config`: every field against its registry or range,
and the combinations that cannot work, before any work; each error names the field.

``cfg`` is a :class:`podsrl.config.Config` throughout (not annotated: ``podsrl.config``
imports this module and re-exports ``validate``; kept apart so the field list stays readable).
"""

from __future__ import annotations

import re
from pathlib import Path

from podsrl.algorithms.loss import LOSS_TYPES
from podsrl.algorithms.select import RULES
from podsrl.methods import METHODS
from podsrl.models import check_model_name
from podsrl.rewards import load_reward_fn
from podsrl.rollout import ENGINES, REFILLS, SCHEDULES
from podsrl.tasks import is_known_task
from podsrl.tasks.arithmetic import LEVELS, space_size
from podsrl.tasks.data import is_local
from podsrl.tracking import tracker_names
from podsrl.update import SCHEDULERS

OPTIMIZERS = ("adamw_torch", "sgd")


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def validate(cfg) -> None:
    """Reject invalid values and combinations before any work, naming the field."""
    _check_names(cfg)
    _check_data(cfg)
    _check_ranges(cfg)
    _check_combinations(cfg)


def _check_names(cfg) -> None:
    """Fields that name something registered: each against its registry."""
    require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device) is not None,
             f"device: expected auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    require(cfg.method in METHODS, f"method: unknown method {cfg.method!r}; known: {', '.join(METHODS)}")
    require(cfg.downsampling_rule in RULES, f"downsampling_rule: unknown rule {cfg.downsampling_rule!r}; "
                                             f"known: {', '.join(sorted(RULES))}")
    require(cfg.generation_engine in ENGINES,
             f"generation_engine: unknown engine {cfg.generation_engine!r}; known: {', '.join(sorted(ENGINES))}")
    require(cfg.generation_refill in REFILLS,
             f"generation_refill: unknown {cfg.generation_refill!r}; known: {', '.join(REFILLS)}")
    require(cfg.generation_schedule in SCHEDULES,
             f"generation_schedule: unknown {cfg.generation_schedule!r}; known: {', '.join(SCHEDULES)}")
    if cfg.generation_schedule == "length_aware":
        require(cfg.generation_engine == "slots" and cfg.generation_refill == "continuous",
                f"generation_schedule length_aware: plans lanes for continuous refill on the slots engine (got "
                f"generation_engine {cfg.generation_engine}, generation_refill {cfg.generation_refill})")
        require(cfg.generation_probe_tokens >= 2, f"generation_probe_tokens: the probe decodes at least 2 tokens "
                                                  f"(got {cfg.generation_probe_tokens})")
    require(cfg.lr_scheduler_type in SCHEDULERS, f"lr_scheduler_type: unknown schedule {cfg.lr_scheduler_type!r}; "
                                                  f"known: {', '.join(SCHEDULERS)}")
    require(cfg.optim in OPTIMIZERS, f"optim: unknown optimizer {cfg.optim!r}; known: {', '.join(OPTIMIZERS)}")
    require(cfg.loss_type in LOSS_TYPES, f"loss_type: {cfg.loss_type!r} is not implemented; podsrl has "
                                          f"{' and '.join(LOSS_TYPES)} (TRL's others run in podsrl.trl)")
    require(cfg.dtype in ("float32", "bfloat16", "float16"), f"dtype: unknown dtype {cfg.dtype!r}")
    require(not cfg.fp16, "fp16: float16 mixed precision is not supported yet (it needs loss scaling); use bf16 "
                           "(GPUs since Ampere, and CPUs) or float32")
    require(not cfg.bf16 or cfg.dtype == "float32",
             f"bf16: mixed precision keeps float32 master weights, so dtype must be float32 (got {cfg.dtype!r})")
    require(cfg.reward_error_policy in ("raise", "zero"),
             f"reward_error_policy: must be 'raise' or 'zero', got {cfg.reward_error_policy!r}")
    tracker_names(cfg.report_to)  # a missing tracker package fails now, not after the model loads
    check_model_name(cfg.model)
    for spec in cfg.reward_specs:
        load_reward_fn(spec)  # import errors surface now, not mid-run
    weights = cfg.reward_weight_values  # without reward_funcs they weight train()'s, counted there
    require(not cfg.reward_specs or len(weights) == len(cfg.reward_specs),
             f"reward_weights: {len(weights)} weights for {len(cfg.reward_specs)} reward_funcs")


def _check_data(cfg) -> None:
    require(is_known_task(cfg.task), f"task: unknown task {cfg.task!r}; known: arithmetic, gsm8k, math, "
                                      f"jsonl, reasoning_gym:NAME")
    for name in ("train_data", "test_data"):
        spec = getattr(cfg, name)
        if spec and is_local(spec) and not Path(spec).expanduser().is_file():
            raise FileNotFoundError(f"{name}: file not found: {spec}")
    require(cfg.task != "jsonl" or bool(cfg.test_data),
             "test_data: task 'jsonl' needs test_data, the held-out prompts that training and `podsrl eval` "
             "measure accuracy on (and train_data to train)")
    if cfg.task == "arithmetic":
        require(cfg.task_level in LEVELS, f"task_level: unknown level {cfg.task_level}; known: {sorted(LEVELS)}")
        size = space_size(LEVELS[cfg.task_level])
        require(cfg.eval_prompts < size, f"eval_prompts: level {cfg.task_level} has only {size} distinct "
                                          f"problems; hold out fewer than that")


POSITIVE = ("num_generations", "num_generations_max", "num_kept", "prompts_per_step", "max_steps",
            "micro_batch_size", "num_iterations", "max_completion_length", "eval_prompts", "eval_samples",
            "save_total_limit", "max_prompt_tokens", "max_consecutive_skips", "eval_batch_size",
            "reasoning_gym_size", "learning_rate", "lora_alpha")
NON_NEGATIVE = ("warmup_steps", "eval_steps", "save_steps", "lora_rank", "generation_batch_size",
                "generation_micro_group", "generation_memory_mb", "max_minutes", "checkpoint_minutes", "beta",
                "weight_decay", "max_grad_norm", "temperature", "eval_temperature", "lora_dropout", "reward_timeout",
                "log_rollouts")


def _check_ranges(cfg) -> None:
    for name in POSITIVE:
        require(getattr(cfg, name) > 0, f"{name}: must be positive, got {getattr(cfg, name)}")
    for name in NON_NEGATIVE:
        require(getattr(cfg, name) >= 0, f"{name}: must be >= 0, got {getattr(cfg, name)}")
    require(0 < cfg.top_p <= 1, f"top_p: must be in (0, 1], got {cfg.top_p}")
    require(cfg.temperature > 0, "temperature: training rollouts must be sampled (temperature > 0)")
    require(0 <= cfg.adam_beta1 < 1 and 0 <= cfg.adam_beta2 < 1, "adam_beta1/adam_beta2: must be in [0, 1)")
    require(0 <= cfg.epsilon < 1 and cfg.epsilon_high >= 0, "epsilon/epsilon_high: out of range")
    require(cfg.correct_weight >= 0 and cfg.format_weight >= 0 and cfg.correct_weight + cfg.format_weight > 0,
             "correct_weight/format_weight: must be >= 0 and not both 0")


def _check_combinations(cfg) -> None:
    require(cfg.num_kept <= cfg.num_generations or not METHODS[cfg.method].generates_n,
             f"num_kept: must be <= num_generations (got {cfg.num_kept} > {cfg.num_generations}); PODS keeps m of "
             f"the n rollouts it generates")
    if cfg.group_early_stop:
        _check_early_stop(cfg)
    if cfg.adaptive_n:
        require(METHODS[cfg.method].selects, f"adaptive_n: chooses how many rollouts pods selects from; method "
                                             f"{cfg.method} trains on what it generates")
        require(cfg.num_kept <= cfg.num_generations <= cfg.num_generations_max,
                f"num_generations_max: adaptive_n needs num_kept <= num_generations <= num_generations_max (got "
                f"{cfg.num_kept}, {cfg.num_generations}, {cfg.num_generations_max})")


def _check_early_stop(cfg) -> None:
    require(METHODS[cfg.method].selects and cfg.downsampling_rule == "max_variance",
            f"group_early_stop: stops groups whose max-variance selection cannot improve; it needs method pods "
            f"with downsampling_rule max_variance (got {cfg.method} / {cfg.downsampling_rule})")
    require(cfg.num_kept >= 2, f"group_early_stop: with num_kept {cfg.num_kept} no kept set has any variance")
    require(cfg.generation_engine == "slots", "group_early_stop: needs generation_engine slots (the hf engine "
                                              "generates whole groups at once)")
    require(cfg.generation_schedule != "fifo", "group_early_stop: generation_schedule fifo starts a prompt's "
                                               "samples together, leaving nothing to cancel; use round_robin")
    require(cfg.generation_schedule != "length_aware",
            "group_early_stop: with generation_schedule length_aware the parked samples resume shortest-predicted "
            "first, so early stop cancels the predicted-long ones: kept completions were 19% shorter than plain "
            "PODS's on SmolLM2 chat (benchmarks/RESULTS.md); use round_robin")
    require(bool(cfg.generation_micro_group or cfg.generation_memory_mb),
            "group_early_stop: with generation_micro_group 0 and no generation_memory_mb every sample starts at "
            "once, leaving nothing to cancel; set generation_micro_group below prompts_per_step x num_generations")

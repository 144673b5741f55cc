"""Tasks, registered by name: where prompts and their verifiable answers come from.

Built in: ``arithmetic`` and ``chain`` (offline, procedural; ``chain`` is the reasoning regime's
multi-step task, worked one step per line), ``gsm8k``, ``math`` (MATH / MATH-500),
``jsonl`` (your own data), and ``reasoning_gym:NAME`` for any reasoning-gym dataset.
Register your own with ``@TASKS.register("name")`` (or ``TASKS["name"] = builder``), or name
it in the config as ``module:builder`` / ``file.py:builder`` (:mod:`podsrl.registry`);
``builder(options: TaskOptions, with_train: bool) -> Task``. A builder may declare its own rules on
the options with :func:`checks` (``builder.check_options(options)``): validation runs them before
any data or model loads (:func:`check_task_options`).

- :mod:`~podsrl.tasks.base`: the task records and prompt rendering
- :mod:`~podsrl.tasks.arithmetic`, :mod:`~podsrl.tasks.chain`, :mod:`~podsrl.tasks.gsm8k`,
  :mod:`~podsrl.tasks.math`, :mod:`~podsrl.tasks.jsonl`, :mod:`~podsrl.tasks.reasoning_gym`: the tasks
- :mod:`~podsrl.tasks.data`: reading a dataset's rows (a local file, or the hub when reachable)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from podsrl.options import SEED, Range, option
from podsrl.registry import Registry, Spec, spec_parts
from podsrl.tasks.arithmetic import build_arithmetic, check_level
from podsrl.tasks.base import (
    REASONING_GYM_PREFIX,
    THINK_ANSWER_SYSTEM_PROMPT,
    Example,
    Messages,
    PreparedSplit,
    Task,
    prepare_split,
    prompt_messages,
    render_prompt,
    reward_columns,
)
from podsrl.tasks.chain import build_chain, check_chain_level
from podsrl.tasks.gsm8k import build_gsm8k
from podsrl.tasks.jsonl import build_jsonl
from podsrl.tasks.math import build_math


@dataclass(frozen=True)
class HeldOutOptions:
    """The held-out split's size: the task generates that many problems (arithmetic, chain,
    reasoning-gym), and evaluation uses that many prompts of any split (the config's field;
    :class:`TaskOptions` and the evaluation's options both read it)."""

    eval_prompts: int = option(
        300, "Held-out prompts per evaluation (the first ones of the split).",
        Range(1, 100_000, why="every evaluation decodes them all; procedural tasks generate them up front"))


@dataclass(frozen=True)
class TaskOptions(HeldOutOptions):
    """Which task the run trains on and where its data comes from (the config's fields of these
    names: the config composes this class)."""

    task: Spec = option("arithmetic", "Task name (registered in podsrl.tasks.TASKS).")
    task_level: int = option(3, "Difficulty level of the procedural tasks: arithmetic 1-5 "
                                "(podsrl.tasks.arithmetic.LEVELS), chain 1-3 "
                                "(podsrl.tasks.chain.CHAIN_LEVELS).",
                             unchecked="checked against the arithmetic and chain tasks' levels "
                                       "(podsrl.config_checks); other tasks ignore it")
    data_seed: int = option(0, "Seed of the task's train/held-out split (not the run seed, nor transformers' "
                               "data_seed), in [0, 2**32 - 1].", SEED)
    train_data: str = option("", "Train data for gsm8k / math / jsonl: a .jsonl / .json / .csv / .parquet "
                                 "file, or a hub dataset 'name' or 'name:config' (empty = the task's hub "
                                 "default); both load through `datasets`.")
    test_data: str = option("", "Held-out data, same forms as train_data (empty = the task's hub default).")
    prompt_column: str = option("prompt", "Prompt column of task 'jsonl': text, or a conversation (a list of "
                                          "{role, content} messages) rendered with the chat template.")
    answer_column: str = option("answer", "Gold-answer column of task 'jsonl'.")
    reasoning_gym_size: int = option(10000, "Train problems generated for a reasoning_gym:NAME task.",
                                     Range(1, 1_000_000, why="generated and held in memory up front"))


TaskBuilder = Callable[[TaskOptions, bool], Task]
# max_completion_length for a task that declares no budget of its own (TRL's default)
DEFAULT_COMPLETION_BUDGET = 256


def budget(tokens: int) -> Callable[[TaskBuilder], TaskBuilder]:
    """Decorator: the completion budget the task's answers need (``max_completion_length`` 0 =
    this): a budget that cuts every answer would train and evaluate nothing."""
    def declare(builder: TaskBuilder) -> TaskBuilder:
        builder.completion_budget = tokens
        return builder
    return declare


def checks(rule: Callable[[TaskOptions], None]) -> Callable[[TaskBuilder], TaskBuilder]:
    """Decorator: ``rule(options)``, the builder's own check of its options (one-line
    ValueError naming the field), run at validation before any data loads."""
    def declare(builder: TaskBuilder) -> TaskBuilder:
        builder.check_options = rule
        return builder
    return declare


TASKS = Registry("task", "task", takes="(options, with_train)", arity=2)


@TASKS.register("arithmetic")
@budget(8)  # "Answer: -123" and an end of sequence, in the tiny model's tokens
@checks(lambda o: check_level(o.task_level, o.eval_prompts))
def arithmetic_task(o: TaskOptions, with_train: bool) -> Task:
    return build_arithmetic(level=o.task_level, num_test=o.eval_prompts, seed=o.data_seed)


@TASKS.register("chain")
@budget(256)  # a worked chain of up to 12 steps, a line each (podsrl.tasks.chain)
@checks(lambda o: check_chain_level(o.task_level))
def chain_task(o: TaskOptions, with_train: bool) -> Task:
    return build_chain(level=o.task_level, num_test=o.eval_prompts, seed=o.data_seed)


@TASKS.register("gsm8k")
@budget(512)  # the paper's completion length for GSM8K and MATH
def gsm8k_task(o: TaskOptions, with_train: bool) -> Task:
    return build_gsm8k(o.train_data, o.test_data, with_train=with_train)


@TASKS.register("math")
@budget(512)
def math_task(o: TaskOptions, with_train: bool) -> Task:
    return build_math(o.train_data, o.test_data, with_train=with_train)


def _needs_test_data(o: TaskOptions) -> None:
    if not o.test_data:
        raise ValueError("test_data: task 'jsonl' needs test_data, the held-out prompts that training and "
                         "`podsrl eval` measure accuracy on (and train_data to train)")


@TASKS.register("jsonl")
@checks(_needs_test_data)
def jsonl_task(o: TaskOptions, with_train: bool) -> Task:
    return build_jsonl(o.train_data, o.test_data, o.prompt_column, o.answer_column, with_train=with_train)


def completion_budget(spec: Spec) -> int:
    """The completion budget task ``spec`` declares (:func:`budget`), else
    :data:`DEFAULT_COMPLETION_BUDGET` (reasoning-gym's tasks, a task unknown or declaring none)."""
    name = spec_parts(spec, "task")[0]
    if name.startswith(REASONING_GYM_PREFIX) or not is_known_task(spec):
        return DEFAULT_COMPLETION_BUDGET
    return getattr(TASKS.resolve(spec), "completion_budget", DEFAULT_COMPLETION_BUDGET)


def is_known_task(spec: Spec) -> bool:
    name = spec_parts(spec, "task")[0]
    return name in TASKS or name.startswith(REASONING_GYM_PREFIX) or ":" in name


def check_task_spec(spec: Spec) -> None:
    """A mapping spec's arguments, against its builder (at start-up, before any data loads)."""
    name, kwargs = spec_parts(spec, "task")
    if kwargs and name.startswith(REASONING_GYM_PREFIX):
        raise ValueError(f"task: {name} takes no arguments "
                         "(its size is reasoning_gym_size, its seed data_seed)")
    if kwargs:
        TASKS.resolve(spec)


def check_task_options(options: TaskOptions) -> None:
    """The task's spec (a mapping's arguments against its builder) and the builder's own rules
    on the options (:func:`checks`), before any data loads."""
    check_task_spec(options.task)
    name = spec_parts(options.task, "task")[0]
    if not name.startswith(REASONING_GYM_PREFIX):
        # declared by checks(), where it is
        rule = getattr(TASKS.resolve(options.task), "check_options", None)
        if rule is not None:
            rule(options)


def build_task(options: TaskOptions, with_train: bool = True) -> Task:
    """The configured task. ``with_train=False`` skips reading the train split (evaluation)."""
    name = spec_parts(options.task, "task")[0]
    if name.startswith(REASONING_GYM_PREFIX):
        check_task_spec(options.task)
        from podsrl.tasks.reasoning_gym import build_reasoning_gym  # optional dependency, imported on use

        return build_reasoning_gym(name[len(REASONING_GYM_PREFIX):], num_train=options.reasoning_gym_size,
                                   num_test=options.eval_prompts, seed=options.data_seed)
    return TASKS.resolve(options.task)(options, with_train)


__all__ = ["DEFAULT_COMPLETION_BUDGET", "TASKS", "THINK_ANSWER_SYSTEM_PROMPT", "Example", "HeldOutOptions",
           "Messages", "PreparedSplit", "Task", "TaskOptions", "budget", "build_task", "check_task_options",
           "check_task_spec", "checks", "completion_budget", "is_known_task", "prepare_split",
           "prompt_messages", "render_prompt", "reward_columns"]

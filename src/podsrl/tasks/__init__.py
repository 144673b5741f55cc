"""Tasks, registered by name. A task builder takes the run config and returns a Task.

Built in: ``arithmetic`` (offline, procedural), ``gsm8k``, ``math`` (MATH / MATH-500),
``jsonl`` (your own data), and ``reasoning_gym:NAME`` for any reasoning-gym dataset.
Register your own with ``TASKS["name"] = builder``, ``builder(cfg, with_train) -> Task``.
"""

from __future__ import annotations

from podsrl.tasks.base import (REASONING_GYM_PREFIX, THINK_ANSWER_SYSTEM_PROMPT, Example, PreparedSplit, Task,
                               prepare_split, render_prompt, reward_columns)


def _arithmetic(cfg, with_train: bool) -> Task:
    from podsrl.tasks.arithmetic import build_arithmetic

    return build_arithmetic(level=cfg.task_level, num_test=cfg.eval_prompts, seed=cfg.data_seed)


def _gsm8k(cfg, with_train: bool) -> Task:
    from podsrl.tasks.math import build_gsm8k

    return build_gsm8k(cfg.train_data, cfg.test_data, with_train=with_train)


def _math(cfg, with_train: bool) -> Task:
    from podsrl.tasks.math import build_math

    return build_math(cfg.train_data, cfg.test_data, with_train=with_train)


def _jsonl(cfg, with_train: bool) -> Task:
    from podsrl.tasks.custom import build_custom

    return build_custom(cfg.train_data, cfg.test_data, cfg.prompt_column, cfg.answer_column, with_train=with_train)


TASKS = {"arithmetic": _arithmetic, "gsm8k": _gsm8k, "math": _math, "jsonl": _jsonl}


def is_known_task(name: str) -> bool:
    return name in TASKS or name.startswith(REASONING_GYM_PREFIX)


def build_task(cfg, with_train: bool = True) -> Task:
    """The configured task. ``with_train=False`` skips reading the train split (evaluation)."""
    if cfg.task.startswith(REASONING_GYM_PREFIX):
        from podsrl.tasks.reasoning_gym_task import build_reasoning_gym

        return build_reasoning_gym(cfg.task[len(REASONING_GYM_PREFIX):], num_train=cfg.reasoning_gym_size,
                                   num_test=cfg.eval_prompts, seed=cfg.data_seed)
    if cfg.task not in TASKS:
        raise ValueError(f"task: unknown task {cfg.task!r}; known: {', '.join(sorted(TASKS))}, "
                         f"{REASONING_GYM_PREFIX}NAME")
    return TASKS[cfg.task](cfg, with_train)


__all__ = ["TASKS", "THINK_ANSWER_SYSTEM_PROMPT", "Example", "PreparedSplit", "Task", "build_task",
           "is_known_task", "prepare_split", "render_prompt", "reward_columns"]

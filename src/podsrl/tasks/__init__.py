"""Tasks, registered by name. A task builder takes the run config and returns a Task."""

from __future__ import annotations

from podsrl.tasks.arithmetic import build_arithmetic
from podsrl.tasks.base import Example, Task


def _arithmetic(cfg) -> Task:
    return build_arithmetic(level=cfg.task_level, num_test=cfg.eval_prompts, seed=cfg.data_seed)


TASKS = {"arithmetic": _arithmetic}


def build_task(cfg) -> Task:
    if cfg.task not in TASKS:
        raise ValueError(f"task: unknown task {cfg.task!r}; known: {sorted(TASKS)}")
    return TASKS[cfg.task](cfg)


__all__ = ["TASKS", "Example", "Task", "build_task"]

"""The reward functions: built-ins (TRL's signature), graders, loading user functions by name,
and the weighted reward stack. The run's scorer, which applies them to a task's rollouts, sits
above both tasks and rewards (:mod:`podsrl.scoring`).

Built-ins are registered by name in ``REWARDS``; user functions load from
``module:function`` or ``path/to/file.py:function`` (:func:`load_reward_fn`). User
functions run in a worker process that a timeout can kill (:mod:`podsrl.rewards.stack`);
:func:`in_process` keeps one in the trainer.

- :mod:`~podsrl.rewards.functions`: the built-in reward functions (TRL's signature)
- :mod:`~podsrl.rewards.grading`: answer extraction and grading for GSM8K and MATH
- :mod:`~podsrl.rewards.stack`: the weighted reward stack, which no function can take down
- :mod:`~podsrl.rewards.worker`: the worker process user functions run in
"""

from __future__ import annotations

from podsrl.rewards.functions import (
    REWARDS,
    arithmetic_correct,
    arithmetic_format,
    bounded,
    chain_format,
    completion_text,
    extract_answer,
    gsm8k_correct,
    math_correct,
    reasoning_gym_correct,
    think_answer_format_soft,
    think_answer_format_strict,
)
from podsrl.rewards.grading import grade
from podsrl.rewards.stack import DEFAULT_REWARD_TIMEOUT, RewardError, RewardFn, RewardStack, in_process


def load_reward_fn(spec: str | dict) -> RewardFn:
    """A registered name, or ``module:function`` (``module`` importable, or a path to a
    ``.py`` file), e.g. ``my_rewards:length_penalty`` or ``./rewards.py:format_reward``
    (:class:`podsrl.registry.Registry`), or a mapping of one and keyword arguments to bind
    (``{"name": "./rewards.py:length_penalty", "limit": 200}``). A module that fails to
    import, for whatever reason, is a one-line ValueError naming it."""
    return REWARDS.resolve(spec)


__all__ = ["DEFAULT_REWARD_TIMEOUT", "REWARDS", "RewardError", "RewardFn", "RewardStack",
           "arithmetic_correct", "arithmetic_format", "bounded", "chain_format", "completion_text",
           "extract_answer", "grade", "gsm8k_correct", "in_process", "load_reward_fn", "math_correct",
           "reasoning_gym_correct", "think_answer_format_soft", "think_answer_format_strict"]

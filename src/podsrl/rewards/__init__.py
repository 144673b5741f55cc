"""The reward stage: built-in reward functions (TRL's signature), graders, loading user
functions by name, the weighted reward stack, and the run's :class:`Scorer`
(rollouts [P, n] -> :class:`podsrl.types.Scores` [P, n]).

Built-ins are registered by name in ``REWARDS``; user functions load from
``module:function`` or ``path/to/file.py:function`` (:func:`load_reward_fn`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from podsrl.rewards.functions import (arithmetic_correct, arithmetic_format, bounded, completion_text, extract_answer,
                                      gsm8k_correct, math_correct, reasoning_gym_correct, think_answer_format_soft,
                                      think_answer_format_strict)
from podsrl.rewards.grading import grade
from podsrl.rewards.stack import RewardError, RewardFn, RewardStack

REWARDS: dict[str, RewardFn] = {
    "arithmetic_correct": arithmetic_correct,
    "arithmetic_format": arithmetic_format,
    "gsm8k_correct": gsm8k_correct,
    "math_correct": math_correct,
    "think_answer_format_strict": think_answer_format_strict,
    "think_answer_format_soft": think_answer_format_soft,
}


def load_reward_fn(spec: str) -> RewardFn:
    """A registered name, or ``module:function`` (``module`` importable, or a path to a
    ``.py`` file), e.g. ``my_rewards:length_penalty`` or ``./rewards.py:format_reward``."""
    if spec in REWARDS:
        return REWARDS[spec]
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward_funcs: {spec!r} is neither a built-in reward ({', '.join(sorted(REWARDS))}) "
                         f"nor 'module:function'")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser().resolve()
            if not path.is_file():
                raise FileNotFoundError(f"reward_funcs: file not found: {path}")
            module = sys.modules.get(path.stem)
            if getattr(module, "__file__", None) != str(path):  # load each file once, like an import
                spec_obj = importlib.util.spec_from_file_location(path.stem, path)
                module = importlib.util.module_from_spec(spec_obj)
                spec_obj.loader.exec_module(module)
                sys.modules[path.stem] = module
        else:
            module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward_funcs: cannot import module {module_name!r} for {spec!r}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward_funcs: {module_name!r} has no function {attr!r}")
    return fn


__all__ = ["REWARDS", "RewardError", "RewardFn", "RewardStack", "arithmetic_correct", "arithmetic_format", "bounded",
           "completion_text", "extract_answer", "grade", "gsm8k_correct", "load_reward_fn", "math_correct",
           "reasoning_gym_correct", "think_answer_format_soft", "think_answer_format_strict"]

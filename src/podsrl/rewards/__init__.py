"""The reward stage: built-in reward functions (TRL's signature), graders, loading user
functions by name, the weighted reward stack, and the run's :class:`Scorer`
(rollouts [P, n] -> :class:`podsrl.types.Scores` [P, n]).

Built-ins are registered by name in ``REWARDS``; user functions load from
``module:function`` or ``path/to/file.py:function`` (:func:`load_reward_fn`). User
functions run in a worker process that a timeout can kill (:mod:`podsrl.rewards.stack`);
:func:`in_process` keeps one in the trainer.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path

from podsrl.rewards.functions import (arithmetic_correct, arithmetic_format, bounded, completion_text, extract_answer,
                                      gsm8k_correct, math_correct, reasoning_gym_correct, think_answer_format_soft,
                                      think_answer_format_strict)
from podsrl.rewards.grading import grade
from podsrl.rewards.stack import DEFAULT_REWARD_TIMEOUT, RewardError, RewardFn, RewardStack, error_line, in_process

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
    ``.py`` file), e.g. ``my_rewards:length_penalty`` or ``./rewards.py:format_reward``.
    A module that fails to import, for whatever reason, is a one-line ValueError naming it."""
    if spec in REWARDS:
        return REWARDS[spec]
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward_funcs: {spec!r} is neither a built-in reward ({', '.join(sorted(REWARDS))}) "
                         f"nor 'module:function'")
    module = _load_file(module_name) if module_name.endswith(".py") else _import(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward_funcs: {module_name!r} has no function {attr!r}")
    return fn


def _import(name: str):
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as err:  # whatever the module raises at import (not a Ctrl-C)
        raise ValueError(f"reward_funcs: cannot import module {name!r} ({error_line(err)})") from None


def _load_file(given: str):
    """The module of a reward file, loaded once (as import does: the same file gives the same
    functions) under a private name, ``podsrl_reward_file_<stem>_<hash of its path>``: a file
    named like a module (``json.py``) must not replace that module in ``sys.modules``."""
    path = Path(given).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"reward_funcs: file not found: {path}")
    stem = re.sub(r"\W", "_", path.stem)
    name = f"podsrl_reward_file_{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs, as import does: dataclasses and pickle look it up there
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # whatever the file raises at import (not a Ctrl-C)
        del sys.modules[name]
        raise ValueError(f"reward_funcs: cannot load {given} ({error_line(err)}{_line_in(err, path)})") from None
    return module


def _line_in(err: BaseException, path: Path) -> str:
    """``, line N``: the last line of ``path`` the error passed through (a SyntaxError names
    its own line in its message)."""
    if isinstance(err, SyntaxError):
        return ""
    lines = [tb.tb_lineno for tb in _frames(err.__traceback__) if tb.tb_frame.f_code.co_filename == str(path)]
    return f", line {lines[-1]}" if lines else ""


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


__all__ = ["DEFAULT_REWARD_TIMEOUT", "REWARDS", "RewardError", "RewardFn", "RewardStack", "arithmetic_correct",
           "arithmetic_format", "bounded", "completion_text", "extract_answer", "grade", "gsm8k_correct", "in_process",
           "load_reward_fn", "math_correct", "reasoning_gym_correct", "think_answer_format_soft",
           "think_answer_format_strict"]

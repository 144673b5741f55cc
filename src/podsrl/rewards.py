"""Verifiable reward functions.

Every reward function has TRL's signature ``fn(prompts, completions, **columns) ->
list[float | None]`` (``None`` = not verifiable for that sample), so a function written
for TRL's ``GRPOTrainer`` plugs in unchanged. Built-ins are registered by name in
``REWARDS``; user functions load from ``module:function`` (``load_reward_fn``). A run's
reward is a weighted sum of functions (``RewardStack``), with a policy for functions that
raise or hang.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.util
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from podsrl.grading import (grade, gsm8k_correct, math_correct, think_answer_format_soft,
                            think_answer_format_strict)

RewardFn = Callable[..., list]

# "Answer: 42" anywhere; the LAST occurrence is the model's final answer. ASCII digits
# only: the requested format is ASCII.
_ANSWER = re.compile(r"Answer:\s*(-?\d+)", re.ASCII)
# The whole completion is exactly the requested format (surrounding whitespace allowed).
_STRICT_FORMAT = re.compile(r"\s*Answer: -?\d+\s*", re.ASCII)


def extract_answer(completion: str) -> str | None:
    """The integer after the last ``Answer:`` in the completion, or None."""
    found = _ANSWER.findall(completion)
    return found[-1] if found else None


def arithmetic_correct(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str],
                       **_columns) -> list[float]:
    """1.0 when the extracted integer equals the gold answer exactly, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer):
        predicted = extract_answer(completion)
        rewards.append(float(predicted is not None and int(predicted) == int(gold)))
    return rewards


def arithmetic_format(prompts: Sequence[str], completions: Sequence[str], **_columns) -> list[float]:
    """1.0 when the completion is exactly ``Answer: <integer>``, else 0.0."""
    return [float(_STRICT_FORMAT.fullmatch(c) is not None) for c in completions]


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


class RewardError(RuntimeError):
    """A reward function failed under the ``raise`` policy."""


@dataclass
class RewardStack:
    """Weighted sum of reward functions with an error policy.

    ``error_policy="raise"``: a function that raises, hangs past ``timeout`` seconds or
    returns a malformed value stops the run with its name and the failing prompt index.
    ``"zero"``: the failing samples score 0 from that function and are counted in
    ``failures`` (logged in metrics as ``reward_failures``).
    """

    fns: list[RewardFn]
    weights: list[float]
    error_policy: str = "raise"
    timeout: float = 0.0
    failures: int = field(default=0, init=False)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str],
                 columns: dict[str, list]) -> torch.Tensor:
        """Rewards ``[len(completions)]``; NaN where every function returned None."""
        total = torch.zeros(len(completions), dtype=torch.float64)
        verifiable = torch.zeros(len(completions), dtype=torch.bool)
        for fn, weight in zip(self.fns, self.weights):
            for i, value in enumerate(self._call(fn, prompts, completions, columns)):
                if value is not None:
                    total[i] += weight * value
                    verifiable[i] = True
        total[~verifiable] = float("nan")
        return total.float()

    def _call(self, fn: RewardFn, prompts, completions, columns) -> list[float | None]:
        try:
            return _checked(fn, self._run(fn, list(prompts), list(completions), columns), len(completions))
        except concurrent.futures.TimeoutError:
            if self.error_policy == "raise":
                raise RewardError(f"reward function {_name(fn)} timed out after {self.timeout}s "
                                  f"on a batch of {len(completions)} completions") from None
            self.failures += len(completions)  # retrying one by one could hang N times
            return [0.0] * len(completions)
        except Exception as batch_error:  # find which sample fails, then apply the policy
            values = []
            for i in range(len(completions)):
                one = {k: v[i:i + 1] for k, v in columns.items()}
                try:
                    values += _checked(fn, self._run(fn, [prompts[i]], [completions[i]], one), 1)
                except Exception as err:
                    if self.error_policy == "raise":
                        raise RewardError(f"reward function {_name(fn)} failed on prompt index {i} "
                                          f"({type(err).__name__}: {err})") from err
                    self.failures += 1
                    values.append(0.0)
            if self.error_policy == "raise":  # every sample passes alone: the batch call is at fault
                raise RewardError(f"reward function {_name(fn)} failed on the batch: {batch_error}") from batch_error
            return values

    def _run(self, fn, prompts, completions, columns):
        if not self.timeout:
            return fn(prompts=prompts, completions=completions, **columns)
        # A thread, not SIGALRM: the math grader uses signals itself. A hung function's
        # thread cannot be killed; it is abandoned (daemon) and the policy applies.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            return pool.submit(fn, prompts=prompts, completions=completions, **columns).result(self.timeout)
        finally:
            pool.shutdown(wait=False)


def _name(fn) -> str:
    return getattr(fn, "__name__", repr(fn))


def _checked(fn, values, expected: int) -> list[float | None]:
    """Reject wrong lengths and non-finite values, naming the function."""
    values = list(values) if values is not None else []
    if len(values) != expected:
        raise ValueError(f"reward function {_name(fn)} returned {len(values)} values for {expected} completions")
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"reward function {_name(fn)} returned {v!r}")
        out.append(v)
    return out


__all__ = ["REWARDS", "RewardError", "RewardStack", "arithmetic_correct", "arithmetic_format", "extract_answer",
           "grade", "load_reward_fn"]

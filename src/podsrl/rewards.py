"""Verifiable reward functions.

Every reward function has TRL's signature ``fn(prompts, completions, **columns) ->
list[float | None]`` (``None`` = not verifiable for that sample), so a function written
for TRL's ``GRPOTrainer`` plugs in unchanged. They are registered by name in ``REWARDS``;
a task's reward is a weighted sum of registered functions (``combine``).
"""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import torch

RewardFn = Callable[..., list]

# "Answer: 42" anywhere; the LAST occurrence is the model's final answer.
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
}


def combine(reward_fns: Sequence[RewardFn], weights: Sequence[float], prompts: Sequence[str],
            completions: Sequence[str], columns: dict[str, list]) -> torch.Tensor:
    """Weighted sum of reward functions, as a float tensor ``[len(completions)]``.

    A ``None`` from one function counts as 0 for that function; a sample for which every
    function returns ``None`` is not verifiable and gets NaN, which the caller must handle.
    Non-finite or wrong-length outputs are rejected with the function's name.
    """
    total = torch.zeros(len(completions), dtype=torch.float64)
    verifiable = torch.zeros(len(completions), dtype=torch.bool)
    for fn, weight in zip(reward_fns, weights):
        values = fn(prompts=list(prompts), completions=list(completions), **columns)
        name = getattr(fn, "__name__", repr(fn))
        if len(values) != len(completions):
            raise ValueError(f"reward function {name} returned {len(values)} values "
                             f"for {len(completions)} completions")
        for i, v in enumerate(values):
            if v is None:
                continue
            if not math.isfinite(float(v)):
                raise ValueError(f"reward function {name} returned {v!r} for completion {i}")
            total[i] += weight * float(v)
            verifiable[i] = True
    total[~verifiable] = float("nan")
    return total.float()

"""Built-in reward functions, with TRL's signature ``fn(prompts, completions, **columns)
-> list[float | None]`` (``None`` = not verifiable for that sample), so they plug into
TRL's ``GRPOTrainer`` unchanged and TRL users' functions plug into podsrl.

Completions may be strings or, as TRL passes them for conversational data, message lists
(:func:`completion_text`). Dataset columns arrive as keyword arguments under their own
names, raw (``answer``: the data's own answer column, e.g. GSM8K's solution ending in
``#### 42``, or the gold answer when the data has none).
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, Sequence

from podsrl.registry import Registry
from podsrl.rewards.grading import extract_final_answer, grade, gsm8k_gold, last_boxed

# "Answer: 42" anywhere; the LAST occurrence is the model's final answer. ASCII digits
# only: the requested format is ASCII.
_ANSWER = re.compile(r"Answer:\s*(-?\d+)", re.ASCII)
# The whole completion is exactly the requested format (surrounding whitespace allowed).
_STRICT_FORMAT = re.compile(r"\s*Answer: -?\d+\s*", re.ASCII)
# The chain task's worked format: "k: a op b = c" lines, then "Answer: c" (podsrl.tasks.chain).
_WORKED_FORMAT = re.compile(r"\s*(?:\d+: -?\d+ [+-] \d+ = -?\d+\n)+Answer: -?\d+\s*", re.ASCII)


def bounded(low: float, high: float):
    """Declare that a reward function's values lie in [low, high] (its ``reward_bounds``
    attribute). Early stop (``group_early_stop``) needs every reward function's bounds;
    any function can declare them: ``my_reward.reward_bounds = (0.0, 1.0)``."""
    bounds = checked_bounds((low, high), "bounded(low, high)")

    def declare(fn):
        fn.reward_bounds = bounds
        return fn
    return declare


def checked_bounds(declared: Any, name: str) -> tuple[float, float]:
    """``declared`` reward bounds as (low, high): two finite real numbers, low <= high; anything
    else (strings, three numbers, reversed bounds) is an error naming ``name``. Early stop's
    "lossless" rests on them, so they are refused, never guessed at or swapped."""
    if not (isinstance(declared, (tuple, list)) and len(declared) == 2
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                    for v in declared)):
        raise ValueError(f"{name}: reward_bounds must be two finite numbers (low, high), got {declared!r}")
    low, high = float(declared[0]), float(declared[1])
    if low > high:
        raise ValueError(f"{name}: reward_bounds {declared!r} are reversed (low {low:g} is above high "
                         f"{high:g})")
    return low, high


# the built-in reward functions, each registered where it is defined (below)
REWARDS = Registry("reward function", "reward_funcs", takes="fn(prompts, completions, **columns)", many=True,
                   # by each call
                   passes=("prompts", "completions", "completion_ids", "trainer_state", "log_extra",
                           "log_metric"))


def extract_answer(completion: str) -> str | None:
    """The integer after the last ``Answer:`` in the completion, or None."""
    found = _ANSWER.findall(completion)
    return found[-1] if found else None


@REWARDS.register("arithmetic_correct")
@bounded(0.0, 1.0)
def arithmetic_correct(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any],
                       **_columns) -> list[float]:
    """1.0 when the extracted integer equals the gold answer exactly, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer):
        predicted = extract_answer(completion_text(completion))
        rewards.append(float(predicted is not None and int(predicted) == int(gold)))
    return rewards


@REWARDS.register("arithmetic_format")
@bounded(0.0, 1.0)
def arithmetic_format(prompts: Sequence[Any], completions: Sequence[Any], **_columns) -> list[float]:
    """1.0 when the completion is exactly ``Answer: <integer>``, else 0.0."""
    return [float(_STRICT_FORMAT.fullmatch(completion_text(c)) is not None) for c in completions]


@REWARDS.register("chain_format")
@bounded(0.0, 1.0)
def chain_format(prompts: Sequence[Any], completions: Sequence[Any], **_columns) -> list[float]:
    """1.0 when the completion is worked lines ``k: a op b = c`` followed by ``Answer: <integer>``
    (the chain task's format; the lines' arithmetic is not checked: the answer's reward grades it)."""
    return [float(_WORKED_FORMAT.fullmatch(completion_text(c)) is not None) for c in completions]


def completion_text(completion: Any) -> str:
    """Plain text of a completion: TRL passes a string, or (conversational) a message list."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion:
        content = completion[-1].get("content", "") if isinstance(completion[-1], dict) else completion[-1]
        if isinstance(content, list):  # multimodal-style parts: [{"type": "text", "text": ...}]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else ""
    return ""


@REWARDS.register("think_answer_format_strict")
@bounded(0.0, 1.0)
def think_answer_format_strict(prompts: Sequence[Any], completions: Sequence[Any], **_columns) -> list[float]:
    """1.0 for exactly ``<think>...</think> <answer>...</answer>`` and nothing else.

    Counting the tags first makes "exactly one of each" explicit instead of relying on a
    tempered regex, and keeps the check linear on long completions.
    """
    rewards = []
    for c in completions:
        text = completion_text(c).strip()
        once = all(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))
        ok = once and re.fullmatch(r"<think>.*?</think>\s*<answer>.*?</answer>", text, re.DOTALL)
        rewards.append(1.0 if ok else 0.0)
    return rewards


@REWARDS.register("think_answer_format_soft")
@bounded(0.0, 1.0)
def think_answer_format_soft(prompts: Sequence[Any], completions: Sequence[Any], **_columns) -> list[float]:
    """1.0 when a complete ``<answer>...</answer>`` block exists anywhere; no partial credit,
    since a half tag is not something the extractor can use."""
    rewards = []
    for c in completions:
        text = completion_text(c)
        close = text.rfind("</answer>")
        rewards.append(1.0 if close >= 0 and text.rfind("<answer>", 0, close) >= 0 else 0.0)
    return rewards


def _correct(task: str, completions: Sequence[Any], answer: Sequence[Any]) -> list[float]:
    return [float(grade(completion_text(c), str(g), task)) for c, g in zip(completions, answer, strict=True)]


@REWARDS.register("gsm8k_correct")
@bounded(0.0, 1.0)
def gsm8k_correct(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str],
                  **_columns) -> list[float]:
    """1.0 when the final answer equals the GSM8K gold number. ``answer``: GSM8K's own
    column (the solution; its gold is the text after the last ``####``) or the number."""
    return _correct("gsm8k", completions, [gsm8k_gold(str(g)) for g in answer])


@REWARDS.register("math_correct")
@bounded(0.0, 1.0)
def math_correct(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any],
                 solution: Sequence[Any] | None = None, **_columns) -> list[float]:
    """1.0 when the final answer equals the MATH gold LaTeX: the ``answer`` column, or
    where that is empty the last ``\\boxed{}`` of the ``solution`` column (original MATH)."""
    solution = solution if solution is not None else [None] * len(answer)
    golds = [a if a is not None and str(a).strip() else (last_boxed(str(s or "")) or "")
             for a, s in zip(answer, solution, strict=True)]
    return _correct("math", completions, golds)


def math_correct_on(column: str):
    """:func:`math_correct` against the gold answers of ``column`` (task jsonl's
    ``answer_column``), whatever the data's ``answer`` column holds."""
    if column == "answer":
        return math_correct

    @bounded(0.0, 1.0)
    def correct(prompts, completions, **columns):
        return _correct("math", completions, columns[column])

    correct.__name__ = f"math_correct_{column}"
    return correct


def reasoning_gym_correct(dataset, name: str):
    """The correctness reward of a reasoning-gym dataset: 1.0 when reasoning-gym's own
    scorer gives full marks to the extracted answer. Partial credit (some datasets give
    0.01 for a wrong answer) counts as wrong, so the metric stays an accuracy. The entry
    that generated each problem travels as the ``rg_entry`` column."""
    @bounded(0.0, 1.0)
    def correct(prompts, completions, rg_entry, **_columns):
        return [float(dataset.score_answer(answer=extract_final_answer(completion_text(c)),
                                           entry=entry) >= 1.0)
                for c, entry in zip(completions, rg_entry)]

    correct.__name__ = f"reasoning_gym_{name}_correct"
    return correct

"""The built-in offline reasoning task ``chain``: multi-step arithmetic worked one step per line.

Why this design (#58; docs/tasks.md): users' RLVR runs write chains of thought whose lengths
vary by an order of magnitude, where generation and its long tail decide a step's time. A
problem is a start and numbered steps, ``Start at 37 and apply 1: +8, 2: -5, 3: +4.``; the
model writes each step on its own line, numbered, and then the answer::

    1: 37 + 8 = 45
    2: 45 - 5 = 40
    3: 40 + 4 = 44
    Answer: 44

so a completion's length is set by the problem (about 13 tokens per step with the digit-split
tokenizers of the tiny models), and the number of steps is drawn log-uniformly from 1 to the
level's maximum: most chains are short, a few are long (level 3: median 4 steps, p99 16), as
chain-of-thought lengths are. Errors compound along a chain, so long problems are also the
hard ones. Graded on the final answer (``arithmetic_correct``) plus the worked format
(``chain_format``); the held-out split is drawn first and train never holds one of its chains.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

from podsrl.rewards.functions import arithmetic_correct, chain_format, extract_answer
from podsrl.tasks.arithmetic import evaluate_expression
from podsrl.tasks.base import Example, Task

PROMPT_TEMPLATE = ("Start at {start} and apply {steps}. Work it out one step per line, then answer in "
                   "format: 'Answer: {{result}}'\n")


@dataclass(frozen=True)
class ChainLevel:
    """One difficulty level: a start in [0, max_start], then 1 to ``max_steps`` operations
    (``+`` / ``-``) on operands drawn from [1, max_operand]."""

    max_steps: int
    max_operand: int
    max_start: int = 99


# Single-digit operands: each line is a small addition a model of 1M parameters learns to near
# certainty in minutes on a CPU, so a chain's failures come from its length (every line may
# slip), not from arithmetic it cannot do (2-digit operands: 0.5% greedy after 400 SFT steps).
CHAIN_LEVELS: dict[int, ChainLevel] = {
    1: ChainLevel(max_steps=4, max_operand=9, max_start=20),
    2: ChainLevel(max_steps=8, max_operand=9),
    3: ChainLevel(max_steps=16, max_operand=9),
}


def draw_steps(rng: random.Random, max_steps: int) -> int:
    """Steps of one chain, log-uniform on [1, max_steps]: round(2^u), u ~ U(0, log2 max_steps).
    Level 3 (16): P(1 step) = 0.15, median 4, p99 16, so the longest completions are about four
    times the median one (the long tail)."""
    return max(1, min(max_steps, round(2 ** rng.uniform(0.0, math.log2(max_steps)))))


def random_chain(rng: random.Random, level: ChainLevel) -> str:
    terms = [str(rng.randint(0, level.max_start))]
    for _ in range(draw_steps(rng, level.max_steps)):
        terms += [rng.choice("+-"), str(rng.randint(1, level.max_operand))]
    return " ".join(terms)


def worked_solution(expression: str, slip: Callable[[int], int] | None = None) -> str:
    """The completion the task asks for: one numbered ``k: a op b = c`` line per operation, then
    the answer. ``slip(c)`` (the warm start's spread, podsrl.build.tiny_chain) writes a line's
    result as another number, which the following lines carry on from."""
    tokens = expression.split()
    value, lines = int(tokens[0]), []
    for k, (op, operand) in enumerate(zip(tokens[1::2], tokens[2::2]), start=1):
        result = value + int(operand) if op == "+" else value - int(operand)
        result = slip(result) if slip else result
        lines.append(f"{k}: {value} {op} {operand} = {result}")
        value = result
    return "\n".join(lines) + f"\nAnswer: {value}"


def chain_prompt(expression: str) -> str:
    """``Start at 37 and apply 1: +8, 2: -5, 3: +4. ...``: numbered steps, so the line of step k
    finds its operation by its number (a lookup small models learn in minutes; finding the k-th
    operation of ``37 + 8 - 5 + 4`` by position, where single-digit operations repeat, they did
    not: 51 of 58 first errors were wrong operations after 600 SFT steps)."""
    tokens = expression.split()
    steps = ", ".join(f"{k}: {op}{operand}"
                      for k, (op, operand) in enumerate(zip(tokens[1::2], tokens[2::2]), 1))
    return PROMPT_TEMPLATE.format(start=tokens[0], steps=steps)


def make_chain_example(expression: str) -> Example:
    """``columns``: ``chain`` (the expression, ``37 + 8 - 5 + 4``) and ``steps``; reward functions
    get both as keyword arguments."""
    return Example(prompt=chain_prompt(expression), answer=str(evaluate_expression(expression)),
                   columns={"chain": expression, "steps": len(expression.split()) // 2})


def check_chain_level(level: int) -> None:
    if level not in CHAIN_LEVELS:
        raise ValueError(f"task_level: unknown chain level {level}; known: {sorted(CHAIN_LEVELS)}")


def build_chain(level: int = 3, num_train: int = 20000, num_test: int = 500, seed: int = 0) -> Task:
    """Seeded train / held-out splits of distinct chains that never overlap (the spaces are
    far larger than the splits: level 1 alone holds over 10^6 chains of 4 steps; chains of one
    step, 18 x (max_start + 1) of them, repeat, so train holds fewer of them than drawn)."""
    check_chain_level(level)
    spec = CHAIN_LEVELS[level]
    rng = random.Random(f"podsrl-chain-{level}-{seed}")
    held_out: dict[str, None] = {}
    while len(held_out) < num_test:
        held_out.setdefault(random_chain(rng, spec))
    train: dict[str, None] = {}
    while len(train) < num_train:
        expression = random_chain(rng, spec)
        if expression not in held_out:
            train.setdefault(expression)
    return Task(name="chain", train=[make_chain_example(e) for e in train],
                test=[make_chain_example(e) for e in held_out],
                correct_fn=arithmetic_correct, format_fn=chain_format, extract_fn=extract_answer)

"""The built-in offline arithmetic task.

Prompts follow the style of the PODS authors' slides: ``What is 3 + 7? Answer in format: 'Answer: {result}'``.
Problems come from a seeded procedural generator with difficulty levels; the held-out
split is drawn first and the train split never contains one of its expressions, so
held-out accuracy measures generalisation, not recall.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from podsrl.rewards.functions import arithmetic_correct, arithmetic_format, extract_answer
from podsrl.tasks.base import Example, Task

PROMPT_TEMPLATE = "What is {expression}? Answer in format: 'Answer: {{result}}'\n"


@dataclass(frozen=True)
class Level:
    """One difficulty level: operands are drawn from [0, max_operand], joined by ``num_ops``
    operators from ``ops``."""

    max_operand: int
    ops: str
    num_ops: int


LEVELS: dict[int, Level] = {
    1: Level(max_operand=20, ops="+", num_ops=1),
    2: Level(max_operand=50, ops="+-", num_ops=1),
    3: Level(max_operand=99, ops="+-", num_ops=1),
    4: Level(max_operand=99, ops="+-", num_ops=2),
    5: Level(max_operand=999, ops="+-", num_ops=2),
}


def space_size(level: Level) -> int:
    """Number of distinct expressions the level can produce."""
    return (level.max_operand + 1) ** (level.num_ops + 1) * len(level.ops) ** level.num_ops


def random_expression(rng: random.Random, level: Level) -> str:
    terms = [str(rng.randint(0, level.max_operand))]
    for _ in range(level.num_ops):
        terms += [rng.choice(level.ops), str(rng.randint(0, level.max_operand))]
    return " ".join(terms)


def evaluate_expression(expression: str) -> int:
    """Left-to-right evaluation of ``a op b op c`` with + and - (no eval())."""
    tokens = expression.split()
    value = int(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        value = value + int(operand) if op == "+" else value - int(operand)
    return value


def make_example(expression: str) -> Example:
    return Example(prompt=PROMPT_TEMPLATE.format(expression=expression),
                   answer=str(evaluate_expression(expression)))


def check_level(level: int, num_test: int) -> None:
    """A known level with more distinct problems than ``num_test`` held out (at validation too)."""
    if level not in LEVELS:
        raise ValueError(f"task_level: unknown arithmetic level {level}; known: {sorted(LEVELS)}")
    total = space_size(LEVELS[level])
    if num_test >= total:
        raise ValueError(f"eval_prompts: level {level} has only {total} distinct problems; hold out fewer "
                         f"than that (got {num_test})")


def build_arithmetic(level: int = 3, num_train: int = 20000, num_test: int = 500,
                     seed: int = 0) -> Task:
    """Seeded train / held-out splits of distinct expressions that never overlap.

    When the level's expression space is smaller than ``num_train + num_test`` the train
    split gets every expression not held out (so it is smaller than asked).
    """
    check_level(level, num_test)
    spec = LEVELS[level]
    total = space_size(spec)
    rng = random.Random(f"podsrl-arithmetic-{level}-{seed}")
    held_out: dict[str, None] = {}
    while len(held_out) < num_test:
        held_out.setdefault(random_expression(rng, spec))
    train: dict[str, None] = {}
    target = min(num_train, total - num_test)
    # Rejection sampling is fine while the space is large; near exhaustion enumerate instead.
    if target > total // 2:
        for expression in _enumerate(spec):
            if expression not in held_out:
                train.setdefault(expression)
        order = list(train)
        rng.shuffle(order)
        train = dict.fromkeys(order[:target])
    else:
        while len(train) < target:
            expression = random_expression(rng, spec)
            if expression not in held_out:
                train.setdefault(expression)
    return Task(name="arithmetic",
                train=[make_example(e) for e in train],
                test=[make_example(e) for e in held_out],
                correct_fn=arithmetic_correct, format_fn=arithmetic_format, extract_fn=extract_answer)


def _enumerate(spec: Level):
    def rec(prefix: list[str], remaining: int):
        if remaining == 0:
            yield " ".join(prefix)
            return
        for op in spec.ops:
            for b in range(spec.max_operand + 1):
                yield from rec(prefix + [op, str(b)], remaining - 1)

    for a in range(spec.max_operand + 1):
        yield from rec([str(a)], spec.num_ops)

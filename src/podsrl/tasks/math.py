"""MATH (Hendrycks et al. 2021) and MATH-500, one of the paper's tasks: the gold answer is
the ``answer`` field (MATH-500) or the solution's last ``\\boxed{}``, graded by
:func:`podsrl.rewards.grading.grade`. Prompts ask for the ``<think>...</think><answer>...</answer>``
format.
"""

from __future__ import annotations

from podsrl.rewards.functions import math_correct
from podsrl.rewards.grading import math_gold
from podsrl.tasks.base import Example, Task, think_answer_task
from podsrl.tasks.data import read_rows, require_column, require_text

# hub datasets used when no local file is given (users with network)
HUB_DEFAULTS = ("DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")


def math_examples(spec: str, split: str, field_name: str) -> list[Example]:
    out = []
    for i, row in enumerate(read_rows(spec, split=split, field_name=field_name)):
        problem = require_text(row, "problem", spec, field_name, i)
        if not row.get("answer"):
            require_column(row, "solution", spec, field_name, i)
        gold = math_gold(row)
        if not gold:
            raise ValueError(f"{field_name}: {spec} row {i}: no `answer` and no \\boxed{{}} in `solution`")
        out.append(Example(prompt=problem, answer=gold, columns={"solution": row.get("solution", "")}))
    return out


def build_math(train_data: str = "", test_data: str = "", with_train: bool = True) -> Task:
    return think_answer_task("math", math_examples, train_data, test_data, HUB_DEFAULTS, with_train, math_correct)

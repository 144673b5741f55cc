"""MATH (Hendrycks et al. 2021) and MATH-500, one of the paper's tasks: the gold answer is
the ``answer`` field (MATH-500) or the solution's last ``\\boxed{}``, graded by
:func:`podsrl.rewards.grading.grade`. Prompts ask for the ``<think>...</think><answer>...</answer>``
format.
"""

from __future__ import annotations

from podsrl.rewards.functions import math_correct
from podsrl.rewards.grading import math_gold
from podsrl.tasks.base import Example, Task, dataset_columns, think_answer_task
from podsrl.tasks.data import read_rows, require_column, require_text

# hub datasets used when no local file is given (users with network)
HUB_DEFAULTS = ("DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")


def math_examples(spec: str, split: str, field_name: str) -> list[Example]:
    """The ``problem`` is the prompt; reward functions get the raw columns (``solution``,
    ``answer`` where the data has it, else the gold answer)."""
    rows = read_rows(spec, split=split, field_name=field_name)
    out = []
    for i, row in rows:
        problem = require_text(rows, i, "problem")
        if not row.get("answer"):
            require_column(rows, i, "solution")
        try:
            gold = math_gold(row)
        except ValueError:
            raise ValueError(f"{rows.where(i)}: no `answer` and no \\boxed{{}} in `solution`") from None
        out.append(Example(prompt=problem, answer=gold, columns=dataset_columns(row)))
    return out


def build_math(train_data: str = "", test_data: str = "", with_train: bool = True) -> Task:
    return think_answer_task("math", math_examples, train_data, test_data, HUB_DEFAULTS, with_train,
                             math_correct)

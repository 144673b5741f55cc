"""GSM8K (Cobbe et al. 2021), one of the paper's tasks: grade-school word problems whose
gold answer is the text after ``####``, graded by :func:`podsrl.rewards.grading.grade`.
Prompts ask for the ``<think>...</think><answer>...</answer>`` format.
"""

from __future__ import annotations

from podsrl.rewards.functions import gsm8k_correct
from podsrl.rewards.grading import gsm8k_gold
from podsrl.tasks.base import Example, Task, dataset_columns, think_answer_task
from podsrl.tasks.data import read_rows, require_column, require_text

# hub datasets used when no local file is given (users with network)
HUB_DEFAULTS = ("openai/gsm8k:main", "openai/gsm8k:main")


def gsm8k_examples(spec: str, split: str, field_name: str) -> list[Example]:
    """The ``question`` is the prompt; reward functions get the raw columns (``answer`` is
    the whole solution ending in ``#### 42``; gsm8k_correct takes the text after ``####``)."""
    rows = read_rows(spec, split=split, field_name=field_name)
    out = []
    for i, row in rows:
        question = require_text(rows, i, "question")
        solution = str(require_column(rows, i, "answer"))
        out.append(Example(prompt=question, answer=gsm8k_gold(solution), columns=dataset_columns(row)))
    return out


def build_gsm8k(train_data: str = "", test_data: str = "", with_train: bool = True) -> Task:
    return think_answer_task("gsm8k", gsm8k_examples, train_data, test_data, HUB_DEFAULTS, with_train,
                             gsm8k_correct)

"""GSM8K and MATH (incl. MATH-500): the paper's tasks, graded by ``podsrl.grading``.

Prompts ask for the ``<think>...</think><answer>...</answer>`` format; the gold answer is
GSM8K's text after ``####`` and MATH's ``answer`` field (or its solution's last
``\\boxed{}``).
"""

from __future__ import annotations

from podsrl.grading import (extract_final_answer, gsm8k_correct, gsm8k_gold, math_correct, math_gold,
                            think_answer_format_strict)
from podsrl.tasks.base import THINK_ANSWER_SYSTEM_PROMPT, Example, Task
from podsrl.tasks.data import read_rows, require_column, require_text

# hub datasets used when no local file is given (users with network)
HUB_DEFAULTS = {
    "gsm8k": ("openai/gsm8k:main", "openai/gsm8k:main"),
    "math": ("DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"),
}


def gsm8k_examples(spec: str, split: str, field_name: str) -> list[Example]:
    out = []
    for i, row in enumerate(read_rows(spec, split=split, field_name=field_name)):
        question = require_text(row, "question", spec, field_name, i)
        solution = require_column(row, "answer", spec, field_name, i)
        out.append(Example(prompt=question, answer=gsm8k_gold(solution), columns={"solution": solution}))
    return out


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


def _build(name: str, read_examples, correct_fn, train_data: str, test_data: str, with_train: bool) -> Task:
    default_train, default_test = HUB_DEFAULTS[name]
    train = read_examples(train_data or default_train, "train", "train_data") if with_train else []
    return Task(name=name, train=train, test=read_examples(test_data or default_test, "test", "test_data"),
                correct_fn=correct_fn, format_fn=think_answer_format_strict, extract_fn=extract_final_answer,
                system_prompt=THINK_ANSWER_SYSTEM_PROMPT)


def build_gsm8k(train_data: str = "", test_data: str = "", with_train: bool = True) -> Task:
    return _build("gsm8k", gsm8k_examples, gsm8k_correct, train_data, test_data, with_train)


def build_math(train_data: str = "", test_data: str = "", with_train: bool = True) -> Task:
    return _build("math", math_examples, math_correct, train_data, test_data, with_train)

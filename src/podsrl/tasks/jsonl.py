"""User data: a JSONL / parquet / hub dataset with configurable prompt and answer columns.

Every other column reaches reward functions as a keyword argument (TRL's convention), so
``fn(prompts, completions, answer, difficulty, **kw)`` sees a ``difficulty`` column.
Correctness defaults to mathematical equivalence of the final answer (``grade(...,
"math")``); pass your own reward functions with ``reward_funcs``.
"""

from __future__ import annotations

from podsrl.rewards.functions import extract_final_answer, math_correct, think_answer_format_soft
from podsrl.tasks.base import Example, Task
from podsrl.tasks.data import read_rows, require_column, require_text


def jsonl_examples(spec: str, split: str, field_name: str, prompt_column: str, answer_column: str) -> list[Example]:
    out = []
    for i, row in enumerate(read_rows(spec, split=split, field_name=field_name)):
        prompt = require_text(row, prompt_column, spec, field_name, i)
        answer = require_column(row, answer_column, spec, field_name, i)
        columns = {k: v for k, v in row.items() if k not in (prompt_column, answer_column, "_line")}
        out.append(Example(prompt=prompt, answer=str(answer), columns=columns))
    return out


def build_jsonl(train_data: str, test_data: str, prompt_column: str = "prompt", answer_column: str = "answer",
                 system_prompt: str = "", with_train: bool = True) -> Task:
    if with_train and not train_data:
        raise ValueError("train_data: required for task 'jsonl' (a .jsonl / .parquet file or hub dataset)")
    train = jsonl_examples(train_data, "train", "train_data", prompt_column, answer_column) if with_train else []
    test = (jsonl_examples(test_data, "test", "test_data", prompt_column, answer_column) if test_data
            else [])
    return Task(name="jsonl", train=train, test=test, correct_fn=math_correct,
                format_fn=think_answer_format_soft, extract_fn=extract_final_answer,
                system_prompt=system_prompt)

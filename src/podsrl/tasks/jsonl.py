"""User data: a JSON Lines / JSON / CSV / parquet file or a hub dataset, with configurable
prompt and answer columns.

The prompt is text, or a conversation (TRL's conversational format: a list of
``{"role", "content"}`` messages) rendered with the tokenizer's chat template. Every
column reaches reward functions as a keyword argument under its own name (TRL's
convention), so ``fn(prompts, completions, difficulty, **kw)`` sees a ``difficulty``
column; ``answer`` is the gold answer when the data has no ``answer`` column. Correctness
defaults to mathematical equivalence of the final answer with the ``answer_column``
(``grade(..., "math")``); pass your own reward functions with ``reward_funcs``.
"""

from __future__ import annotations

from podsrl.rewards.functions import extract_final_answer, math_correct_on, think_answer_format_soft
from podsrl.tasks.base import Example, Task, dataset_columns
from podsrl.tasks.data import read_rows, require_column, require_prompt


def jsonl_examples(spec: str, split: str, field_name: str, prompt_column: str,
                   answer_column: str) -> list[Example]:
    rows = read_rows(spec, split=split, field_name=field_name)
    out = []
    for i, row in rows:
        prompt = require_prompt(rows, i, prompt_column)
        answer = require_column(rows, i, answer_column)
        out.append(Example(prompt=prompt, answer=str(answer), columns=dataset_columns(row)))
    return out


def build_jsonl(train_data: str, test_data: str, prompt_column: str = "prompt", answer_column: str = "answer",
                 system_prompt: str = "", with_train: bool = True) -> Task:
    if with_train and not train_data:
        raise ValueError("train_data: required for task 'jsonl' (a .jsonl / .json / .csv / .parquet file or "
                         "a hub dataset)")
    train = (jsonl_examples(train_data, "train", "train_data", prompt_column, answer_column) if with_train
             else [])
    test = (jsonl_examples(test_data, "test", "test_data", prompt_column, answer_column) if test_data
            else [])
    return Task(name="jsonl", train=train, test=test, correct_fn=math_correct_on(answer_column),
                format_fn=think_answer_format_soft, extract_fn=extract_final_answer,
                system_prompt=system_prompt)

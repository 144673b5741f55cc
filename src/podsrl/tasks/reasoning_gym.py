"""reasoning-gym procedural tasks (``task=reasoning_gym:NAME``), with the library's own
generators and scorers, seeded.

The model answers inside ``<answer>...</answer>``; reasoning-gym's ``score_answer`` grades
the extracted answer against the generating entry, which travels as the ``rg_entry``
column (:func:`podsrl.rewards.functions.reasoning_gym_correct`).
"""

from __future__ import annotations

from podsrl.rewards.functions import extract_final_answer, reasoning_gym_correct, think_answer_format_strict
from podsrl.tasks.base import REASONING_GYM_PREFIX, THINK_ANSWER_SYSTEM_PROMPT, Example, Task


def available() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def build_reasoning_gym(name: str, num_train: int, num_test: int, seed: int) -> Task:
    import reasoning_gym

    if name not in available():
        raise ValueError(f"task: unknown reasoning-gym dataset {name!r}; e.g. {', '.join(available()[:8])}, "
                         "...")
    # one generator, one seed: train and test are disjoint index ranges of the same stream;
    # small problem spaces repeat questions, so train problems equal to a held-out one are
    # dropped (the train split may be a little smaller than num_train)
    dataset = reasoning_gym.create_dataset(name, size=num_train + num_test, seed=seed)
    entries = [dataset[i] for i in range(num_train + num_test)]
    examples = [Example(prompt=e["question"], answer=str(e["answer"]), columns={"rg_entry": e})
                for e in entries]
    held_out = {ex.prompt for ex in examples[num_train:]}
    train = [ex for ex in examples[:num_train] if ex.prompt not in held_out]
    return Task(name=REASONING_GYM_PREFIX + name, train=train, test=examples[num_train:],
                correct_fn=reasoning_gym_correct(dataset, name), format_fn=think_answer_format_strict,
                extract_fn=extract_final_answer, system_prompt=THINK_ANSWER_SYSTEM_PROMPT)

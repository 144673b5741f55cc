"""Reward functions with TRL's signature: fn(prompts, completions, **kwargs) -> list[float | None].

    podsrl train --reward_funcs examples/rewards.py:brevity,arithmetic_correct --reward_weights 0.1,1.0
    podsrl train --task jsonl ... --reward_funcs examples/rewards.py:harder_counts_more

Each call gets what TRL's GRPOTrainer passes: ``prompts``, ``completions``,
``completion_ids`` (token ids, no padding), ``trainer_state`` (``global_step``,
``max_steps``, ...) and every dataset column under its own name (``answer``, and for the
jsonl task every other column, e.g. ``difficulty``). With a chat template a completion is
``[{"role": "assistant", "content": text}]`` rather than the text. Return None (or NaN)
for a sample the function does not apply to; a sample no function applies to counts as
unverifiable.
"""


def _text(completion):
    """The completion's text, whether it comes as text or as TRL's message list."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def brevity(prompts, completions, **columns):
    """A small penalty per character: prefer short answers."""
    return [-len(_text(completion)) / 100 for completion in completions]


def harder_counts_more(prompts, completions, answer, difficulty=None, **columns):
    """1 (easy) or 2 (hard) for a right answer after the last 'Answer:', else 0."""
    difficulty = difficulty or ["easy"] * len(completions)
    scores = []
    for completion, gold, level in zip(completions, answer, difficulty):
        text = _text(completion)
        given = text.rsplit("Answer:", 1)[-1].strip() if "Answer:" in text else None
        scores.append((2.0 if level == "hard" else 1.0) * float(given == str(gold)))
    return scores


def overlong_later(prompts, completions, completion_ids, trainer_state, **columns):
    """-1 for a completion of 8 tokens or more, phased in over the run (progress-shaped,
    as with TRL's trainer_state)."""
    progress = trainer_state.global_step / max(1, trainer_state.max_steps)
    return [-progress * float(len(ids) >= 8) for ids in completion_ids]

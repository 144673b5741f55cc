"""Reward functions with TRL's signature: fn(prompts, completions, **columns) -> list[float | None].

    podsrl train --reward_funcs examples/rewards.py:brevity,arithmetic_correct --reward_weights 0.1,1.0
    podsrl train --task jsonl ... --reward_funcs examples/rewards.py:harder_counts_more

Dataset columns arrive as keyword arguments under their own names (``answer``, and for the
jsonl task every other column, e.g. ``difficulty``). Return None for a sample the function
cannot judge; podsrl counts it as unverifiable.
"""


def brevity(prompts, completions, **columns):
    """A small penalty per character: prefer short answers."""
    return [-len(completion) / 100 for completion in completions]


def harder_counts_more(prompts, completions, answer, difficulty=None, **columns):
    """1 (easy) or 2 (hard) for a right answer after the last 'Answer:', else 0."""
    difficulty = difficulty or ["easy"] * len(completions)
    scores = []
    for completion, gold, level in zip(completions, answer, difficulty):
        given = completion.rsplit("Answer:", 1)[-1].strip() if "Answer:" in completion else None
        scores.append((2.0 if level == "hard" else 1.0) * float(given == str(gold)))
    return scores

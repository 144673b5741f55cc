"""Held-out accuracy: sampled (averaging several samples per prompt, as the paper
evaluates at temperature 0.9) and greedy."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from podsrl.rewards import arithmetic_correct
from podsrl.rollout import generate
from podsrl.tasks.base import Example


def accuracy(bundle, examples: Sequence[Example], *, samples: int, temperature: float,
             max_new_tokens: int, seed: int, top_p: float = 1.0, batch_size: int = 512,
             correct_fn: Callable[..., list] = arithmetic_correct) -> float:
    """Fraction of correct completions over ``len(examples) * samples`` generations.

    Runs under its own seeded RNG (``torch.random.fork_rng``) so evaluating never changes
    the training run's random stream: how often one evaluates cannot change what is learnt.
    """
    samples = 1 if temperature == 0 else samples
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        rollouts = generate(bundle.model, bundle.tokenizer, [ex.prompt for ex in examples], samples,
                            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            batch_size=batch_size)
    completions = [text for group in rollouts.texts for text in group]
    prompts = [ex.prompt for ex in examples for _ in range(samples)]
    columns = {"answer": [ex.answer for ex in examples for _ in range(samples)]}
    for key in examples[0].columns if examples else ():
        columns[key] = [ex.columns[key] for ex in examples for _ in range(samples)]
    correct = correct_fn(prompts=prompts, completions=completions, **columns)
    return sum(float(c or 0.0) for c in correct) / max(1, len(correct))

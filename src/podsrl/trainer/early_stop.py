"""Early stop of saturated groups (``group_early_stop``): the slots engine's stopper.

The engine reports samples as they finish; :class:`SaturationStopper` scores them with the
run's reward and says which groups are saturated (:mod:`podsrl.algorithms.early_stop`):
for those, more samples cannot raise the variance max-variance selection keeps.
"""

from __future__ import annotations

from typing import Any

import torch

from podsrl.algorithms.early_stop import saturated
from podsrl.rewards.scorer import Scorer
from podsrl.tasks.base import PreparedSplit


def reward_bounds(scorer: Scorer) -> tuple[float, float]:
    """The run's reward bounds, or an error naming what lacks them."""
    bounds = scorer.bounds()
    if bounds is None:
        stacks = [scorer.custom] if scorer.custom is not None else [scorer.correct, scorer.format]
        missing = [getattr(fn, "__name__", repr(fn)) for stack in stacks for fn in stack.fns
                   if getattr(fn, "reward_bounds", None) is None]
        raise ValueError(f"group_early_stop: needs the reward's bounds, and reward function(s) {', '.join(missing)} "
                         f"declare none; set fn.reward_bounds = (low, high) (podsrl.rewards.bounded)")
    if not bounds[0] < bounds[1]:
        raise ValueError(f"group_early_stop: the reward's bounds {bounds} are empty (low must be < high)")
    return bounds


class SaturationStopper:
    """Scores the samples of one generation call as they finish; says which prompts' groups
    became saturated. ``split``: the call's P prompts; rewards must be per-sample (a reward
    that depends on the other samples of the batch would be scored differently here)."""

    def __init__(self, scorer: Scorer, split: PreparedSplit, tokenizer, num_kept: int,
                 bounds: tuple[float, float], trainer_state: Any = None) -> None:
        self.scorer, self.split, self.tokenizer, self.num_kept = scorer, split, tokenizer, num_kept
        self.bounds, self.trainer_state = bounds, trainer_state
        self.rewards: list[list[float]] = [[] for _ in split.examples]  # per prompt, in finishing order
        self.saturated: set[int] = set()

    def __call__(self, prompt_index: list[int], completion_ids: list[list[int]]) -> list[int]:
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        rewards = self.scorer.sample_rewards(self.split, prompt_index, texts, completion_ids, self.trainer_state)
        for prompt, reward in zip(prompt_index, rewards.tolist()):
            self.rewards[prompt].append(reward)
        open_prompts = sorted(set(prompt_index) - self.saturated)
        if not open_prompts:
            return []
        width = max(len(self.rewards[p]) for p in open_prompts)
        table = torch.full((len(open_prompts), width), float("nan"), dtype=torch.float64)  # [P', k], NaN = pending
        for row, prompt in enumerate(open_prompts):
            table[row, :len(self.rewards[prompt])] = torch.tensor(self.rewards[prompt], dtype=torch.float64)
        now = [p for p, done in zip(open_prompts, saturated(table, self.num_kept, *self.bounds).tolist()) if done]
        self.saturated.update(now)
        return now

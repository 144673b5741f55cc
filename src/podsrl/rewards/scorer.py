"""The run's reward: rollouts [P, n] -> :class:`podsrl.types.Scores` [P, n].

By default ``correct_weight * correct + format_weight * format`` from the task's own
reward functions (the paper's 1.0 for the answer plus a format bonus; the PODS authors'
slides weight them 80 / 20), or the user's ``reward_funcs`` instead. The task's correctness is always
scored too: it is the accuracy metric, whatever the reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from podsrl.rewards.stack import RewardFn, RewardStack
from podsrl.tasks.base import Example, Task, reward_columns
from podsrl.types import Rollouts, Scores


@dataclass(frozen=True)
class ScoringOptions:
    correct_weight: float = 0.8
    format_weight: float = 0.2
    reward_funcs: tuple[RewardFn, ...] = ()  # replace the task's reward when given
    reward_weights: tuple[float, ...] = ()  # one per reward_funcs
    error_policy: str = "raise"  # or "zero": a failing function scores 0 there, counted
    timeout: float = 0.0  # seconds a reward call may take (0 = no limit)


@dataclass
class Scorer:
    correct: RewardStack
    format: RewardStack
    custom: RewardStack | None
    correct_weight: float
    format_weight: float

    @classmethod
    def build(cls, task: Task, options: ScoringOptions) -> "Scorer":
        def stack(fns, weights):
            return RewardStack(list(fns), list(weights), error_policy=options.error_policy, timeout=options.timeout)

        custom = stack(options.reward_funcs, options.reward_weights) if options.reward_funcs else None
        return cls(stack([task.correct_fn], [1.0]), stack([task.format_fn], [1.0]), custom,
                   options.correct_weight, options.format_weight)

    @property
    def failures(self) -> int:
        return self.correct.failures + self.format.failures + (self.custom.failures if self.custom else 0)

    def __call__(self, examples: list[Example], rollouts: Rollouts) -> Scores:
        """Rewards [P, n] and their parts; unverifiable samples (NaN) score 0 and are counted."""
        n = rollouts.group_size
        prompts = [ex.prompt for ex in examples for _ in range(n)]
        completions = [text for group in rollouts.texts for text in group]
        columns = reward_columns(examples, n)
        correct = self.correct(prompts, completions, columns)
        if self.custom is None:
            formatted = self.format(prompts, completions, columns)
            total = self.correct_weight * correct.nan_to_num(0.0) + self.format_weight * formatted.nan_to_num(0.0)
            unverifiable = correct.isnan() & formatted.isnan()
        else:
            formatted = torch.full_like(correct, float("nan"))
            total = self.custom(prompts, completions, columns)
            unverifiable = total.isnan()
            total = total.nan_to_num(0.0)
        shape = (len(examples), n)
        return Scores(reward=total.view(shape), correct=correct.view(shape), format=formatted.view(shape),
                      unverifiable=unverifiable.view(shape))

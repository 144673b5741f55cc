"""The run's reward: rollouts [P, n] -> :class:`podsrl.types.Scores` [P, n].

By default ``correct_weight * correct + format_weight * format`` from the task's own
reward functions (the paper's 1.0 for the answer plus a format bonus; the PODS authors'
slides weight them 80 / 20), or the user's ``reward_funcs`` instead. The task's correctness is always
scored too: it is the accuracy metric, whatever the reward.

Every reward function is called as TRL's ``GRPOTrainer._calculate_rewards`` calls it
(:func:`reward_inputs`): ``prompts``, ``completions``, ``completion_ids``, every dataset
column under its own name, ``trainer_state``, ``log_extra`` and ``log_metric``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from podsrl.rewards.stack import RewardFn, RewardStack
from podsrl.tasks.base import PreparedSplit, Task, reward_columns
from podsrl.types import Rollouts, Scores


@dataclass(frozen=True)
class TrainerProgress:
    """What reward functions get as ``trainer_state``, for rewards shaped by training
    progress: the attributes of transformers' ``TrainerState`` that TRL passes (a small
    record instead of the class, whose import costs seconds)."""

    global_step: int = 0  # optimizer steps completed: 0 while the first step's rollouts are scored, as in TRL
    max_steps: int = 0
    epoch: float = 0.0  # passes over the train prompts completed
    is_world_process_zero: bool = True
    is_local_process_zero: bool = True


def _not_recorded(*_args, **_kwargs) -> None:
    """TRL's ``log_extra`` / ``log_metric`` callbacks: accepted, so functions that call
    them run unchanged; podsrl does not record what they log."""


@dataclass
class RewardInputs:
    """The keyword arguments of one reward call, N = P * n completions, prompt-major.

    prompts       [N] the prompt text, or its conversation (message list) when the chat template renders it
    completions   [N] the completion text, or ``[{"role": "assistant", "content": text}]`` when chat
    columns       ``completion_ids`` ([N] token-id lists, no padding, up to and including EOS) and the
                  dataset columns, each [N]
    shared        ``trainer_state``, ``log_extra``, ``log_metric``: one value for the whole call
    """

    prompts: list
    completions: list
    columns: dict[str, list]
    shared: dict[str, Any]

    def kwargs(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "completions": self.completions, **self.columns, **self.shared}


def reward_inputs(split: PreparedSplit, rollouts: Rollouts, trainer_state: Any = None) -> RewardInputs:
    """What reward functions get for ``rollouts`` [P, n] of the P prompts of ``split``."""
    n = rollouts.group_size
    texts = [text for group in rollouts.texts for text in group]  # [N]
    completions = [[{"role": "assistant", "content": text}] for text in texts] if split.chat else texts
    columns = {"completion_ids": rollouts.completion_id_lists(), **reward_columns(split.examples, n)}
    shared = {"trainer_state": trainer_state if trainer_state is not None else TrainerProgress(),
              "log_extra": _not_recorded, "log_metric": _not_recorded}
    return RewardInputs([p for p in split.reward_prompts for _ in range(n)], completions, columns, shared)


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

    def __call__(self, split: PreparedSplit, rollouts: Rollouts, trainer_state: Any = None) -> Scores:
        """Rewards [P, n] of ``rollouts`` for the P prompts of ``split``, and their parts.

        Per sample, the weighted sum skips functions that return None / NaN (TRL's nansum);
        where none applies the sample is unverifiable: it scores 0 and is counted.
        """
        inputs = reward_inputs(split, rollouts, trainer_state)
        args = (inputs.prompts, inputs.completions, inputs.columns, inputs.shared)
        correct = self.correct(*args)  # [N], NaN where not verifiable
        if self.custom is None:
            formatted = self.format(*args)
            total = self.correct_weight * correct.nan_to_num(0.0) + self.format_weight * formatted.nan_to_num(0.0)
            unverifiable = correct.isnan() & formatted.isnan()
        else:
            formatted = torch.full_like(correct, float("nan"))
            total = self.custom(*args)
            unverifiable = total.isnan()
            total = total.nan_to_num(0.0)
        shape = (len(split.examples), rollouts.group_size)
        return Scores(reward=total.view(shape), correct=correct.view(shape), format=formatted.view(shape),
                      unverifiable=unverifiable.view(shape))

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

from podsrl.options import NON_NEGATIVE, Range, option
from podsrl.registry import Spec
from podsrl.rewards.stack import DEFAULT_REWARD_TIMEOUT, RewardFn, RewardStack
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
    return sample_reward_inputs(split, [p for p in range(len(split.examples)) for _ in range(n)],
                                [text for group in rollouts.texts for text in group],
                                rollouts.completion_id_lists(), trainer_state)


def sample_reward_inputs(split: PreparedSplit, prompt_index: list[int], texts: list[str],
                         completion_ids: list[list[int]], trainer_state: Any = None) -> RewardInputs:
    """What reward functions get for N completions, the i-th of prompt ``prompt_index[i]`` of
    ``split``: texts [N], completion_ids [N] (up to and including EOS)."""
    completions = [[{"role": "assistant", "content": text}] for text in texts] if split.chat else texts
    per_prompt = reward_columns(split.examples, 1)  # each [P]
    columns = {"completion_ids": completion_ids,
               **{name: [values[p] for p in prompt_index] for name, values in per_prompt.items()}}
    shared = {"trainer_state": trainer_state if trainer_state is not None else TrainerProgress(),
              "log_extra": _not_recorded, "log_metric": _not_recorded}
    prompts = split.reward_prompts
    return RewardInputs([prompts[p] for p in prompt_index], completions, columns, shared)


def unscored(shape: tuple[int, ...]) -> Scores:
    """Scores of samples not scored (yet): NaN in every part, none unverifiable."""
    nan = torch.full(shape, float("nan"))
    unverifiable = torch.zeros(shape, dtype=torch.bool)
    return Scores(reward=nan, correct=nan.clone(), format=nan.clone(), unverifiable=unverifiable)


@dataclass(frozen=True)
class ScoringOptions:
    """How the run scores rollouts (the config's fields of these names: the config composes this
    class). In the config ``reward_funcs`` and ``reward_weights`` are text (names and specs,
    comma-separated numbers); the scorer is given them resolved: the functions and one float
    weight each (podsrl.trainer.setup.scoring_options), which replace the task's reward."""

    correct_weight: float = option(0.8, "Weight of the correctness reward (the PODS authors' slides weight "
                                        "answer / format 80 / 20).", NON_NEGATIVE)
    format_weight: float = option(0.2, "Weight of the format reward.", NON_NEGATIVE)
    reward_funcs: str | list[Spec] | tuple[RewardFn, ...] = option(
        "", "Comma-separated reward functions replacing the task's default: built-in names "
            "(podsrl.rewards.REWARDS) or 'module:function' / 'file.py:function' with TRL's signature "
            "fn(prompts, completions, completion_ids, trainer_state, **columns) (e.g. "
            "trl.rewards:accuracy_reward). Python callables go to train(cfg, reward_funcs=[...]) instead.")
    reward_weights: str | tuple[float, ...] = option("", "Comma-separated weights of the reward functions "
                                                         "(reward_funcs, or those passed to train()), finite "
                                                         "numbers; empty = 1 each.")
    reward_error_policy: str = option("raise", "A reward function that raises, times out or returns a bad "
                                               "value: 'raise' stops the run naming it; 'zero' scores 0, "
                                               "counted.")
    reward_timeout: float = option(DEFAULT_REWARD_TIMEOUT,
                                   "Seconds a call of a user reward function may take; past it, its worker "
                                   "process is killed and reward_error_policy applies (0 = the default, 300 "
                                   "s). podsrl's built-in reward functions run in the trainer, without a "
                                   "limit.",
                                   Range(0, 86400, why="0 = the default (300 s); at most a day, so that a "
                                                       "hung reward function cannot hold the run forever"))


@dataclass
class Scorer:
    correct: RewardStack
    format: RewardStack
    custom: RewardStack | None
    correct_weight: float
    format_weight: float

    @property
    def error_policy(self) -> str:
        """What a failing reward function scores: "raise" (the step fails) or "zero" (counted)."""
        return self.correct.error_policy

    @classmethod
    def build(cls, task: Task, options: ScoringOptions) -> "Scorer":
        def stack(fns, weights):
            return RewardStack(list(fns), list(weights), error_policy=options.reward_error_policy,
                               timeout=options.reward_timeout)

        custom = stack(options.reward_funcs, options.reward_weights) if options.reward_funcs else None
        return cls(stack([task.correct_fn], [1.0]), stack([task.format_fn], [1.0]), custom,
                   options.correct_weight, options.format_weight)

    @property
    def failures(self) -> int:
        return self.correct.failures + self.format.failures + (self.custom.failures if self.custom else 0)

    @property
    def applied(self) -> int:
        """Samples the training reward applied to so far (the user's functions when given, else
        the task's correctness or format): 0 means every reward was None / NaN or failed."""
        return self.custom.applied if self.custom else self.correct.applied + self.format.applied

    def bounds(self) -> tuple[float, float] | None:
        """[low, high] of the training reward when every function declares its bounds
        (``reward_bounds``), else None; unverifiable samples score 0, inside the interval."""
        if self.custom is not None:
            return self.custom.bounds()
        parts = (self.correct.bounds(), self.format.bounds())
        if None in parts:
            return None
        (correct_low, correct_high), (format_low, format_high) = parts
        return (self.correct_weight * correct_low + self.format_weight * format_low,
                self.correct_weight * correct_high + self.format_weight * format_high)

    def __call__(self, split: PreparedSplit, rollouts: Rollouts, trainer_state: Any = None) -> Scores:
        """Rewards [P, n] of ``rollouts`` for the P prompts of ``split``, and their parts.

        Per sample, the weighted sum skips functions that return None / NaN (TRL's nansum);
        where none applies the sample is unverifiable: it scores 0 and is counted. Samples
        never generated (``rollouts.generated``) are not scored: NaN in every part. Samples
        early stop scored as they finished (``rollouts.early_scores``) keep those scores: each
        sample is scored once, and the reward that decided its group's stop is the one trained on.
        """
        shape = (len(split.examples), rollouts.group_size)
        if rollouts.generated is None and rollouts.early_scores is None:
            return self._score(reward_inputs(split, rollouts, trainer_state), shape)
        known = rollouts.early_scores if rollouts.early_scores is not None else unscored(shape)
        todo = rollouts.generated_mask & known.reward.isnan()  # [P, n] generated, not scored yet
        where = todo.flatten().nonzero().squeeze(1)  # [N'] prompt-major
        if not len(where):
            return known
        n, samples = rollouts.group_size, where.tolist()
        texts, ids = [t for group in rollouts.texts for t in group], rollouts.completion_id_lists()
        inputs = sample_reward_inputs(split, [i // n for i in samples], [texts[i] for i in samples],
                                      [ids[i] for i in samples], trainer_state)
        flat = self._score(inputs, (len(where),))
        return Scores(*(old.flatten().index_copy(0, where, new).view(shape)
                        for old, new in zip(known.tensors(), flat.tensors())))

    def sample_scores(self, split: PreparedSplit, prompt_index: list[int], texts: list[str],
                      completion_ids: list[list[int]], trainer_state: Any = None) -> Scores:
        """The scores [N] of N single completions, the i-th of prompt ``prompt_index[i]`` (early
        stop scores samples as they finish; the reward stage then reuses them)."""
        inputs = sample_reward_inputs(split, prompt_index, texts, completion_ids, trainer_state)
        return self._score(inputs, (len(texts),))

    def _score(self, inputs: RewardInputs, shape: tuple[int, ...]) -> Scores:
        args = (inputs.prompts, inputs.completions, inputs.columns, inputs.shared)
        correct = self.correct(*args)  # [N], NaN where not verifiable
        if self.custom is None:
            formatted = self.format(*args)
            total = (self.correct_weight * correct.nan_to_num(0.0)
                     + self.format_weight * formatted.nan_to_num(0.0))
            unverifiable = correct.isnan() & formatted.isnan()
        else:
            formatted = torch.full_like(correct, float("nan"))
            total = self.custom(*args)
            unverifiable = total.isnan()
            total = total.nan_to_num(0.0)
        return Scores(reward=total.view(shape), correct=correct.view(shape), format=formatted.view(shape),
                      unverifiable=unverifiable.view(shape))

"""Early stop of saturated groups (``group_early_stop``): a watcher of kind ``stop_groups``.

The engine reports samples as they finish; :class:`SaturationStopper` scores them with the
run's reward and says which groups are saturated (:mod:`podsrl.algorithms.early_stop`):
for those, more samples cannot raise the variance max-variance selection keeps.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from podsrl.algorithms.early_stop import saturated
from podsrl.rewards import RewardError
from podsrl.rollout.base import STOP_GROUPS
from podsrl.scoring import Scorer, unscored
from podsrl.tasks.base import PreparedSplit
from podsrl.types import Rollouts, Scores


def reward_bounds(scorer: Scorer) -> tuple[float, float]:
    """The run's reward bounds, or an error naming what lacks them."""
    bounds = scorer.bounds()
    if bounds is None:
        stacks = [scorer.custom] if scorer.custom is not None else [scorer.correct, scorer.format]
        missing = [getattr(fn, "__name__", repr(fn)) for stack in stacks for fn in stack.fns
                   if getattr(fn, "reward_bounds", None) is None]
        raise ValueError("group_early_stop: needs the reward's bounds, and reward function(s) "
                         f"{', '.join(missing)} declare none; set fn.reward_bounds = (low, high) "
                         "(podsrl.rewards.bounded)")
    if not bounds[0] < bounds[1]:
        raise ValueError(f"group_early_stop: the reward's bounds {bounds} are empty (low must be < high)")
    return bounds


class SaturationStopper:
    """Scores the samples of one generation call as they finish; says which prompts' groups
    became saturated, and hands the reward stage those scores (:meth:`early_scores`), so no
    sample is scored twice. ``split``: the call's P prompts; rewards must be per-sample (a
    reward that depends on the other samples of the batch would be scored differently here)."""

    kind = STOP_GROUPS

    def __init__(self, scorer: Scorer, split: PreparedSplit, tokenizer, num_kept: int,
                 bounds: tuple[float, float], trainer_state: Any = None) -> None:
        self.scorer, self.split, self.tokenizer, self.num_kept = scorer, split, tokenizer, num_kept
        self.bounds, self.trainer_state = bounds, trainer_state
        self.rewards: list[list[float]] = [[] for _ in split.examples]  # per prompt, in finishing order
        # per prompt: a finished sample's tokens -> its score rows (reward, correct, format, unverifiable)
        self.scored: list[dict[tuple[int, ...], list[tuple]]] = [defaultdict(list) for _ in split.examples]
        self.saturated: set[int] = set()
        # A reward failure is kept, not raised inside the engine: generation goes on without
        # stopping, so every process reaches the point where the failure is agreed on and
        # raised together (the RolloutGenerator); raising here would stop one process alone.
        self.failure: RewardError | None = None

    def __call__(self, prompt_index: list[int], completion_ids: list[list[int]]) -> list[int]:
        if self.failure is not None:
            return []
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        try:
            scores = self.scorer.sample_scores(self.split, prompt_index, texts, completion_ids,
                                               self.trainer_state)
        except RewardError as err:
            self.failure = err
            return []
        rows = zip(*(part.tolist() for part in scores.tensors()))
        for prompt, ids, reward, row in zip(prompt_index, completion_ids, scores.reward.tolist(), rows):
            self.rewards[prompt].append(reward)
            self.scored[prompt][tuple(ids)].append(row)
        open_prompts = sorted(set(prompt_index) - self.saturated)
        if not open_prompts:
            return []
        width = max(len(self.rewards[p]) for p in open_prompts)
        # [P', k], NaN = pending
        table = torch.full((len(open_prompts), width), float("nan"), dtype=torch.float64)
        for row, prompt in enumerate(open_prompts):
            table[row, :len(self.rewards[prompt])] = torch.tensor(self.rewards[prompt], dtype=torch.float64)
        now = [p for p, done in zip(open_prompts, saturated(table, self.num_kept, *self.bounds).tolist())
               if done]
        self.saturated.update(now)
        return now

    def early_scores(self, rollouts: Rollouts, groups: list[int] | None = None) -> Scores:
        """The scores [P, n] of the call's ``rollouts`` this watcher gave as samples finished,
        matched by prompt and tokens (the engine returns every reported sample); NaN where a
        sample finished unreported (the reward stage scores it). ``groups``: the rollouts'
        positions among the call's prompts, when they are not all of them in order (partial
        rollouts return the complete groups only)."""
        shape = rollouts.completion_ids.shape[:2]
        known = unscored(shape)
        columns = [part.view(-1) for part in known.tensors()]  # each [P*n]
        groups = range(len(self.scored)) if groups is None else groups
        pending = [{ids: list(rows) for ids, rows in self.scored[p].items()} for p in groups]
        ids = rollouts.completion_id_lists()
        for i in rollouts.generated_mask.flatten().nonzero().squeeze(1).tolist():
            rows = pending[i // shape[1]].get(tuple(ids[i]))
            if rows:
                for column, value in zip(columns, rows.pop()):
                    column[i] = value
        return known

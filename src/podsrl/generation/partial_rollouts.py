"""Partial rollouts (``partial_rollouts``; APRIL, Zhou et al., arXiv 2509.18521): a step's
generation stops once this process's share of ``prompts_per_step`` groups is complete; the
other groups in flight carry over, and their cut-off samples resume first next step.

Where completions have a long tail, a step otherwise waits for its few longest samples while
most slots idle. Here ``partial_extra_prompts`` more groups than the step trains on are in
flight on each process; the first to complete are trained on, so a long sample finishes in a
later step, under newer weights. What that costs, and how it is bounded:

* every token keeps the step whose weights drew it (``Rollouts.token_versions``), so its
  staleness when trained is known: the number of updates in between;
* ``partial_max_staleness`` bounds it: at the start of a step, a carried sample whose first
  token would be older than the bound is dropped and generated again from its prompt
  (counted: ``partial_samples_restarted``), so no token is ever trained staler than the bound;
* the update corrects for stale tokens (``partial_stale_correction``): ``importance`` weighs
  them by pi_policy / pi_sampler from the log-prob recorded when each was drawn, truncated or
  masked as TRL's ``vllm_importance_sampling_*`` settings say (on the slots engine, tokens of
  the current step weigh exactly 1: it samples from the policy itself; on vllm, every token
  is weighed by pi_policy / pi_vLLM); ``mask`` leaves them out of the loss (weight 0; slots
  only).

Whole groups are the unit: PODS selects within a complete group and the advantage normalises
over it. With dynamic sampling (DAPO), the step's rounds run over the one pool, each stopped
once the informative groups still lacking are complete, so no informative group is generated
beyond the step's share and thrown away; constant complete groups are set aside. The groups
in flight are part of the run's learned state (:class:`CarriedPool`, one per process):
checkpointed, restored, and rolled back with an abandoned step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from podsrl.distributed import Processes
from podsrl.generation.prompt_source import (
    PromptSource,
    ScoredGroups,
    ScoreFn,
    informative_share,
    rounds_until_informative,
)
from podsrl.options import POSITIVE, Range, option
from podsrl.prompt_selection import PromptSelector, add_selector_record
from podsrl.rollout.partial import CarriedGroup
from podsrl.tasks.base import PreparedSplit
from podsrl.trainer.state import RunState
from podsrl.trainer.timer import StageTimer

STALE_CORRECTIONS = ("importance", "mask")


@dataclass(frozen=True)
class PartialRolloutOptions:
    """Partial rollouts' settings (the config's fields of these names)."""

    partial_rollouts: bool = option(False, "Stop a step's generation once prompts_per_step groups are "
                                           "complete; the groups still in flight carry over and their "
                                           "cut-off samples resume first next step, under the new weights "
                                           "(APRIL, arXiv 2509.18521). Needs an engine that resumes samples "
                                           "(slots, vllm).")
    partial_extra_prompts: int = option(2, "partial_rollouts: groups in flight on each process beyond its "
                                           "share of prompts_per_step (over-provisioning; the first complete "
                                           "groups train).",
                                        POSITIVE)
    partial_max_staleness: int = option(2, "partial_rollouts: the most updates a trained token may be older "
                                           "than the policy it trains; a carried sample that would exceed it "
                                           "is generated again from its prompt (partial_samples_restarted).",
                                        Range(1, why="0 would regenerate every carried sample"))
    partial_stale_correction: str = option("importance", "partial_rollouts: 'importance' weighs tokens drawn "
                                                         "by an earlier policy by pi/pi_old as "
                                                         "vllm_importance_sampling_* say (TRL's truncated or "
                                                         "masked ratios); 'mask' leaves them out of the "
                                                         "loss.")

    def check(self) -> None:
        if self.partial_stale_correction not in STALE_CORRECTIONS:
            raise ValueError(f"partial_stale_correction: unknown {self.partial_stale_correction!r}; use one "
                             f"of {', '.join(STALE_CORRECTIONS)}")


class CarriedPool:
    """This process's groups in flight between steps: each one's prompt (its index in the train
    split) and its samples so far. A run part (:class:`podsrl.trainer.state.PerProcess`)."""

    per_process = True

    def __init__(self) -> None:
        self.prompts: list[int] = []
        self.groups: list[CarriedGroup] = []

    def __len__(self) -> int:
        return len(self.groups)

    def bound_staleness(self, step: int, max_staleness: int) -> int:
        """Restart every sample whose first token would train more than ``max_staleness``
        updates stale in ``step``; returns how many."""
        restarted = 0
        for group in self.groups:
            stale = [s for s, first in enumerate(group.oldest())
                     if first is not None and step - first > max_staleness]
            if stale:
                group.restart(stale)
                restarted += len(stale)
        return restarted

    def state_dict(self) -> dict:
        return {"prompts": list(self.prompts), "groups": [group.state_dict() for group in self.groups]}

    def check_state(self, state: dict) -> None:
        if set(state) != {"prompts", "groups"} or len(state["prompts"]) != len(state["groups"]):
            raise ValueError("partial_rollouts: the checkpoint's carried groups do not fit (expected prompts "
                             "and groups of one length)")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.prompts = list(state["prompts"])
        self.groups = [CarriedGroup(**group).copy() for group in state["groups"]]  # not the snapshot's lists


def carried_pool(options: PartialRolloutOptions, state: RunState) -> CarriedPool | None:
    """The run's groups in flight between steps, one of its learned parts (None: partial rollouts off)."""
    if not options.partial_rollouts:
        return None
    state.parts["carried_groups"] = pool = CarriedPool()
    return pool


class PartialRolloutSource(PromptSource):
    """Generation calls over the carried groups (first) and fresh prompts from the selector,
    each stopped once this process has the groups it asked for complete: its share of
    ``prompts_per_step``, in one call; with dynamic sampling (``extra_rounds``), DAPO's rounds
    over the one pool, each asking for the informative groups still lacking, the constant
    complete groups set aside.

    ``generate`` is the run's :class:`podsrl.trainer.stages.RolloutGenerator`; each process
    draws the fresh prompts that bring its groups in flight to what it asks for plus
    ``extra_prompts`` (the selector's list is shared: each takes its own slice of it)."""

    def __init__(self, selector: PromptSelector, prompts_per_step: int, train_split: PreparedSplit, generate,
                 score: ScoreFn, procs: Processes, options: PartialRolloutOptions, pool: CarriedPool,
                 extra_rounds: int | None = None, pad_token_id: int = 0) -> None:
        super().__init__(selector, prompts_per_step, train_split, generate, score, procs)
        self.extra, self.max_staleness, self.pool = (options.partial_extra_prompts,
                                                     options.partial_max_staleness, pool)
        self.share = prompts_per_step // procs.world_size  # this process's groups per step
        # extra_rounds None: no dynamic sampling
        self.extra_rounds, self.pad_token_id = extra_rounds, pad_token_id

    def scored_groups(self, step: int, n: int, timer: StageTimer) -> ScoredGroups:
        pool, procs = self.pool, self.procs
        restarted = pool.bound_staleness(step, self.max_staleness)
        if self.extra_rounds is None:
            rounds = [self.partial_round(step, n, 0, self.share, timer)]
            groups = rounds[0][1]
        else:
            rounds = rounds_until_informative(
                lambda round_index, quota: self.partial_round(step, n, round_index, quota, timer),
                self.share, self.extra_rounds, procs)
            groups = informative_share(rounds, self.share, self.train_split, procs, self.pad_token_id)
        resumed = sum(r.record["partial_samples_resumed"] for _, r in rounds)  # a round's carried samples
        cut_off = sum(len(group.cut_off) for group in pool.groups)
        carried, resumed, restarted, cut_off = procs.sum([float(len(pool)), float(resumed), float(restarted),
                                                          float(cut_off)])
        groups.record.update({"partial_groups_carried": int(carried), "partial_samples_resumed": int(resumed),
                              "partial_samples_restarted": int(restarted),
                              "partial_samples_cut_off": int(cut_off)})
        # a name of partial rollouts' own is refused
        add_selector_record(self.selector.record(), groups.record)
        return groups

    def partial_round(self, step: int, n: int, round_index: int, quota: int,
                      timer: StageTimer) -> tuple[list[int], ScoredGroups]:
        """One generation call until ``quota`` groups are complete (0: this process generates
        nothing and takes part in the collectives): their prompt indices and scored groups."""
        pool, procs = self.pool, self.procs
        resumed = sum(len(group.cut_off) for group in pool.groups) if quota else 0
        in_flight = pool.prompts + self.fresh_prompts(max(quota + self.extra - len(pool), 0) if quota else 0,
                                                      step, n)
        split = self.train_split.at_prompts(in_flight)
        with timer("generate"):
            result = self.generate.partial(split, dict(enumerate(pool.groups)), quota, n, step, round_index)
        pool.prompts = [in_flight[p] for p in sorted(result.carried)]
        pool.groups = [result.carried[p] for p in sorted(result.carried)]
        done = [in_flight[p] for p in result.complete]
        split = self.train_split.at_prompts(done)
        rollouts = result.rollouts  # [quota, n, Lc]
        with timer("reward"):
            scores = self.score(split, rollouts, step)
        if self.selector.learns:  # collectives: every process's complete groups, in process order
            correct = scores.correct.masked_fill(~rollouts.generated_mask, float("nan"))  # [quota, n]
            every = procs.gather_objects((done, correct))
            self.selector.observe(step, [i for indices, _ in every for i in indices],
                                  torch.cat([rows for _, rows in every]))
        return done, ScoredGroups(split, rollouts, scores, {"partial_samples_resumed": resumed})

    def fresh_prompts(self, count: int, step: int, n: int) -> list[int]:
        """``count`` new prompts for this process: one list drawn for every process's counts (a
        collective), this process's slice of it."""
        counts = [int(c) for c in self.procs.gather(torch.tensor([count])).tolist()]  # [world]
        indices = self.selector.take(sum(counts), step, n) if sum(counts) else []
        first = sum(counts[:self.procs.rank])
        return indices[first:first + count]

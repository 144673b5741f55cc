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
  masked as TRL's ``vllm_importance_sampling_*`` settings say (tokens of the current step weigh
  exactly 1: the slots engine samples from the policy itself); ``mask`` leaves them out of the
  loss (weight 0).

Whole groups are the unit: PODS selects within a complete group and the advantage normalises
over it. The groups in flight are part of the run's learned state (:class:`CarriedPool`, one
per process): checkpointed, restored, and rolled back with an abandoned step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from podsrl.distributed import Processes
from podsrl.options import POSITIVE, Range, option
from podsrl.prompt_selection import PromptSelector, add_selector_record
from podsrl.rollout.partial import CarriedGroup
from podsrl.tasks.base import PreparedSplit
from podsrl.trainer.prompt_source import PromptSource, ScoredGroups, ScoreFn
from podsrl.trainer.state import RunState
from podsrl.trainer.timer import StageTimer

STALE_CORRECTIONS = ("importance", "mask")


@dataclass(frozen=True)
class PartialRolloutOptions:
    """Partial rollouts' settings (the config's fields of these names)."""

    partial_rollouts: bool = option(False, "Stop a step's generation once prompts_per_step groups are complete; the "
                                           "groups still in flight carry over and their cut-off samples resume "
                                           "first next step, under the new weights (APRIL, arXiv 2509.18521). Needs "
                                           "an engine that resumes samples (slots).")
    partial_extra_prompts: int = option(2, "partial_rollouts: groups in flight on each process beyond its share of "
                                           "prompts_per_step (over-provisioning; the first complete groups train).",
                                        POSITIVE)
    partial_max_staleness: int = option(2, "partial_rollouts: the most updates a trained token may be older than the "
                                           "policy it trains; a carried sample that would exceed it is generated "
                                           "again from its prompt (partial_samples_restarted).",
                                        Range(1, why="0 would regenerate every carried sample"))
    partial_stale_correction: str = option("importance", "partial_rollouts: 'importance' weighs tokens drawn by an "
                                                         "earlier policy by pi/pi_old as vllm_importance_sampling_* "
                                                         "say (TRL's truncated or masked ratios); 'mask' leaves them "
                                                         "out of the loss.")

    def check(self) -> None:
        if self.partial_stale_correction not in STALE_CORRECTIONS:
            raise ValueError(f"partial_stale_correction: unknown {self.partial_stale_correction!r}; use one of "
                             f"{', '.join(STALE_CORRECTIONS)}")


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
            stale = [s for s, first in enumerate(group.oldest()) if first is not None and step - first > max_staleness]
            if stale:
                group.restart(stale)
                restarted += len(stale)
        return restarted

    def state_dict(self) -> dict:
        return {"prompts": list(self.prompts), "groups": [group.state_dict() for group in self.groups]}

    def check_state(self, state: dict) -> None:
        if set(state) != {"prompts", "groups"} or len(state["prompts"]) != len(state["groups"]):
            raise ValueError("partial_rollouts: the checkpoint's carried groups do not fit (expected prompts and "
                             "groups of one length)")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.prompts = list(state["prompts"])
        self.groups = [CarriedGroup(**{name: [list(x) if isinstance(x, list) else x for x in value]
                                       for name, value in group.items()}) for group in state["groups"]]


def carried_pool(options: PartialRolloutOptions, state: RunState) -> CarriedPool | None:
    """The run's groups in flight between steps, one of its learned parts (None: partial rollouts off)."""
    if not options.partial_rollouts:
        return None
    state.parts["carried_groups"] = pool = CarriedPool()
    return pool


class PartialRolloutSource(PromptSource):
    """One generation call per step over the carried groups (first) and fresh prompts from the
    selector, stopped once this process's share of ``prompts_per_step`` groups is complete.

    ``generate`` is the run's :class:`podsrl.trainer.stages.RolloutGenerator`; fresh prompts are
    drawn so that each process keeps its share plus ``extra_prompts`` groups in flight (the same
    count on every process: the selector's list is shared)."""

    def __init__(self, selector: PromptSelector, prompts_per_step: int, train_split: PreparedSplit, generate,
                 score: ScoreFn, procs: Processes, options: PartialRolloutOptions, pool: CarriedPool) -> None:
        super().__init__(selector, prompts_per_step, train_split, generate, score, procs)
        self.extra, self.max_staleness, self.pool = options.partial_extra_prompts, options.partial_max_staleness, pool
        self.quota = prompts_per_step // procs.world_size  # this process's share

    def round(self, step: int, n: int, round_index: int, timer: StageTimer) -> tuple[list[int], ScoredGroups]:
        pool, procs = self.pool, self.procs
        restarted = pool.bound_staleness(step, self.max_staleness)
        resumed = sum(len(group.cut_off) for group in pool.groups)
        fresh = int(procs.max([float(max(self.quota + self.extra - len(pool), 0))])[0])  # per process
        indices = self.selector.take(fresh * procs.world_size, step, n) if fresh else []
        in_flight = pool.prompts + procs.block(indices)
        split = self.train_split.at_prompts(in_flight)
        with timer("generate"):
            result = self.generate.partial(split, dict(enumerate(pool.groups)), self.quota, n, step)
        pool.prompts = [in_flight[p] for p in sorted(result.carried)]
        pool.groups = [result.carried[p] for p in sorted(result.carried)]
        done = [in_flight[p] for p in result.complete]
        split = self.train_split.at_prompts(done)
        rollouts = result.rollouts  # [quota, n, Lc]
        with timer("reward"):
            scores = self.score(split, rollouts, step)
        if self.selector.learns:  # collectives: every process's complete groups, in process order
            correct = scores.correct.masked_fill(~rollouts.generated_mask, float("nan"))  # [quota, n]
            every = procs.gather(torch.tensor(done, dtype=torch.long)).tolist()
            self.selector.observe(step, every, procs.gather(correct))
        cut_off = sum(len(group.cut_off) for group in pool.groups)
        carried, resumed, restarted, cut_off = procs.sum([float(len(pool)), float(resumed), float(restarted),
                                                          float(cut_off)])
        record = {"partial_groups_carried": int(carried), "partial_samples_resumed": int(resumed),
                  "partial_samples_restarted": int(restarted), "partial_samples_cut_off": int(cut_off)}
        return done, ScoredGroups(split, rollouts, scores, record)

    def scored_groups(self, step: int, n: int, timer: StageTimer) -> ScoredGroups:
        _, groups = self.round(step, n, 0, timer)
        add_selector_record(self.selector.record(), groups.record)  # a name of partial rollouts' own is refused
        return groups

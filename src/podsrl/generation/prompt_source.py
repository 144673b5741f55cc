"""Where a step's prompt groups come from: :class:`PromptSource` asks the prompt selector
(:mod:`podsrl.prompt_selection`: the ``shuffled`` pass, ``pass_rate``, a user's) for prompts, has
this process's share generated and scored, and hands the loop one :class:`ScoredGroups`.

A step is rounds of one generation call each (:class:`podsrl.trainer.stages.RolloutGenerator`):

* a round's prompts are the groups carried in flight from earlier steps (partial rollouts,
  :mod:`podsrl.generation.partial_rollouts`; none without them) and fresh prompts from the
  selector; without partial rollouts every group of the round is wanted, with them the call
  stops at the groups it still lacks and the rest carry on;
* one round per step, or, with ``dynamic_sampling``, DAPO's rounds (Yu et al. 2025, sec. 3.2)
  until every process has its share of informative groups, or ``dynamic_sampling_rounds`` extra
  rounds.

The collectives stay where every process agrees: the selector draws the same list on every
process, and every process takes part in each gather and reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from podsrl.algorithms.group_stats import is_constant
from podsrl.distributed import Processes
from podsrl.generation.partial_rollouts import CarriedPool
from podsrl.prompt_selection import PromptSelector, add_selector_record
from podsrl.rollout.partial import PartialGeneration
from podsrl.tasks.base import PreparedSplit
from podsrl.trainer.timer import StageTimer
from podsrl.types import Rollouts, Scores

# (split, n, step, round, carried, quota) -> the round's complete groups [G, n, Lc] and what carries on
GenerateFn = Callable[..., PartialGeneration]
ScoreFn = Callable[[PreparedSplit, Rollouts, int], Scores]  # (split, rollouts, step) -> [P, n]


@dataclass
class ScoredGroups:
    """One step's prompt groups on this process, generated and scored."""

    split: PreparedSplit  # [P] the prompts (examples and rendered text)
    rollouts: Rollouts  # [P, n, Lc]
    scores: Scores  # [P, n], NaN where not generated
    record: dict = field(default_factory=dict)  # the source's numbers for the step's metrics


class PromptSource:
    """A step's prompt groups on this process, generated and scored in rounds (the module's
    docstring); a selector that learns observes the outcomes of every process. ``pool``: partial
    rollouts' groups in flight (None: off); ``extra_rounds``: dynamic sampling's (None: off)."""

    def __init__(self, selector: PromptSelector, prompts_per_step: int, train_split: PreparedSplit,
                 generate: GenerateFn, score: ScoreFn, procs: Processes, *, extra_rounds: int | None = None,
                 pad_token_id: int = 0, pool: CarriedPool | None = None) -> None:
        self.selector, self.prompts_per_step, self.train_split = selector, prompts_per_step, train_split
        self.generate, self.score, self.procs = generate, score, procs
        self.share = prompts_per_step // procs.world_size  # this process's groups per step
        self.extra_rounds, self.pad_token_id = extra_rounds, pad_token_id
        self.pool = pool

    def scored_groups(self, step: int, n: int, timer: StageTimer) -> ScoredGroups:
        pool, procs = self.pool, self.procs
        restarted = pool.bound_staleness(step) if pool is not None else 0
        if self.extra_rounds is None:
            rounds = [self.round(step, n, 0, self.share, timer)]
            groups = rounds[0][1]
        else:
            rounds = rounds_until_informative(
                lambda round_index, quota: self.round(step, n, round_index, quota, timer),
                self.share, self.extra_rounds, procs)
            groups = informative_share(rounds, self.share, self.train_split, procs, self.pad_token_id)
        if pool is not None:
            groups.record.update(pool.step_record(sum(r.record["partial_samples_resumed"] for _, r in rounds),
                                                  restarted, procs))
        add_selector_record(self.selector.record(), groups.record)  # a name of the rounds' own is refused
        return groups

    def round(self, step: int, n: int, round_index: int, quota: int,
              timer: StageTimer) -> tuple[list[int], ScoredGroups]:
        """One generation call: this process's complete groups' prompt indices and their scored
        groups. Without partial rollouts the round is a whole share of fresh prompts, every group
        wanted (DAPO's fixed generation batch, whatever ``quota`` of informative groups it lacks);
        with them, the carried groups and fresh prompts up to ``quota`` + ``partial_extra_prompts``
        in flight, stopped once ``quota`` are complete (0: this process generates nothing and takes
        part in the collectives)."""
        pool, procs = self.pool, self.procs
        if pool is None:  # this process's block of the step's list, the same on every process
            in_flight = procs.block(self.selector.take(self.prompts_per_step, step, n))
            carried, asked, record = {}, None, {}
        else:
            in_flight = pool.prompts + self.fresh_prompts(pool.fresh_needed(quota), step, n)
            carried, asked = dict(enumerate(pool.groups)), quota
            resumed = sum(len(group.cut_off) for group in pool.groups) if quota else 0
            record = {"partial_samples_resumed": resumed}
        split = self.train_split.at_prompts(in_flight)
        with timer("generate"):
            result = self.generate(split, n, step, round_index, carried, asked)
        if pool is not None:
            pool.prompts = [in_flight[p] for p in sorted(result.carried)]
            pool.groups = [result.carried[p] for p in sorted(result.carried)]
        done = [in_flight[p] for p in result.complete]
        split = self.train_split.at_prompts(done)
        rollouts = result.rollouts  # [G, n, Lc]
        with timer("reward"):
            scores = self.score(split, rollouts, step)  # [G, n], NaN where skipped
        if self.selector.learns:  # collectives: every process's complete groups, in process order
            correct = scores.correct.masked_fill(~rollouts.generated_mask, float("nan"))  # [G, n]
            every = procs.gather_objects((done, correct))
            self.selector.observe(step, [i for indices, _ in every for i in indices],
                                  torch.cat([rows for _, rows in every]))
        return done, ScoredGroups(split, rollouts, scores, record)

    def fresh_prompts(self, count: int, step: int, n: int) -> list[int]:
        """``count`` new prompts for this process: one list drawn for every process's counts (a
        collective), this process's slice of it."""
        counts = [int(c) for c in self.procs.gather(torch.tensor([count])).tolist()]  # [world]
        indices = self.selector.take(sum(counts), step, n) if sum(counts) else []
        first = sum(counts[:self.procs.rank])
        return indices[first:first + count]


def informative_first(constant: torch.Tensor, count: int) -> list[int]:
    """The first ``count`` groups by generation order, informative ones (``constant`` [G]
    False) before constant ones: DAPO's batch of informative groups, filled up at the cap."""
    order = sorted(range(len(constant)), key=lambda i: bool(constant[i]))  # stable: generation order kept
    return order[:count]


# (round, quota: the informative groups this process still lacks) -> the round's prompts and groups
RoundFn = Callable[[int, int], tuple[list[int], ScoredGroups]]


def rounds_until_informative(generate_round: RoundFn, share: int, extra_rounds: int,
                             procs: Processes) -> list[tuple[list[int], ScoredGroups]]:
    """DAPO's rounds (Yu et al. 2025, sec. 3.2): ``generate_round(round, quota)`` until every
    process has its ``share`` of informative groups (rewards not all equal), at most
    ``extra_rounds`` more than one; ``quota`` is what this process still lacks. Every process runs every round
    (the decision is a collective)."""
    rounds, informative = [], 0
    for round_index in range(extra_rounds + 1):
        mine, groups = generate_round(round_index, share - informative)
        rounds.append((mine, groups))
        informative += int((~is_constant(groups.scores.reward)).sum())  # this process's, over the rounds
        if not procs.max([float(informative < share)])[0]:
            break
    return rounds


def informative_share(rounds: list[tuple[list[int], ScoredGroups]], share: int, train_split: PreparedSplit,
                      procs: Processes, pad_token_id: int) -> ScoredGroups:
    """This process's ``share`` of the rounds' groups, informative ones first (constant ones fill
    the batch only at the cap), with the rounds' numbers; rounds that generated nothing here
    (partial rollouts: this process's share was met) add no group."""
    indices = [i for mine, _ in rounds for i in mine]
    generated = [groups for mine, groups in rounds if mine]
    rollouts = Rollouts.concat([g.rollouts for g in generated], pad_token_id)  # [P * rounds, n, Lc]
    scores = Scores.concat([g.scores for g in generated])
    constant = is_constant(scores.reward)  # [P * rounds]
    trained = informative_first(constant, share)  # this process's share: the groups it trains on
    generated_groups, constant_groups, set_aside = procs.sum(
        [float(len(constant)), float(constant.sum()), float(constant.sum() - constant[trained].sum())])
    record = {"prompt_rounds": len(rounds), "prompts_generated": int(generated_groups),
              "generated_constant_frac": constant_groups / generated_groups,
              "constant_groups_set_aside": int(set_aside)}
    return ScoredGroups(train_split.at_prompts([indices[i] for i in trained]), rollouts.at_prompts(trained),
                        scores.at_prompts(trained), record)

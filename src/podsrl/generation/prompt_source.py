"""Where a step's prompt groups come from: a prompt source asks the prompt selector
(:mod:`podsrl.prompt_selection`) for prompts, has this process's share generated and scored,
and hands the loop one :class:`ScoredGroups`.

* :class:`PromptSource`: one round per step, from any selector (the ``shuffled`` pass,
  ``pass_rate``, a user's).
* :class:`DynamicSamplingSource` (``dynamic_sampling``): DAPO's dynamic sampling (Yu et al.
  2025, sec. 3.2), from any selector: rounds until every process has its share of informative
  groups, or ``dynamic_sampling_rounds`` extra rounds.

The collectives stay where every process agrees: the selector draws the same list on every
process, and every process takes part in each gather and reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from podsrl.algorithms.group_stats import is_constant
from podsrl.distributed import Processes
from podsrl.prompt_selection import PromptSelector, add_selector_record
from podsrl.tasks.base import PreparedSplit
from podsrl.trainer.timer import StageTimer
from podsrl.types import Rollouts, Scores

GenerateFn = Callable[[PreparedSplit, int, int, int], Rollouts]  # (split, n, step, round) -> [P, n, Lc]
ScoreFn = Callable[[PreparedSplit, Rollouts, int], Scores]  # (split, rollouts, step) -> [P, n]


@dataclass
class ScoredGroups:
    """One step's prompt groups on this process, generated and scored."""

    split: PreparedSplit  # [P] the prompts (examples and rendered text)
    rollouts: Rollouts  # [P, n, Lc]
    scores: Scores  # [P, n], NaN where not generated
    record: dict = field(default_factory=dict)  # the source's numbers for the step's metrics


class PromptSource:
    """One generation round per step: the selector's ``prompts_per_step`` prompts, this
    process's block of them generated and scored; a selector that learns observes the
    outcomes of every process."""

    def __init__(self, selector: PromptSelector, prompts_per_step: int, train_split: PreparedSplit,
                 generate: GenerateFn, score: ScoreFn, procs: Processes) -> None:
        self.selector, self.prompts_per_step, self.train_split = selector, prompts_per_step, train_split
        self.generate, self.score, self.procs = generate, score, procs

    def scored_groups(self, step: int, n: int, timer: StageTimer) -> ScoredGroups:
        _, groups = self.round(step, n, 0, timer)
        groups.record = self.selector.record()
        return groups

    def round(self, step: int, n: int, round_index: int, timer: StageTimer) -> tuple[list[int], ScoredGroups]:
        """One round: this process's prompt indices and their scored groups."""
        indices = self.selector.take(self.prompts_per_step, step, n)  # the same list on every process
        mine = self.procs.block(indices)  # this process's share
        split = self.train_split.at_prompts(mine)
        with timer("generate"):
            rollouts = self.generate(split, n, step, round_index)  # [P, n, Lc]
        with timer("reward"):
            scores = self.score(split, rollouts, step)  # [P, n], NaN where skipped
        if self.selector.learns:  # the gather is a collective: only for a selector that uses it
            correct = scores.correct.masked_fill(~rollouts.generated_mask, float("nan"))  # [P, n]
            self.selector.observe(step, indices, self.procs.gather(correct))  # [P_all, n]: every process's
        return mine, ScoredGroups(split, rollouts, scores)


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


class DynamicSamplingSource(PromptSource):
    """DAPO's dynamic sampling: another round while any process has fewer informative groups
    than its share, at most ``extra_rounds`` extra rounds; each process then keeps its share,
    informative groups first (constant ones fill the batch only at the cap)."""

    def __init__(self, selector: PromptSelector, prompts_per_step: int, train_split: PreparedSplit,
                 generate: GenerateFn, score: ScoreFn, procs: Processes, extra_rounds: int,
                 pad_token_id: int) -> None:
        super().__init__(selector, prompts_per_step, train_split, generate, score, procs)
        self.extra_rounds, self.pad_token_id = extra_rounds, pad_token_id

    def scored_groups(self, step: int, n: int, timer: StageTimer) -> ScoredGroups:
        share = self.prompts_per_step // self.procs.world_size
        # a round generates a whole share whatever it lacks (DAPO's fixed generation batch)
        rounds = rounds_until_informative(lambda round_index, quota: self.round(step, n, round_index, timer),
                                          share, self.extra_rounds, self.procs)
        groups = informative_share(rounds, share, self.train_split, self.procs, self.pad_token_id)
        add_selector_record(self.selector.record(), groups.record)  # a name of the rounds' own is refused
        return groups

"""The step's stages, each bound at set-up (:func:`podsrl.trainer.setup.step_stages`) to the
config values it needs, so the loop calls them and reads no config:

    n = group_size.choose(step)                      # fixed, or adaptive_n's controller
    groups = prompts.scored_groups(step, n, timer)   # the prompt source: generate + reward
    kept_indices = select(groups)                    # [P, n] -> [P, m]
    advantages(kept_rewards)                         # [P, m] -> [P, m]
    logprobs(batch)                                  # old / reference log-probs, when needed
    update(batch)                                    # num_iterations optimizer steps

:class:`RolloutGenerator` and :class:`ScoreEverywhere` are what the prompt source
(:mod:`podsrl.generation.prompt_source`) generates and scores with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from podsrl.algorithms.early_stop import at_bounds
from podsrl.algorithms.importance import SamplerCorrection
from podsrl.algorithms.rollout_budget import GroupSizePolicy
from podsrl.contracts import UserCodeError
from podsrl.distributed import Processes
from podsrl.generation.prompt_source import PromptSource
from podsrl.generation.pruning import QuotaPruner, RunPruning
from podsrl.generation.saturation import SaturationStopper
from podsrl.methods import Keeping
from podsrl.rewards import RewardError
from podsrl.rollout import GenerationEngine, WatcherFactory
from podsrl.rollout.partial import CarriedGroup, PartialCall, PartialGeneration
from podsrl.scoring import Scorer, TrainerProgress
from podsrl.tasks.base import Example, PreparedSplit
from podsrl.trainer.state import sampling_seed
from podsrl.types import Rollouts, Scores, UpdateBatch
from podsrl.update import UpdateOptions, UpdateResult, batch_logprobs, update_policy


@dataclass(frozen=True)
class Advantages:
    """The advantage estimator bound to ``scale_rewards``: kept rewards [P, m] -> [P, m]."""

    estimator: Callable[[torch.Tensor, bool], torch.Tensor]
    scale_rewards: bool

    def __call__(self, kept_rewards: torch.Tensor) -> torch.Tensor:
        return self.estimator(kept_rewards, self.scale_rewards)


@dataclass(frozen=True)
class ExtraLogprobs:
    """The log-probs the update needs besides its own, on the kept rollouts only: the
    generating policy's (``old``: a batch reused over iterations) and the reference's (``ref``:
    the KL); with LoRA the reference is the policy with its adapter off (``reference`` None)."""

    policy: torch.nn.Module
    reference: torch.nn.Module | None
    micro_batch_size: int
    share_prompt: bool
    old: bool
    ref: bool

    def __call__(self, batch: UpdateBatch) -> None:
        options = dict(size=self.micro_batch_size, share_prompt=self.share_prompt)
        if self.old:
            batch.old_logp = batch_logprobs(self.policy, batch, **options)
        if self.ref:
            if self.reference is None:
                with self.policy.disable_adapter():
                    batch.ref_logp = batch_logprobs(self.policy, batch, **options)
            else:
                batch.ref_logp = batch_logprobs(self.reference, batch, **options)


@dataclass
class PolicyUpdate:
    """``iterations`` optimizer steps on the step's batch (GRPO's mu: the batch reused). The
    model and optimizer are the wrapped ones (DDP / FSDP), set by :meth:`bind` once the run
    has prepared them."""

    scheduler: torch.optim.lr_scheduler.LRScheduler
    options: UpdateOptions
    procs: Processes
    iterations: int
    # importance weights between the sampling engine and the policy, for batches that carry the
    # engine's log-probs (UpdateBatch.sampling_logp); None: the difference is logged, not corrected
    correction: SamplerCorrection | None = None
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None

    def bind(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def __call__(self, batch: UpdateBatch) -> UpdateResult:
        tokens_per_process = self.procs.sum([float(batch.completion_mask.sum())])[0] / self.procs.world_size
        for _ in range(self.iterations):
            update = update_policy(self.model, self.optimizer, self.scheduler, batch, self.options, self.procs,
                                   tokens_per_process, self.correction)
        return update


@dataclass(frozen=True)
class ProgressAt:
    """Reward functions' ``trainer_state`` while a step's rollouts are scored (TRL scores
    before the step's optimizer step, so ``global_step`` counts the steps completed)."""

    max_steps: int
    prompts_per_step: int
    train_prompts: int
    is_main: bool
    is_local_main: bool

    def __call__(self, step: int) -> TrainerProgress:
        done = step - 1
        return TrainerProgress(global_step=done, max_steps=self.max_steps,
                               epoch=done * self.prompts_per_step / self.train_prompts,
                               is_world_process_zero=self.is_main, is_local_process_zero=self.is_local_main)


@dataclass(frozen=True)
class ScoreEverywhere:
    """The rollouts' scores; a reward failure (the 'raise' policy) on any process stops every
    process here, so none is left waiting for the others in a later collective."""

    scorer: Scorer
    procs: Processes
    progress: ProgressAt

    def __call__(self, split: PreparedSplit, rollouts: Rollouts, step: int) -> Scores:
        failure = None
        try:
            scores = self.scorer(split, rollouts, self.progress(step))
        except RewardError as err:
            failure = err
        raise_on_every_process(self.procs, failure)
        return scores


def raise_on_every_process(procs: Processes, failure: RewardError | None) -> None:
    """Raise ``failure`` here, or a RewardError naming another process's, on every process
    at once if any process had one (a collective: every process must call this)."""
    if procs.max([float(failure is not None)])[0]:
        raise failure or RewardError("a reward function failed on another process (its error is in that "
                                     "process's output)")


@dataclass(frozen=True)
class StopperFactory:
    """group_early_stop: a :class:`SaturationStopper` per chunk of prompts, scoring samples as
    they finish against the reward's declared bounds."""

    scorer: Scorer
    tokenizer: object
    keeping: Keeping
    bounds: tuple[float, float]
    progress: ProgressAt
    pruning: RunPruning | None = None  # prune_running: a pruner beside each stopper, reading its scores

    def __call__(self, prompts: PreparedSplit, step: int) -> SaturationStopper:
        return SaturationStopper(self.scorer, prompts, self.tokenizer, self.keeping.m, self.bounds, self.progress(step))

    def learn_from(self, watchers: tuple, rollouts: Rollouts, groups: list[int] | None = None) -> None:
        """Hand the run's pruning what a call's pruner (among ``watchers``) judged, with the classes
        early stop scored; ``groups``: the rollouts' positions among the call's prompts, when they
        are not all of them in order (partial rollouts return the complete groups only: a judged
        sample that carries over is not learned)."""
        pruner = next((w for w in watchers if isinstance(w, QuotaPruner)), None)
        if pruner is None or rollouts.early_scores is None:
            return
        rewards = rollouts.early_scores.reward  # [G, n], NaN where early stop scored nothing
        known = (~rewards.isnan() & rollouts.generated_mask).nonzero().tolist()
        high = at_bounds(rewards, *self.bounds)[1]  # [G, n]
        position = list(range(len(rewards))) if groups is None else groups
        self.pruning.called(pruner, {(position[g], s): bool(high[g, s]) for g, s in known})


@dataclass(frozen=True)
class RolloutGenerator:
    """The method's rollouts for each prompt of a split (n of them for pods), in chunks of
    ``batch_size / rollouts per prompt`` prompts (``batch_size`` 0: one chunk), each chunk
    seeded by its position in the step's batch (so the split over processes does not change
    the samples) and by the generation round (dynamic sampling's refills draw afresh). Each call
    gets its watchers: with ``early_stop``, saturated groups stop early (``Rollouts.generated``
    marks what they skipped), their scores travel with the rollouts, and a reward failure while
    scoring them is raised after generation, on every process together; ``watchers``: the
    user's factories (``generation_watchers``), whose stopped groups must keep m samples."""

    engine: GenerationEngine
    policy: torch.nn.Module
    tokenizer: object
    procs: Processes
    keeping: Keeping
    batch_size: int
    prompts_per_step: int
    seed: int
    early_stop: StopperFactory | None
    watchers: tuple[WatcherFactory, ...] = ()

    def watching(self, prompts: PreparedSplit, step: int, early: bool,
                 per_prompt: int) -> tuple[SaturationStopper | None, tuple]:
        """This call's early-stop watcher (when ``early``) and all its watchers, early stop's first,
        then its pruner (prune_running; ``per_prompt`` samples a prompt), then the user's."""
        stopper = self.early_stop(prompts, step) if self.early_stop and early else None
        pruning = self.early_stop.pruning if stopper is not None else None
        pruner = pruning.pruner(stopper, per_prompt) if pruning is not None else None
        users = tuple(make(prompts, self.tokenizer, step, per_prompt) for make in self.watchers)
        return stopper, tuple(w for w in (stopper, pruner) if w is not None) + users

    def check_kept(self, rollouts: Rollouts) -> None:
        """A user's watcher that stopped a group below m generated samples broke the run's
        selection: one line naming the watchers, on every process together (a collective when
        the run has user watchers), not a failure in the selection rule."""
        if not self.watchers:
            return
        counts = rollouts.generated_mask.sum(dim=1)  # [P]
        fewest = int(counts.min()) if len(counts) else self.keeping.m
        fewest = -int(self.procs.max([-float(fewest)])[0])  # the fewest on any process
        if fewest < self.keeping.m:
            names = ", ".join(make.spec for make in self.watchers)
            raise UserCodeError(f"generation_watchers: {names} stopped a group with {fewest} samples "
                                f"generated, fewer than num_kept = {self.keeping.m}; a watcher must leave "
                                f"each group at least m samples to select from")

    def __call__(self, split: PreparedSplit, n: int, step: int, round_index: int,
                 carried: dict[int, CarriedGroup] | None = None,
                 quota: int | None = None) -> PartialGeneration:
        """The one generation call of a step's round: every prompt's group (``quota`` None: in
        chunks of ``batch_size`` rollouts, each seeded by its first prompt's place in the step), or,
        with partial rollouts (:mod:`podsrl.generation.partial_rollouts`), one engine call on the
        split, whose prompts at the positions in ``carried`` continue their groups, stopped once
        ``quota`` groups are complete, seeded by the step, the round and this process. Quota 0
        (dynamic sampling's round where this process has its share): no engine call, every group
        carried on, and the collectives of a call joined. The complete groups come back in the
        order they completed (every group, in prompt order, without a quota)."""
        per_prompt = self.keeping.generated_per_prompt(n)
        if quota is None:
            rollouts = self.every_group(split, per_prompt, step, round_index)
            return PartialGeneration(rollouts, list(range(len(split.prompts))), {})
        stopper, watchers = (self.watching(split, step, early=True, per_prompt=per_prompt) if quota
                             else (None, ()))
        with self.procs.whole_weights(self.policy):  # its all-gathers, when sharded, need every process
            first_prompt = (round_index * self.procs.world_size + self.procs.rank) * self.prompts_per_step
            torch.manual_seed(sampling_seed(self.seed, step, first_prompt))
            result = (self.engine(self.policy, self.tokenizer, split.prompts, per_prompt, watchers=watchers,
                                  partial=PartialCall(dict(carried or {}), quota, step))
                      if quota else PartialGeneration(Rollouts.none(per_prompt), [], dict(carried or {})))
        if stopper is not None:  # the scores early stop gave, for the reward stage
            early_scores = stopper.early_scores(result.rollouts, result.complete)
            result.rollouts = dataclasses.replace(result.rollouts, early_scores=early_scores)
            self.early_stop.learn_from(watchers, result.rollouts, result.complete)
        self.check_kept(result.rollouts)
        if self.early_stop is not None:  # early stop's reward failure, raised on every process together
            raise_on_every_process(self.procs, stopper.failure if stopper is not None else None)
        return result

    def every_group(self, split: PreparedSplit, per_prompt: int, step: int, round_index: int) -> Rollouts:
        """Every prompt's ``per_prompt`` rollouts [P, per_prompt, Lc], in chunks of ``batch_size``."""
        total = len(split.prompts)
        chunk_size = max(1, self.batch_size // per_prompt) if self.batch_size else total
        chunks, failure = [], None
        with self.procs.whole_weights(self.policy):
            for start in range(0, total, chunk_size):
                chunk = split.at_prompts(list(range(start, min(start + chunk_size, total))))
                stopper, watchers = self.watching(chunk, step, early=failure is None, per_prompt=per_prompt)
                # in the step
                first_prompt = round_index * self.prompts_per_step + self.procs.rank * total + start
                torch.manual_seed(sampling_seed(self.seed, step, first_prompt))
                rollouts = self.engine(self.policy, self.tokenizer, chunk.prompts, per_prompt, watchers=watchers)
                self.check_kept(rollouts)
                if stopper is not None:  # the scores early stop gave, for the reward stage to reuse
                    rollouts = dataclasses.replace(rollouts, early_scores=stopper.early_scores(rollouts))
                    failure = stopper.failure
                    self.early_stop.learn_from(watchers, rollouts)
                chunks.append(rollouts)
        if self.early_stop is not None:  # early stop's reward failure, raised on every process together
            raise_on_every_process(self.procs, failure)
        return Rollouts.concat(chunks, self.tokenizer.pad_token_id)


@dataclass
class StepOutcome:
    """One step's pipeline products, for the step's record, its hooks and its rollout log."""

    examples: list[Example]  # [P] this process's prompts
    rollouts: Rollouts  # [P, n, Lc]
    scores: Scores  # [P, n]
    kept_indices: torch.Tensor  # [P, m] indices of the kept rollouts into the group axis
    kept: Rollouts  # [P, m, Lc]
    kept_rewards: torch.Tensor  # [P, m]
    advantages: torch.Tensor  # [P, m] the kept rollouts' (all 0: the step had nothing to learn from)
    update: UpdateResult
    prompt_record: dict = field(default_factory=dict)  # the prompt source's numbers (none for the default)


@dataclass
class StepStages:
    """The stages of one training step, configured: what :func:`podsrl.trainer.loop.training_step`
    calls, in order."""

    group_size: GroupSizePolicy  # n per step: fixed, or adaptive_n's controller
    prompts: PromptSource  # the step's prompt groups, generated and scored
    select: Keeping  # groups [P, n] -> indices kept [P, m]
    advantages: Advantages  # kept rewards [P, m] -> advantages [P, m]
    logprobs: ExtraLogprobs | None  # old / reference log-probs (None: the update needs neither)
    update: PolicyUpdate  # the optimizer step(s)

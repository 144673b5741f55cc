"""Step hooks: what happens after a step's pipeline besides evaluation, logging and
checkpoints. Each is built with what it reads, sees the finished step and adds its numbers to
the step's metrics record; :func:`step_hooks` picks the ones a run needs, so the loop has no
branch for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from podsrl.algorithms.rollout_budget import GroupSizePolicy
from podsrl.distributed import Processes
from podsrl.generation.pruning import RunPruning
from podsrl.rollout import PRUNE_RUNNING, watcher_kind
from podsrl.trainer.config import Config
from podsrl.trainer.cores import CoreShare
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.timer import StageTimer


class StepHook(Protocol):
    """What sees a finished step (:class:`~podsrl.trainer.stages.StepOutcome`) besides evaluation,
    logging and checkpoints, and adds its numbers to the step's metrics ``record``."""

    def after_step(self, outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        ...


@dataclass(frozen=True)
class ParameterDrift:
    """Replicated multi-process runs (DDP): the largest difference of a parameter between
    processes, which must stay ~0 (a drift means the processes no longer train one model)."""

    procs: Processes
    policy: torch.nn.Module  # the bare model: DDP's wrapper holds the same parameters

    def after_step(self, outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        record["rank_param_spread"] = self.procs.parameter_spread(self.policy)


@dataclass(frozen=True)
class GroupSizeFeedback:
    """adaptive_n: log what the group-size policy chose for this step and why, then let it
    learn from the step's rewards (every process's) and the slowest process's timings."""

    procs: Processes
    policy: GroupSizePolicy

    def after_step(self, outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        procs, policy = self.procs, self.policy
        record.update(policy.decision)
        generation = procs.max([timer.seconds["generate"] + timer.seconds["reward"]])[0]
        policy.observe(procs.gather(outcome.scores.reward), generation,
                       procs.max([timer.total])[0] - generation)


@dataclass(frozen=True)
class EngineRecord:
    """An engine's own numbers for the step (the vllm engine: seconds spent pushing weights),
    averaged over the processes."""

    procs: Processes
    engine: object  # an engine with step_record()

    def after_step(self, outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        record.update(self.procs.mean(self.engine.step_record()))


@dataclass(frozen=True)
class PruningFeedback:
    """prune_running: the quality head learns the step's judged samples (every process's), the
    next step's detection points follow this step's completion lengths, and the record says
    what was pruned and how well the head did."""

    procs: Processes
    pruning: RunPruning

    def after_step(self, outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        rollouts, procs = outcome.rollouts, self.procs
        lengths = rollouts.completion_mask.sum(-1).double()[rollouts.generated_mask]
        total, count = procs.sum([float(lengths.sum()), float(len(lengths))])
        expected = total / count if count else self.pruning.expected
        record.update(self.pruning.after_step(procs, expected))
        if "pruned_tokens" in rollouts.stats:
            record["pruned_tokens"] = procs.sum([float(rollouts.stats["pruned_tokens"])])[0]


@dataclass(frozen=True)
class WatcherPruning:
    """A user's ``prune_running`` watcher (``generation_watchers``): the samples it stopped and the
    tokens they had drawn, summed over processes, named as podsrl's own pruning names them."""

    procs: Processes

    def after_step(self, outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        stats = outcome.rollouts.stats
        pruned = [float(stats.get(name, 0)) for name in ("pruned_samples", "pruned_tokens")]
        record["pruned_samples"], record["pruned_tokens"] = self.procs.sum(pruned)


@dataclass(frozen=True)
class ThreadCount:
    """The threads the step ran on (``torch_threads`` in its record), then the count for what comes
    next: the cores other processes left free over the step (:class:`CoreShare`)."""

    cores: CoreShare

    def after_step(self, outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        record["torch_threads"] = torch.get_num_threads()
        self.cores.follow()


def step_hooks(cfg: Config, procs: Processes, policy: torch.nn.Module, engine=None,
               group_size: GroupSizePolicy | None = None, cores: CoreShare | None = None,
               pruning: RunPruning | None = None) -> list[StepHook]:
    """The hooks a run with ``cfg`` over ``procs`` needs, in the order they run, each built with
    what it reads."""
    hooks: list[StepHook] = [ThreadCount(cores)] if cores is not None else []
    if hasattr(engine, "step_record"):
        hooks.append(EngineRecord(procs, engine))
    if procs.world_size > 1 and not procs.sharded:
        hooks.append(ParameterDrift(procs, policy))
    if cfg.adaptive_n:
        hooks.append(GroupSizeFeedback(procs, group_size))
    if cfg.prune_running:
        hooks.append(PruningFeedback(procs, pruning))
    if any(watcher_kind(spec) == PRUNE_RUNNING for spec in cfg.watcher_specs):
        hooks.append(WatcherPruning(procs))
    return hooks

"""Step hooks: what happens after a step's pipeline besides evaluation, logging and
checkpoints. Each sees the finished step and adds its numbers to the step's metrics record;
:func:`step_hooks` picks the ones a run needs, so the loop has no branch for them."""

from __future__ import annotations

import torch

from podsrl.algorithms.rollout_budget import GroupSizePolicy
from podsrl.distributed import Processes
from podsrl.rollout import PRUNE_RUNNING, watcher_kind
from podsrl.trainer.components import Components, StepHook
from podsrl.trainer.config import Config
from podsrl.trainer.cores import CoreShare
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.timer import StageTimer


class ParameterDrift:
    """Replicated multi-process runs (DDP): the largest difference of a parameter between
    processes, which must stay ~0 (a drift means the processes no longer train one model)."""

    def after_step(self, components: Components, outcome: StepOutcome, timer: StageTimer,
                   record: dict) -> None:
        record["rank_param_spread"] = components.procs.parameter_spread(components.model)


class GroupSizeFeedback:
    """adaptive_n: log what the group-size policy chose for this step and why, then let it
    learn from the step's rewards (every process's) and the slowest process's timings."""

    def __init__(self, policy: GroupSizePolicy) -> None:
        self.policy = policy

    def after_step(self, components: Components, outcome: StepOutcome, timer: StageTimer,
                   record: dict) -> None:
        procs, policy = components.procs, self.policy
        record.update(policy.decision)
        generation = procs.max([timer.seconds["generate"] + timer.seconds["reward"]])[0]
        policy.observe(procs.gather(outcome.scores.reward), generation,
                       procs.max([timer.total])[0] - generation)


class EngineRecord:
    """An engine's own numbers for the step (the vllm engine: seconds spent pushing weights),
    averaged over the processes."""

    def after_step(self, components: Components, outcome: StepOutcome, timer: StageTimer,
                   record: dict) -> None:
        record.update(components.procs.mean(components.engine.step_record()))


class PruningFeedback:
    """prune_running: the quality head learns the step's judged samples (every process's), the
    next step's detection points follow this step's completion lengths, and the record says
    what was pruned and how well the head did."""

    def after_step(self, components: Components, outcome: StepOutcome, timer: StageTimer,
                   record: dict) -> None:
        rollouts, procs = outcome.rollouts, components.procs
        lengths = rollouts.completion_mask.sum(-1).double()[rollouts.generated_mask]
        total, count = procs.sum([float(lengths.sum()), float(len(lengths))])
        expected = total / count if count else components.pruning.expected
        record.update(components.pruning.after_step(procs, expected))
        if "pruned_tokens" in rollouts.stats:
            record["pruned_tokens"] = procs.sum([float(rollouts.stats["pruned_tokens"])])[0]


class WatcherPruning:
    """A user's ``prune_running`` watcher (``generation_watchers``): the samples it stopped and the
    tokens they had drawn, summed over processes, named as podsrl's own pruning names them."""

    def after_step(self, components: Components, outcome: StepOutcome, timer: StageTimer,
                   record: dict) -> None:
        stats = outcome.rollouts.stats
        pruned = [float(stats.get(name, 0)) for name in ("pruned_samples", "pruned_tokens")]
        record["pruned_samples"], record["pruned_tokens"] = components.procs.sum(pruned)


class ThreadCount:
    """The threads the step ran on (``torch_threads`` in its record), then the count for what comes
    next: the cores other processes left free over the step (:class:`CoreShare`)."""

    def __init__(self, cores: CoreShare) -> None:
        self.cores = cores

    def after_step(self, components: Components, outcome: StepOutcome, timer: StageTimer,
                   record: dict) -> None:
        record["torch_threads"] = torch.get_num_threads()
        self.cores.follow()


def step_hooks(cfg: Config, procs: Processes, engine=None, group_size: GroupSizePolicy | None = None,
               cores: CoreShare | None = None) -> list[StepHook]:
    """The hooks a run with ``cfg`` over ``procs`` needs, in the order they run."""
    hooks: list[StepHook] = [ThreadCount(cores)] if cores is not None else []
    if hasattr(engine, "step_record"):
        hooks.append(EngineRecord())
    if procs.world_size > 1 and not procs.sharded:
        hooks.append(ParameterDrift())
    if cfg.adaptive_n:
        hooks.append(GroupSizeFeedback(group_size))
    if cfg.prune_running:
        hooks.append(PruningFeedback())
    if any(watcher_kind(spec) == PRUNE_RUNNING for spec in cfg.watcher_specs):
        hooks.append(WatcherPruning())
    return hooks

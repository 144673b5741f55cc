"""A training run in four parts, and what sees a finished step:

* :class:`~podsrl.trainer.stages.StepStages`: the step's stages, configured (the loop calls them);
* :class:`Components`: what the run is built from, once, by :func:`podsrl.trainer.setup.set_up`
  (no config: what the run reads of it is bound there, :class:`podsrl.trainer.run.RunSettings`);
* :class:`~podsrl.trainer.state.RunState`: the counters and the learned parts a checkpoint
  restores besides the weights, the optimizer and the scheduler;
* :class:`Cadence`: when things happen (the end, evaluations, checkpoints, giving up);
* :class:`StepHook`: what sees a finished step (:class:`~podsrl.trainer.stages.StepOutcome`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch

from podsrl.distributed import Processes
from podsrl.metrics import MetricsLog
from podsrl.models import ModelBundle
from podsrl.rewards.scorer import Scorer
from podsrl.rollout import GenerationEngine, generate
from podsrl.tasks import PreparedSplit, Task
from podsrl.tracking import Trackers
from podsrl.trainer.evaluate import EvalOptions
from podsrl.trainer.run_dir import RunLock
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.state import RunState
from podsrl.trainer.timer import StageTimer
from podsrl.types import Rollouts


class StepHook(Protocol):
    """What happens after a step's pipeline besides evaluation, logging and checkpoints:
    sees the step and adds its numbers to the step's metrics ``record`` (podsrl.trainer.hooks)."""

    def after_step(self, components: "Components", outcome: StepOutcome, timer: StageTimer, record: dict) -> None:
        ...


@dataclass
class Components:
    """Everything a run works with, built once."""

    procs: Processes
    run_dir: Path
    task: Task
    bundle: ModelBundle
    train_split: PreparedSplit
    test_split: PreparedSplit
    scorer: Scorer
    engine: GenerationEngine  # built by podsrl.rollout.ENGINES
    policy: torch.nn.Module  # the bare model: generation, no-grad log-probs, saving
    reference: torch.nn.Module | None  # a frozen copy for the KL (None: none, or LoRA's adapter-free base)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    metrics: MetricsLog | None  # only the main process writes
    rollout_log: MetricsLog | None  # rollouts.jsonl (log_rollouts groups per step); only the main process
    trackers: Trackers  # none but on the main process with report_to
    eval_options: EvalOptions
    hooks: list[StepHook] = field(default_factory=list)  # run after each step, in order
    eval_generate: Callable[..., Rollouts] = generate  # evaluation's sampler: transformers, or the engine's own
    model: torch.nn.Module | None = None  # the policy as the update sees it (DDP / FSDP), after prepare()
    lock: RunLock | None = None  # the run folder's lock, held by the main process until the run ends

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


@dataclass
class Cadence:
    """When the run ends, evaluates and checkpoints, and when it gives up (the config's fields,
    read in one place)."""

    max_steps: int
    max_consecutive_skips: int = 5  # non-finite steps in a row before the run stops
    max_minutes: float = 0.0  # 0: no time budget
    eval_steps: int = 0  # 0: only at the start and the end
    save_steps: int = 0  # 0: no step-count checkpoints
    checkpoint_minutes: float = 0.0  # 0: no time-based checkpoints
    last_checkpoint_time: float = field(default_factory=time.time)

    def out_of_time(self, state: RunState) -> bool:
        return bool(self.max_minutes) and state.train_seconds >= self.max_minutes * 60

    def more_steps(self, state: RunState) -> bool:
        return state.step < self.max_steps and not self.out_of_time(state)

    def evaluation_due(self, state: RunState) -> bool:
        """Every eval_steps steps, and after the last step."""
        return bool(self.eval_steps and state.step % self.eval_steps == 0) or not self.more_steps(state)

    def checkpoint_due_by_steps(self, state: RunState) -> bool:
        return bool(self.save_steps and state.step % self.save_steps == 0)

    def checkpoint_due_by_time(self) -> bool:
        """On this process's clock: the processes must agree before acting on it."""
        return bool(self.checkpoint_minutes) and time.time() - self.last_checkpoint_time >= self.checkpoint_minutes * 60

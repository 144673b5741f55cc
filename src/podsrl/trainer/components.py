"""A training run in four parts, and what sees a finished step:

* :class:`~podsrl.trainer.stages.StepStages`: the step's stages, configured (the loop calls them);
* :class:`Components`: what the run is built from, once, by :func:`podsrl.trainer.setup.set_up`
  (no config: what the run reads of it is bound at set-up, each job's options in its owner);
* :class:`~podsrl.trainer.state.RunState`: the counters and the learned parts a checkpoint
  restores besides the weights, the optimizer and the scheduler;
* :class:`StepHook`: what sees a finished step (:class:`~podsrl.trainer.stages.StepOutcome`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from podsrl.distributed import Processes
from podsrl.generation.pruning import RunPruning
from podsrl.metrics import MetricsLog
from podsrl.models import ModelBundle
from podsrl.rollout import GenerationEngine
from podsrl.run_folder.claim import RunLock
from podsrl.scoring import Scorer
from podsrl.tasks import PreparedSplit, Task
from podsrl.tracking import Trackers
from podsrl.trainer.evaluate import Evaluator
from podsrl.trainer.logging import LogOptions
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.timer import StageTimer


class StepHook(Protocol):
    """What happens after a step's pipeline besides evaluation, logging and checkpoints:
    sees the step and adds its numbers to the step's metrics ``record`` (podsrl.trainer.hooks)."""

    def after_step(self, components: "Components", outcome: StepOutcome, timer: StageTimer,
                   record: dict) -> None:
        ...


@dataclass
class Components:
    """Everything a run works with, built once."""

    procs: Processes
    run_dir: Path
    task: Task
    bundle: ModelBundle
    train_split: PreparedSplit
    scorer: Scorer
    engine: GenerationEngine  # built by podsrl.rollout.ENGINES
    policy: torch.nn.Module  # the bare model: generation, no-grad log-probs, saving
    reference: torch.nn.Module | None  # a frozen copy for the KL (None: none, or LoRA's adapter-free base)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    metrics: MetricsLog | None  # only the main process writes
    rollout_log: MetricsLog | None  # rollouts.jsonl (log_rollouts groups per step); only the main process
    trackers: Trackers  # none but on the main process with report_to
    log_options: LogOptions  # the progress bar, rollout samples, trackers
    recorded_config: dict  # the config as config.json and the trackers record it
    forward_dtype: str  # "bfloat16": forward passes autocast to it (bf16); "": as the weights are
    evaluator: Evaluator  # when the run evaluates, and on what (the held-out split)
    hooks: list[StepHook] = field(default_factory=list)  # run after each step, in order
    pruning: RunPruning | None = None  # prune_running: the quality head and the step's pruners (a run part)
    model: torch.nn.Module | None = None  # the policy as the update sees it (DDP / FSDP), after prepare()
    lock: RunLock | None = None  # the run folder's lock, held by the main process until the run ends

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

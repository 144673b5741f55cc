"""One training run's components and the bookkeeping around the loop: evaluation,
resume-or-start, checkpoints, the time budget, and the files written at the end."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from podsrl.algorithms.rollout_budget import RolloutBudget
from podsrl.config import Config
from podsrl.distributed import Processes
from podsrl.methods import Method
from podsrl.provenance import record_environment
from podsrl.models import ModelBundle
from podsrl.rewards.scorer import Scorer, TrainerProgress
from podsrl.tasks import PreparedSplit, Task
from podsrl.models.precision import autocast
from podsrl.trainer.checkpoints import list_checkpoints, load_checkpoint, save_checkpoint
from podsrl.trainer.evaluate import EvalOptions, evaluate
from podsrl.metrics import MetricsLog
from podsrl.trainer.logging import logged_evals, say
from podsrl.trainer.run_dir import RunDirError, RunLock
from podsrl.trainer.state import PromptSampler, TrainingStopped
from podsrl.tracking import Trackers
from podsrl.update import UpdateOptions

EVAL_SEED_OFFSET = 10_007  # evaluation's own seed stream: seed + offset + rank


@dataclass
class RunResult:
    run_dir: Path
    initial: dict[str, float]
    final: dict[str, float]
    steps: int
    train_seconds: float
    is_main: bool = True  # False in the other processes of a multi-process run (they write nothing)


@dataclass
class Run:
    """Everything a training run works with (built by :func:`podsrl.trainer.setup.set_up`)
    and the counters it checkpoints."""

    cfg: Config
    procs: Processes
    run_dir: Path
    task: Task
    bundle: ModelBundle
    train_split: PreparedSplit
    test_split: PreparedSplit
    scorer: Scorer
    engine: object  # built by podsrl.rollout.ENGINES
    method: Method
    policy: torch.nn.Module  # the bare model: generation, no-grad log-probs, saving
    reference: torch.nn.Module | None  # a frozen copy for the KL (None: none, or LoRA's adapter-free base)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generators: dict[str, torch.Generator]  # seeded streams of the rules that draw (checkpointed)
    sampler: PromptSampler
    metrics: MetricsLog | None  # only the main process writes
    rollout_log: MetricsLog | None  # rollouts.jsonl (log_rollouts groups per step); only the main process
    trackers: Trackers  # none but on the main process with report_to
    update_options: UpdateOptions
    eval_options: EvalOptions
    reward_bounds: tuple[float, float] | None = None  # declared bounds of the reward (group_early_stop)
    rollout_budget: RolloutBudget | None = None  # adaptive_n's controller (checkpointed)
    model: torch.nn.Module | None = None  # the policy as the update sees it (DDP / FSDP), after prepare()
    lock: RunLock | None = None  # the run folder's lock, held by the main process until the run ends
    step: int = 0
    train_seconds: float = 0.0  # generation + reward + selection + update, evaluation excluded
    last_checkpoint_time: float = field(default_factory=time.time)

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def evaluate(self) -> dict[str, float]:
        seed = self.cfg.seed + EVAL_SEED_OFFSET + self.procs.rank
        with self.autocast():
            return evaluate(self.bundle, self.task, self.test_split, self.eval_options, seed, self.procs).accuracies

    def autocast(self):
        """Forward passes in bfloat16 under ``bf16`` (weights stay float32), else a no-op."""
        return autocast(self.policy.device, "bfloat16" if self.cfg.bf16 else "")

    def trainer_progress(self) -> TrainerProgress:
        """Reward functions' ``trainer_state`` while the current step's rollouts are scored."""
        done = self.step - 1  # optimizer steps completed: TRL scores before it counts the step
        return TrainerProgress(global_step=done, max_steps=self.cfg.max_steps,
                               epoch=done * self.cfg.prompts_per_step / len(self.train_split.examples),
                               is_world_process_zero=self.procs.is_main,
                               is_local_process_zero=getattr(self.procs.accelerator, "is_local_main_process", True))

    def out_of_time(self) -> bool:
        return bool(self.cfg.max_minutes) and self.train_seconds >= self.cfg.max_minutes * 60

    def resume_or_start(self) -> tuple[dict[str, float], dict[str, float]]:
        """Restore the newest usable checkpoint (with --resume) or evaluate the initial
        model; wrap the policy for the update. Returns the first and the latest evaluation.
        A resume that finds no usable checkpoint refuses, leaving the run's files as they were."""
        if self.cfg.resume:
            resumed = self._restore()
            if resumed is None:
                raise RunDirError(f"resume: no usable checkpoint in {self.checkpoints} "
                                  f"({self._checkpoints_found()}); nothing was changed. Resume with the settings "
                                  f"that wrote it, or start a new run in another --output_dir")
        self.model, self.optimizer = self.procs.prepare(self.policy, self.optimizer)  # DDP / FSDP
        if not self.cfg.resume:
            self.trackers.start(self.cfg.to_dict(), first_step=0)
            initial = self.evaluate()
            self.log({"step": 0, "train_seconds": 0.0, **initial})
            return initial, initial
        if self.procs.is_main:
            for log in (self.metrics, self.rollout_log):
                log.truncate_after(self.step)  # the steps after the checkpoint are redone
            # the run as it would be started from scratch: the fields a resume may change, as changed
            # now (checked against the checkpoint's config); each start's command is in environment.json
            started = {**self.cfg.to_dict(), "resume": False}
            (self.run_dir / "config.json").write_text(json.dumps(started, indent=2) + "\n")
            record_environment(self.run_dir)
            say(f"resumed from {resumed} at step {self.step}")
        self.trackers.start(self.cfg.to_dict(), first_step=self.step + 1)
        self.procs.barrier()  # the other processes read the log only once it is rewritten
        return logged_evals(self.run_dir / "metrics.jsonl")

    def _checkpoints_found(self) -> str:
        found = list_checkpoints(self.checkpoints)
        if not found:
            return "none: the run stopped before its first checkpoint (save_steps / checkpoint_minutes)"
        return f"{len(found)} found, none loads into this model and config: see the warnings above"

    def log(self, record: dict, rollouts: list[dict] = ()) -> None:
        """A step's metrics record (metrics.jsonl, and its numbers to the trackers) and a
        sample of its rollouts (rollouts.jsonl, and a table); the other processes hold no logs."""
        if self.metrics:
            self.metrics.write(record)
        if self.rollout_log and rollouts:
            self.rollout_log.write_many(rollouts)
        self.trackers.log_metrics(record)
        self.trackers.log_table("rollouts", list(rollouts), record["step"])

    def _restore(self) -> Path | None:
        """Load the newest readable checkpoint into the bare policy; a corrupt one is skipped
        with a warning (loading is all-or-nothing, so a failed attempt changes nothing)."""
        for candidate in reversed(list_checkpoints(self.checkpoints)):
            try:
                state = load_checkpoint(candidate, model=self.policy, optimizer=self.optimizer,
                                        scheduler=self.scheduler, generators=self.generators, engine=self.engine,
                                        rank=self.procs.rank)
            except Exception as err:  # truncated file, bad pickle, wrong shapes ...
                say(f"warning: checkpoint {candidate} is unreadable ({type(err).__name__}: {err}); "
                    f"trying the previous one")
                continue
            self.step, self.train_seconds = state["step"], state["train_seconds"]
            self.sampler.epoch, self.sampler.position = state["sampler"]["epoch"], state["sampler"]["position"]
            if self.rollout_budget is not None and "rollout_budget" in state:
                self.rollout_budget.load_state_dict(state["rollout_budget"])
            if not state["engine_restored"] and self.engine.state_dict():
                say(f"resume: {candidate} holds no generation-engine state for process {self.procs.rank} "
                    f"(written by fewer processes): the length predictor starts afresh, so rollouts differ "
                    f"from an uninterrupted run")
            return candidate
        return None

    def step_state(self) -> dict:
        """What a step changes before its update (prompt position, the engine's and adaptive n's
        learned state), taken at its start: an abandoned step puts it back."""
        # both state_dicts are snapshots (copies), as a checkpoint takes them: nothing to copy again
        return {"sampler": self.sampler.state(), "engine": self.engine.state_dict(),
                "rollout_budget": self.rollout_budget.state_dict() if self.rollout_budget else None}

    def abandon_step(self, step_start: dict, reason: Exception) -> TrainingStopped:
        """Undo the unfinished step (a reward function failed under the 'raise' policy: the
        update has not run), checkpoint the last finished step exactly as an uninterrupted run
        had it, and return the one-line stop to raise."""
        self.step -= 1
        self.sampler.epoch, self.sampler.position = step_start["sampler"]["epoch"], step_start["sampler"]["position"]
        self.engine.load_state_dict(step_start["engine"])
        if self.rollout_budget is not None:
            self.rollout_budget.load_state_dict(step_start["rollout_budget"])
        if not (self.checkpoints / f"step_{self.step:07d}").is_dir():
            self.checkpoint()
        return TrainingStopped(f"stopped in step {self.step + 1}: {reason}; checkpoint of step {self.step} in "
                               f"{self.checkpoints}: fix the reward function, then continue with --resume true")

    def checkpoint(self) -> None:
        """Write a checkpoint of the current step (every process must call this)."""
        weights, optimizer_state = self.procs.full_state(self.policy, self.optimizer)  # gathered when sharded
        engine_states = self.procs.gather_objects(self.engine.state_dict())  # each process's own
        if self.procs.is_main:  # whole parameters and optimizer state are the same on every process
            save_checkpoint(self.checkpoints, step=self.step, weights=weights, optimizer_state=optimizer_state,
                            scheduler=self.scheduler, generators=self.generators, keep=self.cfg.save_total_limit,
                            engine_states=engine_states,
                            trainer_state={"train_seconds": self.train_seconds, "sampler": self.sampler.state(),
                                           **({"rollout_budget": self.rollout_budget.state_dict()}
                                              if self.rollout_budget is not None else {})})
        self.procs.barrier()
        self.last_checkpoint_time = time.time()

    def finish(self, initial: dict[str, float], final: dict[str, float], first_step: int) -> RunResult:
        """The last checkpoint, the final model (whole weights or the LoRA adapter) and
        summary.json; the accuracy plot is the caller's (``podsrl train`` draws it). A resumed
        run that had no step left to do (``first_step`` is the step it started at) leaves its
        finished files as they are."""
        procs = self.procs
        result = RunResult(run_dir=self.run_dir, initial=initial, final=final, steps=self.step,
                           train_seconds=self.train_seconds, is_main=procs.is_main)
        if self.step == first_step and (self.run_dir / "summary.json").exists():
            if procs.is_main:
                say(f"{self.run_dir} finished earlier at step {self.step}; nothing to do (raise max_steps or "
                    f"max_minutes to train further)")
            return result
        if not (self.checkpoints / f"step_{self.step:07d}").is_dir():
            self.checkpoint()
        weights = procs.full_state(self.policy, self.optimizer)[0] if procs.sharded else None  # every process
        if procs.is_main:
            self._save_model(weights)
            (self.run_dir / "summary.json").write_text(json.dumps({
                "steps": self.step, "train_seconds": round(self.train_seconds, 2), "initial": initial,
                "final": final}, indent=2) + "\n")
        procs.barrier()
        return result

    def _save_model(self, weights: dict | None) -> None:
        """Write model/ as a whole: into model.tmp, then swapped in, so a crash while saving
        leaves the previous model/ (a resumed run's) loadable."""
        final, staging, previous = (self.run_dir / name for name in ("model", "model.tmp", "model.previous"))
        for leftover in (staging, previous):
            shutil.rmtree(leftover, ignore_errors=True)
        # podsrl never resizes the vocabulary, so the adapter needs no embedding weights;
        # peft's default ("auto") would look the base's config up on the hub to check
        lora = {"save_embedding_layers": False} if self.bundle.uses_lora else {}
        self.policy.save_pretrained(staging, state_dict=weights, **lora)
        self.bundle.tokenizer.save_pretrained(staging)
        if final.exists():
            os.replace(final, previous)
        os.replace(staging, final)
        shutil.rmtree(previous, ignore_errors=True)

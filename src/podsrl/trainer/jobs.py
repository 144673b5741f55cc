"""The jobs the training loop calls around each step, each with its own small interface:
:class:`RunEvaluation` (when the held-out accuracy is due, and taking it), :class:`RunLog`
(the step's record, metrics.jsonl, rollouts.jsonl, the trackers, the progress bar) and
:class:`Checkpointer`, the one owner of the run's checkpoint files and its final model/ (what
goes into a checkpoint is the run's: its :class:`~podsrl.trainer.state.RunState`). Each is built
by set-up (:func:`podsrl.trainer.setup.set_up`) with what it reads; none reads the config."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from podsrl.distributed import Processes
from podsrl.interrupts import interruptible
from podsrl.metrics import MetricsLog
from podsrl.prompt_selection import add_selector_record
from podsrl.registry import error_line
from podsrl.run_folder.claim import RunDirError
from podsrl.scoring import Scorer
from podsrl.tracking import Trackers
from podsrl.trainer.checkpoints import (
    WRITE_ERRORS,
    CheckpointSchedule,
    HeldBackStep,
    OlderFormat,
    Resume,
    StateDoesNotFit,
    list_checkpoints,
    load_checkpoint,
    older_format,
)
from podsrl.trainer.evaluate import Evaluator
from podsrl.trainer.hooks import StepHook
from podsrl.trainer.limits import Limits
from podsrl.trainer.logging import LogOptions, rollout_rows, say, step_record
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.state import RunState
from podsrl.trainer.timer import StageTimer


@dataclass
class RunEvaluation:
    """Held-out evaluation during the run: due on the evaluator's schedule and after the last
    step; taken under the forward passes' precision (``autocast``)."""

    evaluator: Evaluator
    procs: Processes
    state: RunState
    limits: Limits
    autocast: Callable

    @property
    def prompts(self) -> int:
        """The held-out prompts each evaluation uses."""
        return self.evaluator.prompts

    def due(self) -> bool:
        """The evaluator's schedule, and after the last step."""
        return self.evaluator.due(self.state.step, last=not self.limits.more_steps(self.state))

    def __call__(self) -> dict[str, float]:
        """Held-out accuracy now. A stop does not wait for it in a single-process run (it gets
        the grace, then :class:`StopNow` is raised: :mod:`podsrl.interrupts`); a multi-process
        run waits, since a signal may reach one process only."""
        stoppable = interruptible("evaluation") if self.procs.world_size == 1 else nullcontext()
        with self.autocast(), stoppable:
            return self.evaluator()

    def into(self, record: dict) -> dict[str, float]:
        """The evaluation, its accuracies and its seconds (``time_eval``) added to ``record``."""
        eval_start = time.perf_counter()
        accuracies = self()
        record.update(accuracies, time_eval=time.perf_counter() - eval_start)
        return accuracies


@dataclass
class RunLog:
    """What the run logs: each step's metrics record (metrics.jsonl and the trackers), a sample
    of its rollouts (rollouts.jsonl and a table), and the progress bar; the other processes
    hold no logs. ``stopped_here``: what a failed write says is kept, and how to go on."""

    procs: Processes
    state: RunState
    metrics: MetricsLog | None  # only the main process writes
    rollout_log: MetricsLog | None  # rollouts.jsonl (log_rollouts groups per step); only the main process
    trackers: Trackers  # none but on the main process with report_to
    options: LogOptions  # the progress bar, rollout samples, trackers
    method: str  # the progress bar's label
    scorer: Scorer  # its reward failures go into each record
    hooks: list[StepHook]  # run after each step, in order
    stopped_here: Callable[[], str]

    def start(self, recorded_config: dict, first_step: int) -> None:
        """The trackers' run, from ``first_step`` on."""
        self.trackers.start(recorded_config, first_step=first_step)

    def truncate_after(self, step: int) -> None:
        """The logs cut after ``step`` (a resumed run redoes the steps after its checkpoint)."""
        if self.procs.is_main:
            for log in (self.metrics, self.rollout_log):
                log.truncate_after(step)

    def close(self) -> None:
        """The trackers flushed and closed."""
        self.trackers.finish()

    def progress_bar(self, max_steps: int):
        return self.options.progress_bar(max_steps, self.state.step, self.method, self.procs.is_main)

    def step_record(self, outcome: StepOutcome, timer: StageTimer) -> dict:
        """The step's metrics record: its numbers over every process, the prompt source's, and
        each step hook's (:mod:`podsrl.trainer.hooks`)."""
        record = step_record(self.procs, self.state.step, self.state.train_seconds, outcome,
                             timer.seconds, self.scorer.failures)
        add_selector_record(outcome.prompt_record, record)
        for hook in self.hooks:
            hook.after_step(outcome, timer, record)
        return record

    def rollout_rows(self, outcome: StepOutcome) -> list[dict]:
        """The step's first ``log_rollouts`` groups, one row per rollout (none off the main process)."""
        return rollout_rows(self.state.step, outcome, self.options.rollout_groups(self.procs.is_main))

    def write_step(self, record: dict, outcome: StepOutcome) -> None:
        """The step's record and, on the main process, its first ``log_rollouts`` groups."""
        self.write(record, self.rollout_rows(outcome))

    def write(self, record: dict, rollouts: list[dict] = ()) -> None:
        """A metrics record (metrics.jsonl, and its numbers to the trackers) and rollout rows
        (rollouts.jsonl, and a table)."""
        try:
            if self.metrics:
                self.metrics.write(record)
            if self.rollout_log and rollouts:
                self.rollout_log.write_many(rollouts)
        # a full disk: each log still ends at a whole record; say what is kept and what to do
        except OSError as err:
            raise OSError(f"{err}; free space, then go on: {self.stopped_here()}") from None
        self.trackers.log_metrics(record)
        self.trackers.log_table("rollouts", list(rollouts), record["step"])


@dataclass
class Checkpointer:
    """The run's checkpoint files and final model/: when a checkpoint is due (``schedule``),
    writing one of the run's state, restoring the newest usable one (``resume``), and the model
    written at the end. Every process takes part in writing; the main process writes files."""

    procs: Processes
    state: RunState
    schedule: CheckpointSchedule
    resume: Resume
    run_dir: Path
    policy: torch.nn.Module  # the bare model: its weights are saved and restored
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    tokenizer: object  # saved beside the final model
    uses_lora: bool  # the final model is the LoRA adapter
    logs: tuple[MetricsLog, ...]  # synced before a checkpoint says their steps are done (main process)

    @property
    def folder(self) -> Path:
        return self.run_dir / "checkpoints"

    def holds(self, step: int) -> bool:
        """Whether the checkpoint of ``step`` is on disk."""
        return (self.folder / f"step_{step:07d}").is_dir()

    def last(self) -> str:
        """The newest checkpoint on disk, or 'none'."""
        good = list_checkpoints(self.folder)
        return str(good[-1]) if good else "none"

    def stopped_here(self) -> str:
        """What a stop leaves: the last checkpoint, and how to go on from it."""
        last = self.last()
        if last == "none":
            return ("last checkpoint: none; nothing to resume: run the same command again to start afresh "
                    "(podsrl reuses the folder)")
        return f"last checkpoint: {last}; continue with the same command plus --resume true"

    def restart_clock(self) -> None:
        self.schedule.restart_clock()

    def due(self) -> bool:
        """Every save_steps steps, or checkpoint_minutes after the last one on any process's
        clock (every process takes part, and they agree)."""
        by_time = bool(self.procs.max([float(self.schedule.due_by_time())])[0])
        return self.schedule.due_by_steps(self.state.step) or by_time

    def write(self, held_back: HeldBackStep | None = None) -> None:
        """Write a checkpoint of the current step (every process must call this): the weights,
        the optimizer, the scheduler and every process's learned parts; ``held_back``: the
        step's record and rollout rows, not logged yet
        (:meth:`podsrl.trainer.stops.Stops.hold_back_evaluation`)."""
        state, procs = self.state, self.procs
        weights, optimizer_state = procs.full_state(self.policy, self.optimizer)  # gathered when sharded
        part_states = procs.gather_objects(state.snapshot())  # each process's own
        if procs.is_main:  # whole parameters and optimizer state are the same on every process
            for log in self.logs:
                log.sync()  # the logs up to this step are on disk before a checkpoint says the step is done
            try:
                self.schedule.save(self.folder, step=state.step, weights=weights,
                                   optimizer_state=optimizer_state, scheduler=self.scheduler,
                                   part_states=part_states,
                                   trainer_state={"train_seconds": state.train_seconds,
                                                  **(held_back.trainer_state() if held_back else {})})
            except OSError as err:  # a full disk: say what is kept and the command that goes on
                raise OSError(f"{err}; once there is room, go on: {self.stopped_here()}") from None
        procs.barrier()
        self.schedule.restart_clock()

    def restore(self) -> tuple[Path, HeldBackStep | None]:
        """Load the newest readable checkpoint that fits into the bare policy and the run's
        learned parts; a corrupt one, or one whose part state is another part's (another prompt
        selector's, say), is skipped with a warning (loading is all-or-nothing, so a failed
        attempt changes nothing). Returns it and its held-back step; refuses in one line when
        none loads, leaving the run's files as they were."""
        state, rank = self.state, self.procs.rank
        for candidate in reversed(list_checkpoints(self.folder)):
            try:
                saved = load_checkpoint(candidate, model=self.policy, optimizer=self.optimizer,
                                        scheduler=self.scheduler, parts=state.parts, rank=rank)
            except OlderFormat as older:
                say(f"warning: {older}; trying the previous one")
                continue
            except StateDoesNotFit as misfit:
                say(f"warning: checkpoint {candidate} does not fit this run: {self._misfit(misfit)}; trying "
                    "the previous one")
                continue
            except Exception as err:  # truncated file, bad pickle, wrong shapes ...
                say(f"warning: checkpoint {candidate} is unreadable ({type(err).__name__}: {err}); "
                    f"trying the previous one")
                continue
            state.step, state.train_seconds = saved["step"], saved["train_seconds"]
            for name in saved["fresh"]:
                if state.parts[name].state_dict():
                    say(f"resume: {candidate} holds no {name} state for process {rank} "
                        "(written by fewer processes): it starts afresh, so rollouts differ from an "
                        "uninterrupted run")
            return candidate, HeldBackStep.saved_in(saved)
        raise self._no_usable_checkpoint()

    def _misfit(self, misfit: StateDoesNotFit) -> str:
        """Which learned part of a checkpoint does not fit this run, and the likely cause."""
        part, label = misfit.part, self.resume.part_labels.get(misfit.part)
        if not label:
            return f"its {part} state does not fit ({misfit.reason})"
        return f"its {part} state is not {label}'s ({misfit.reason}; written with another {part}?)"

    def _no_usable_checkpoint(self) -> RunDirError:
        """A resume's one-line refusal when no checkpoint loads: what it found, and what works."""
        checkpoints = self.folder
        found = list_checkpoints(checkpoints)
        if not found:
            found_text = "none: the run stopped before its first checkpoint (save_steps / checkpoint_minutes)"
        elif all(map(older_format, found)):  # no settings would resume these: say what still works
            return RunDirError(f"resume: the {len(found)} checkpoint(s) in {checkpoints} are in an older "
                               "podsrl's format (no parts.pt), which this podsrl cannot resume; nothing was "
                               f"changed. `podsrl export {self.run_dir} OUTPUT_DIR --checkpoint "
                               f"{found[-1].name}` still exports the model, or start a new run in another "
                               "--output_dir")
        else:
            found_text = f"{len(found)} found, none loads into this model and config: see the warnings above"
        return RunDirError(f"resume: no usable checkpoint in {checkpoints} ({found_text}); nothing was "
                           "changed. Resume with the settings that wrote it, or start a new run in another "
                           "--output_dir")

    def save_model(self, weights: dict | None) -> None:
        """Write model/ as a whole: into model.tmp, then swapped in, so a crash while saving
        leaves the previous model/ (a resumed run's) loadable. A write error (a full disk) is
        one line saying how to export the last checkpoint instead; model.tmp is removed."""
        final, staging, previous = (self.run_dir / name for name in ("model", "model.tmp", "model.previous"))
        for leftover in (staging, previous):
            shutil.rmtree(leftover, ignore_errors=True)
        # podsrl never resizes the vocabulary, so the adapter needs no embedding weights;
        # peft's default ("auto") would look the base's config up on the hub to check
        lora = {"save_embedding_layers": False} if self.uses_lora else {}
        try:
            self.policy.save_pretrained(staging, state_dict=weights, **lora)
            self.tokenizer.save_pretrained(staging)
            if final.exists():
                os.replace(final, previous)
            os.replace(staging, final)
        except BaseException as err:  # whatever stopped it, no staging folder is left to fill the disk
            if previous.exists() and not final.exists():
                os.replace(previous, final)  # the swap failed half-way: the previous model/ comes back
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(err, WRITE_ERRORS):  # a full disk
                raise OSError(self._save_failed(final, err)) from None
            raise
        shutil.rmtree(previous, ignore_errors=True)

    def _save_failed(self, final: Path, err: BaseException) -> str:
        """The one line for a final model that could not be written: what is kept, and the
        export that redoes it once there is room."""
        good = list_checkpoints(self.folder)
        kept = "the previous model/ is as it was" if final.exists() else "no model/ was written"
        redo = (f"free space, then export the last checkpoint: podsrl export {self.run_dir} OUTPUT_DIR "
                f"--checkpoint {good[-1].name}" if good else "no checkpoint to export")
        return (f"model: could not write {final} ({error_line(err)}); removed model.tmp, {kept}; the "
                f"training is kept in {good[-1] if good else 'no checkpoint'}: {redo}")

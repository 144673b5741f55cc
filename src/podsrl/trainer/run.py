"""A training run (its components, state, limits, checkpoint schedule and resume) and the
bookkeeping around the loop: evaluation, resume-or-start, checkpoints, and the files written at
the end. Everything it reads of the config is bound at set-up (each job's options in its owner);
where it stops early is :mod:`podsrl.trainer.stops`'s."""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from podsrl.distributed import Processes
from podsrl.interrupts import interruptible
from podsrl.models.precision import autocast
from podsrl.prompt_selection import add_selector_record
from podsrl.provenance import record_environment
from podsrl.registry import error_line
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
from podsrl.trainer.components import Components
from podsrl.trainer.limits import Limits
from podsrl.trainer.logging import logged_evals, rollout_rows, say, step_record
from podsrl.trainer.run_dir import RunDirError
from podsrl.trainer.stages import StepOutcome, StepStages
from podsrl.trainer.state import RunState
from podsrl.trainer.timer import StageTimer


@dataclass
class RunResult:
    run_dir: Path
    initial: dict[str, float]
    final: dict[str, float]
    steps: int
    train_seconds: float
    is_main: bool = True  # False in the other processes of a multi-process run (they write nothing)
    # held-out prompts each evaluation used: eval_prompts, or fewer when the split is smaller
    eval_prompts: int = 0
    # why the run learned nothing though it finished ("" = it trained); podsrl train exits 1
    failure: str = ""


class Run:
    """A training run: its :class:`StepStages` (the step, configured), its :class:`Components`
    (built once by :func:`podsrl.trainer.setup.set_up`), its :class:`RunState` (checkpointed),
    its :class:`Limits`, its :class:`CheckpointSchedule` and its :class:`Resume`, with what
    the loop asks of them beyond one step: evaluation, resume-or-start, the step's record and
    log, checkpoints, the final files."""

    def __init__(self, stages: StepStages, components: Components, state: RunState, limits: Limits,
                 checkpointing: CheckpointSchedule, resume: Resume) -> None:
        self.stages, self.components, self.state = stages, components, state
        self.limits, self.checkpointing, self.resume = limits, checkpointing, resume
        self.procs: Processes = components.procs  # the collectives every process takes part in
        # from the checkpoint resumed: its evaluation was cut short
        self.held_back: HeldBackStep | None = None

    @property
    def checkpoints(self) -> Path:
        return self.components.checkpoints

    def last_checkpoint(self) -> str:
        """The newest checkpoint on disk, or 'none'."""
        good = list_checkpoints(self.components.checkpoints)
        return str(good[-1]) if good else "none"

    def progress_bar(self):
        return self.components.log_options.progress_bar(self.limits.options.max_steps, self.state.step,
                                                        self.components.recorded_config["method"], self.procs.is_main)

    def step_record(self, outcome: StepOutcome, timer: StageTimer) -> dict:
        """The step's metrics record: its numbers over every process, the prompt source's, and
        each step hook's (:mod:`podsrl.trainer.hooks`)."""
        components = self.components
        record = step_record(components.procs, self.state.step, self.state.train_seconds, outcome, timer.seconds,
                             components.scorer.failures)
        add_selector_record(outcome.prompt_record, record)
        for hook in components.hooks:
            hook.after_step(components, outcome, timer, record)
        return record

    def log_step(self, record: dict, outcome: StepOutcome) -> None:
        """The step's record and, on the main process, its first ``log_rollouts`` groups."""
        self.log(record, self.rollout_rows(outcome))

    def rollout_rows(self, outcome: StepOutcome) -> list[dict]:
        return rollout_rows(self.state.step, outcome, self.components.log_options.rollout_groups(self.procs.is_main))

    def stopped_here(self) -> str:
        """What a stop leaves: the last checkpoint, and how to go on from it."""
        last = self.last_checkpoint()
        if last == "none":
            return ("last checkpoint: none; nothing to resume: run the same command again to start afresh "
                    "(podsrl reuses the folder)")
        return f"last checkpoint: {last}; continue with the same command plus --resume true"

    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy now. A stop does not wait for it in a single-process run (it gets
        the grace, then :class:`StopNow` is raised: :mod:`podsrl.interrupts`); a multi-process
        run waits, since a signal may reach one process only."""
        components = self.components
        stoppable = interruptible("evaluation") if components.procs.world_size == 1 else nullcontext()
        with self.autocast(), stoppable:
            return components.evaluator()

    def checkpoint_due(self) -> bool:
        """Every save_steps steps, or checkpoint_minutes after the last one on any process's
        clock (every process takes part, and they agree)."""
        by_time = bool(self.procs.max([float(self.checkpointing.due_by_time())])[0])
        return self.checkpointing.due_by_steps(self.state.step) or by_time

    def evaluation_due(self) -> bool:
        """The evaluator's schedule, and after the last step."""
        return self.components.evaluator.due(self.state.step, last=not self.limits.more_steps(self.state))

    def evaluate_into(self, record: dict) -> dict[str, float]:
        """:meth:`evaluate`, its accuracies and its seconds (``time_eval``) added to ``record``."""
        eval_start = time.perf_counter()
        accuracies = self.evaluate()
        record.update(accuracies, time_eval=time.perf_counter() - eval_start)
        return accuracies

    def release(self) -> None:
        """However the run ends: trackers flushed and closed, the generation engine shut down
        (vllm frees its memory), the run folder's lock released."""
        components = self.components
        try:
            components.trackers.finish()
            close = getattr(components.engine, "close", None)
            if close:
                close()
        finally:
            if components.lock:
                components.lock.release()

    def autocast(self):
        """Forward passes in bfloat16 under ``bf16`` (weights stay float32), else a no-op."""
        return autocast(self.components.policy.device, self.components.forward_dtype)

    @contextmanager
    def timed_step(self) -> Iterator[StageTimer]:
        """Around the step's pipeline: its timer, the forward passes' precision, and, once the
        step has finished, the run's training time advanced by the slowest process's."""
        timer = StageTimer()
        with self.autocast():
            yield timer
        self.state.train_seconds += self.procs.max([timer.total])[0]  # the slowest process sets the pace

    def resume_or_start(self) -> tuple[dict[str, float], dict[str, float]]:
        """Restore the newest usable checkpoint (with --resume) or evaluate the initial
        model; wrap the policy for the update. Returns the first and the latest evaluation.
        A resume that finds no usable checkpoint refuses, leaving the run's files as they were."""
        components, recorded = self.components, self.components.recorded_config
        if self.resume.wanted:
            resumed = self._restore()
            if resumed is None:
                raise self._no_usable_checkpoint()
        # DDP / FSDP
        components.model, components.optimizer = components.procs.prepare(components.policy, components.optimizer)
        self.stages.update.bind(components.model, components.optimizer)
        if not self.resume.wanted:
            components.trackers.start(recorded, first_step=0)
            initial = self.evaluate()
            self.log({"step": 0, "train_seconds": 0.0, **initial})
            return initial, initial
        held_back = self.held_back
        if components.procs.is_main:
            for log in (components.metrics, components.rollout_log):  # the steps after the checkpoint are redone,
                log.truncate_after(self.state.step - bool(held_back))  # and its own when held back (logged below)
            # the run as it would be started from scratch: the fields a resume may change, as changed
            # now (checked against the checkpoint's config); each start's command is in environment.json
            started = {**recorded, "resume": False}
            (components.run_dir / "config.json").write_text(json.dumps(started, indent=2) + "\n")
            record_environment(components.run_dir, components.bundle.tokenizer)
            say(f"resumed from {resumed} at step {self.state.step}"
                f"{', evaluating it first (a stop came before its evaluation)' if held_back else ''}")
        components.trackers.start(recorded, first_step=self.state.step + (0 if held_back else 1))
        # the evaluation a stop cut short, then the step's log, as an uninterrupted run had them
        if held_back:
            self.evaluate_into(held_back.record)
            self.log(held_back.record, held_back.rollouts)
        components.procs.barrier()  # the other processes read the log only once it is rewritten
        return logged_evals(components.run_dir / "metrics.jsonl")

    def _no_usable_checkpoint(self) -> RunDirError:
        """A resume's one-line refusal when no checkpoint loads: what it found, and what works."""
        checkpoints = self.components.checkpoints
        found = list_checkpoints(checkpoints)
        if not found:
            found_text = "none: the run stopped before its first checkpoint (save_steps / checkpoint_minutes)"
        elif all(map(older_format, found)):  # no settings would resume these: say what still works
            return RunDirError(f"resume: the {len(found)} checkpoint(s) in {checkpoints} are in an older podsrl's "
                               f"format (no parts.pt), which this podsrl cannot resume; nothing was changed. `podsrl "
                               f"export {self.components.run_dir} OUTPUT_DIR --checkpoint {found[-1].name}` still "
                               f"exports the model, or start a new run in another --output_dir")
        else:
            found_text = f"{len(found)} found, none loads into this model and config: see the warnings above"
        return RunDirError(f"resume: no usable checkpoint in {checkpoints} ({found_text}); nothing was changed. "
                           f"Resume with the settings that wrote it, or start a new run in another --output_dir")

    def log(self, record: dict, rollouts: list[dict] = ()) -> None:
        """A step's metrics record (metrics.jsonl, and its numbers to the trackers) and a
        sample of its rollouts (rollouts.jsonl, and a table); the other processes hold no logs."""
        components = self.components
        try:
            if components.metrics:
                components.metrics.write(record)
            if components.rollout_log and rollouts:
                components.rollout_log.write_many(rollouts)
        # a full disk: each log still ends at a whole record; say what is kept and what to do
        except OSError as err:
            raise OSError(f"{err}; free space, then go on: {self.stopped_here()}") from None
        components.trackers.log_metrics(record)
        components.trackers.log_table("rollouts", list(rollouts), record["step"])

    def _restore(self) -> Path | None:
        """Load the newest readable checkpoint that fits into the bare policy and the run's
        learned parts; a corrupt one, or one whose part state is another part's (another prompt
        selector's, say), is skipped with a warning (loading is all-or-nothing, so a failed
        attempt changes nothing)."""
        components, state = self.components, self.state
        for candidate in reversed(list_checkpoints(components.checkpoints)):
            try:
                saved = load_checkpoint(candidate, model=components.policy, optimizer=components.optimizer,
                                        scheduler=components.scheduler, parts=state.parts, rank=components.procs.rank)
            except OlderFormat as older:
                say(f"warning: {older}; trying the previous one")
                continue
            except StateDoesNotFit as misfit:
                say(f"warning: checkpoint {candidate} does not fit this run: {self._misfit(misfit)}; trying the "
                    f"previous one")
                continue
            except Exception as err:  # truncated file, bad pickle, wrong shapes ...
                say(f"warning: checkpoint {candidate} is unreadable ({type(err).__name__}: {err}); "
                    f"trying the previous one")
                continue
            state.step, state.train_seconds = saved["step"], saved["train_seconds"]
            self.held_back = HeldBackStep.saved_in(saved)
            for name in saved["fresh"]:
                if state.parts[name].state_dict():
                    say(f"resume: {candidate} holds no {name} state for process {components.procs.rank} (written by "
                        f"fewer processes): it starts afresh, so rollouts differ from an uninterrupted run")
            return candidate
        return None

    def _misfit(self, misfit: StateDoesNotFit) -> str:
        """Which learned part of a checkpoint does not fit this run, and the likely cause."""
        part, label = misfit.part, self.resume.part_labels.get(misfit.part)
        if not label:
            return f"its {part} state does not fit ({misfit.reason})"
        return f"its {part} state is not {label}'s ({misfit.reason}; written with another {part}?)"

    def checkpoint(self, held_back: HeldBackStep | None = None) -> None:
        """Write a checkpoint of the current step (every process must call this): the weights,
        the optimizer, the scheduler and every process's learned parts; ``held_back``: the
        step's record and rollout rows, not logged yet (:meth:`podsrl.trainer.stops.Stops.hold_back_evaluation`)."""
        components, state = self.components, self.state
        # gathered when sharded
        weights, optimizer_state = components.procs.full_state(components.policy, components.optimizer)
        part_states = components.procs.gather_objects(state.snapshot())  # each process's own
        if components.procs.is_main:  # whole parameters and optimizer state are the same on every process
            for log in (components.metrics, components.rollout_log):
                log.sync()  # the logs up to this step are on disk before a checkpoint says the step is done
            try:
                self.checkpointing.save(components.checkpoints, step=state.step, weights=weights,
                                        optimizer_state=optimizer_state, scheduler=components.scheduler,
                                        part_states=part_states,
                                        trainer_state={"train_seconds": state.train_seconds,
                                                       **(held_back.trainer_state() if held_back else {})})
            except OSError as err:  # a full disk: say what is kept and the command that goes on
                raise OSError(f"{err}; once there is room, go on: {self.stopped_here()}") from None
        components.procs.barrier()
        self.checkpointing.restart_clock()

    def finish(self, initial: dict[str, float], final: dict[str, float], first_step: int,
               trained: int, informative: int) -> RunResult:
        """The last checkpoint, the final model (whole weights or the LoRA adapter) and
        summary.json; the accuracy plot is the caller's (``podsrl train`` draws it). A resumed
        run that had no step left to do (``first_step`` is the step it started at) leaves its
        finished files as they are. ``trained``: the steps since ``first_step`` whose update was
        not skipped; ``informative``: those with a non-zero advantage on this process. A run that
        learned nothing still writes its files, and says why in ``RunResult.failure`` and summary.json."""
        components, state = self.components, self.state
        procs = components.procs
        result = RunResult(run_dir=components.run_dir, initial=initial, final=final, steps=state.step,
                           train_seconds=state.train_seconds, is_main=procs.is_main,
                           eval_prompts=components.evaluator.prompts)
        if state.step == first_step and (components.run_dir / "summary.json").exists():
            if procs.is_main:
                say(f"{components.run_dir} finished earlier at step {state.step}; nothing to do (raise max_steps or "
                    f"max_minutes to train further)")
            return result
        result.failure = self._learned_nothing(state.step - first_step, trained, informative)
        if not (components.checkpoints / f"step_{state.step:07d}").is_dir():
            self.checkpoint()
        # every process takes part; only a sharded run needs the gathered weights
        weights = procs.full_state(components.policy, components.optimizer)[0] if procs.sharded else None
        if procs.is_main:
            self._save_model(weights)
            (components.run_dir / "summary.json").write_text(json.dumps({
                "steps": state.step, "train_seconds": round(state.train_seconds, 2), "initial": initial,
                "final": final, **({"failure": result.failure} if result.failure else {})}, indent=2) + "\n")
        procs.barrier()
        return result

    def _learned_nothing(self, steps: int, trained: int, informative: int) -> str:
        """Why the ``steps`` steps this process ran taught the model nothing, or "" when they
        did: no reward ever applied (all None / NaN, or failed under the 'zero' policy: every
        advantage is 0), every advantage of every step was 0 (no group's kept rewards differed:
        a constant reward), or every optimizer step was skipped (non-finite). Such a run is a
        failure, not a success (every process gets the same answer: the counts are summed over
        the processes)."""
        components = self.components
        applied, informative = components.procs.sum([float(components.scorer.applied), float(informative)])
        if not steps:
            return ""
        if not applied:
            return (f"no reward applied in the {steps} steps run: every reward was None / NaN or its function failed "
                    f"(reward_error_policy {components.scorer.error_policy}; see reward_failures and unverifiable "
                    f"in metrics.jsonl), so nothing was learned")
        if not informative:
            return (f"every advantage was 0 in the {steps} steps run: no prompt group's kept rollouts differed in "
                    f"reward (kept_reward_zero_var_frac 1 in metrics.jsonl; e.g. a reward that scores every "
                    f"completion the same), so there was nothing to learn from")
        if not trained:
            return (f"all {steps} optimizer steps were skipped (a non-finite loss or gradient: skipped_step 1 in "
                    f"metrics.jsonl), so the weights never changed")
        return ""

    def _save_model(self, weights: dict | None) -> None:
        """Write model/ as a whole: into model.tmp, then swapped in, so a crash while saving
        leaves the previous model/ (a resumed run's) loadable. A write error (a full disk) is
        one line saying how to export the last checkpoint instead; model.tmp is removed."""
        components = self.components
        final, staging, previous = (components.run_dir / name for name in ("model", "model.tmp", "model.previous"))
        for leftover in (staging, previous):
            shutil.rmtree(leftover, ignore_errors=True)
        # podsrl never resizes the vocabulary, so the adapter needs no embedding weights;
        # peft's default ("auto") would look the base's config up on the hub to check
        lora = {"save_embedding_layers": False} if components.bundle.uses_lora else {}
        try:
            components.policy.save_pretrained(staging, state_dict=weights, **lora)
            components.bundle.tokenizer.save_pretrained(staging)
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
        components = self.components
        good = list_checkpoints(components.checkpoints)
        kept = "the previous model/ is as it was" if final.exists() else "no model/ was written"
        redo = (f"free space, then export the last checkpoint: podsrl export {components.run_dir} OUTPUT_DIR "
                f"--checkpoint {good[-1].name}" if good else "no checkpoint to export")
        return (f"model: could not write {final} ({error_line(err)}); removed model.tmp, {kept}; the training "
                f"is kept in {good[-1] if good else 'no checkpoint'}: {redo}")

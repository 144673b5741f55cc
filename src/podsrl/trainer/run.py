"""A training run (its components, state and cadence) and the bookkeeping around the loop:
evaluation, resume-or-start, checkpoints, and the files written at the end."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from podsrl.interrupts import StopNow
from podsrl.models.precision import autocast
from podsrl.provenance import record_environment
from podsrl.registry import error_line
from podsrl.rewards import RewardError
from podsrl.rewards.scorer import TrainerProgress
from podsrl.trainer.checkpoints import list_checkpoints, load_checkpoint, save_checkpoint
from podsrl.trainer.components import Cadence, Components, RunState
from podsrl.trainer.evaluate import evaluate
from podsrl.trainer.logging import logged_evals, say
from podsrl.trainer.run_dir import RunDirError
from podsrl.trainer.state import TrainingStopped

EVAL_SEED_OFFSET = 10_007  # evaluation's own seed stream: seed + offset + rank
GROUP_SIZE_STATE = "rollout_budget"  # the group-size policy's key in a checkpoint's trainer state


@dataclass
class RunResult:
    run_dir: Path
    initial: dict[str, float]
    final: dict[str, float]
    steps: int
    train_seconds: float
    is_main: bool = True  # False in the other processes of a multi-process run (they write nothing)
    eval_prompts: int = 0  # held-out prompts each evaluation used: eval_prompts, or fewer when the split is smaller
    failure: str = ""  # why the run learned nothing though it finished ("" = it trained); podsrl train exits 1


class Run:
    """A training run: its :class:`Components` (built once by
    :func:`podsrl.trainer.setup.set_up`), its :class:`RunState` (checkpointed) and its
    :class:`Cadence`, with what the loop asks of them beyond one step: evaluation,
    resume-or-start, checkpoints, the final files."""

    def __init__(self, components: Components, state: RunState, cadence: Cadence) -> None:
        self.components, self.state, self.cadence = components, state, cadence

    def evaluate(self) -> dict[str, float]:
        parts = self.components
        seed = parts.cfg.seed + EVAL_SEED_OFFSET + parts.procs.rank
        with self.autocast():
            accuracy = evaluate(parts.bundle, parts.task, parts.test_split, parts.eval_options, seed, parts.procs,
                                generate_fn=parts.eval_generate)
        return accuracy.accuracies

    def release(self) -> None:
        """However the run ends: trackers flushed and closed, the generation engine shut down
        (vllm frees its memory), the run folder's lock released."""
        parts = self.components
        try:
            parts.trackers.finish()
            close = getattr(parts.engine, "close", None)
            if close:
                close()
        finally:
            if parts.lock:
                parts.lock.release()

    def autocast(self):
        """Forward passes in bfloat16 under ``bf16`` (weights stay float32), else a no-op."""
        return autocast(self.components.policy.device, "bfloat16" if self.components.cfg.bf16 else "")

    def trainer_progress(self) -> TrainerProgress:
        """Reward functions' ``trainer_state`` while the current step's rollouts are scored."""
        parts, done = self.components, self.state.step - 1  # optimizer steps completed: TRL scores first
        return TrainerProgress(global_step=done, max_steps=parts.cfg.max_steps,
                               epoch=done * parts.cfg.prompts_per_step / len(parts.train_split.examples),
                               is_world_process_zero=parts.procs.is_main,
                               is_local_process_zero=getattr(parts.procs.accelerator, "is_local_main_process", True))

    def resume_or_start(self) -> tuple[dict[str, float], dict[str, float]]:
        """Restore the newest usable checkpoint (with --resume) or evaluate the initial
        model; wrap the policy for the update. Returns the first and the latest evaluation.
        A resume that finds no usable checkpoint refuses, leaving the run's files as they were."""
        parts = self.components
        if parts.cfg.resume:
            resumed = self._restore()
            if resumed is None:
                raise RunDirError(f"resume: no usable checkpoint in {parts.checkpoints} "
                                  f"({self._checkpoints_found()}); nothing was changed. Resume with the settings "
                                  f"that wrote it, or start a new run in another --output_dir")
        parts.model, parts.optimizer = parts.procs.prepare(parts.policy, parts.optimizer)  # DDP / FSDP
        if not parts.cfg.resume:
            parts.trackers.start(parts.cfg.to_dict(), first_step=0)
            initial = self.evaluate()
            self.log({"step": 0, "train_seconds": 0.0, **initial})
            return initial, initial
        if parts.procs.is_main:
            for log in (parts.metrics, parts.rollout_log):
                log.truncate_after(self.state.step)  # the steps after the checkpoint are redone
            # the run as it would be started from scratch: the fields a resume may change, as changed
            # now (checked against the checkpoint's config); each start's command is in environment.json
            started = {**parts.cfg.to_dict(), "resume": False}
            (parts.run_dir / "config.json").write_text(json.dumps(started, indent=2) + "\n")
            record_environment(parts.run_dir)
            say(f"resumed from {resumed} at step {self.state.step}")
        parts.trackers.start(parts.cfg.to_dict(), first_step=self.state.step + 1)
        parts.procs.barrier()  # the other processes read the log only once it is rewritten
        return logged_evals(parts.run_dir / "metrics.jsonl")

    def _checkpoints_found(self) -> str:
        found = list_checkpoints(self.components.checkpoints)
        if not found:
            return "none: the run stopped before its first checkpoint (save_steps / checkpoint_minutes)"
        return f"{len(found)} found, none loads into this model and config: see the warnings above"

    def log(self, record: dict, rollouts: list[dict] = ()) -> None:
        """A step's metrics record (metrics.jsonl, and its numbers to the trackers) and a
        sample of its rollouts (rollouts.jsonl, and a table); the other processes hold no logs."""
        parts = self.components
        if parts.metrics:
            parts.metrics.write(record)
        if parts.rollout_log and rollouts:
            parts.rollout_log.write_many(rollouts)
        parts.trackers.log_metrics(record)
        parts.trackers.log_table("rollouts", list(rollouts), record["step"])

    def _restore(self) -> Path | None:
        """Load the newest readable checkpoint into the bare policy; a corrupt one is skipped
        with a warning (loading is all-or-nothing, so a failed attempt changes nothing)."""
        parts, state = self.components, self.state
        for candidate in reversed(list_checkpoints(parts.checkpoints)):
            try:
                saved = load_checkpoint(candidate, model=parts.policy, optimizer=parts.optimizer,
                                        scheduler=parts.scheduler, generators=state.generators, engine=parts.engine,
                                        rank=parts.procs.rank)
            except Exception as err:  # truncated file, bad pickle, wrong shapes ...
                say(f"warning: checkpoint {candidate} is unreadable ({type(err).__name__}: {err}); "
                    f"trying the previous one")
                continue
            state.step, state.train_seconds = saved["step"], saved["train_seconds"]
            state.prompt_selector.load_state_dict(saved["sampler"])
            if GROUP_SIZE_STATE in saved:
                parts.group_size.load_state_dict(saved[GROUP_SIZE_STATE])
            if not saved["engine_restored"] and parts.engine.state_dict():
                say(f"resume: {candidate} holds no generation-engine state for process {parts.procs.rank} "
                    f"(written by fewer processes): the length predictor starts afresh, so rollouts differ "
                    f"from an uninterrupted run")
            return candidate
        return None

    def step_start(self) -> dict:
        """What a step changes before its update (prompt position, the engine's and the
        group-size policy's learned state), taken at its start: an abandoned step puts it back."""
        # the state_dicts are snapshots (copies), as a checkpoint takes them: nothing to copy again
        parts = self.components
        return {"sampler": self.state.prompt_selector.state_dict(), "engine": parts.engine.state_dict(),
                "group_size": parts.group_size.state_dict()}

    def abandon_step(self, step_start: dict, reason: BaseException, advice: str,
                     update_began: bool = False) -> TrainingStopped:
        """Undo the unfinished step (a reward function failed under the 'raise' policy, a user
        component failed, or a stop could not wait), checkpoint the last finished step exactly
        as an uninterrupted run had it, and return the one-line stop to raise. Not where the
        step's update had begun (the weights may have moved), nor where only this process
        failed in a multi-process run (a checkpoint needs every process): the last checkpoint
        on disk is then left as it was."""
        parts, state = self.components, self.state
        state.step -= 1
        signum = getattr(reason, "signum", None)
        agreed = isinstance(reason, RewardError) or parts.procs.world_size == 1
        how = f"by {reason}" if isinstance(reason, StopNow) else f"{reason}"
        if update_began or not agreed:
            good = list_checkpoints(parts.checkpoints)
            return TrainingStopped(f"stopped in step {state.step + 1}: {how}; last checkpoint, left as it was: "
                                   f"{good[-1] if good else 'none'}; {advice}", signum=signum)
        state.prompt_selector.load_state_dict(step_start["sampler"])
        parts.engine.load_state_dict(step_start["engine"])
        parts.group_size.load_state_dict(step_start["group_size"])
        if not (parts.checkpoints / f"step_{state.step:07d}").is_dir():
            self.checkpoint()
        return TrainingStopped(f"stopped in step {state.step + 1}: {how}; checkpoint of step {state.step} in "
                               f"{parts.checkpoints}: {advice}", signum=signum)

    def checkpoint(self) -> None:
        """Write a checkpoint of the current step (every process must call this)."""
        parts, state = self.components, self.state
        weights, optimizer_state = parts.procs.full_state(parts.policy, parts.optimizer)  # gathered when sharded
        engine_states = parts.procs.gather_objects(parts.engine.state_dict())  # each process's own
        group_size = parts.group_size.state_dict()
        if parts.procs.is_main:  # whole parameters and optimizer state are the same on every process
            for log in (parts.metrics, parts.rollout_log):
                log.sync()  # the logs up to this step are on disk before a checkpoint says the step is done
            save_checkpoint(parts.checkpoints, step=state.step, weights=weights, optimizer_state=optimizer_state,
                            scheduler=parts.scheduler, generators=state.generators, keep=parts.cfg.save_total_limit,
                            engine_states=engine_states,
                            trainer_state={"train_seconds": state.train_seconds,
                                           "sampler": state.prompt_selector.state_dict(),  # the selector's state
                                           **({GROUP_SIZE_STATE: group_size} if group_size else {})})
        parts.procs.barrier()
        self.cadence.last_checkpoint_time = time.time()

    def finish(self, initial: dict[str, float], final: dict[str, float], first_step: int,
               trained: int) -> RunResult:
        """The last checkpoint, the final model (whole weights or the LoRA adapter) and
        summary.json; the accuracy plot is the caller's (``podsrl train`` draws it). A resumed
        run that had no step left to do (``first_step`` is the step it started at) leaves its
        finished files as they are. ``trained``: the steps since ``first_step`` whose update was
        not skipped; a run that learned nothing still writes its files, and says why in
        ``RunResult.failure`` and summary.json."""
        parts, state = self.components, self.state
        procs = parts.procs
        result = RunResult(run_dir=parts.run_dir, initial=initial, final=final, steps=state.step,
                           train_seconds=state.train_seconds, is_main=procs.is_main,
                           eval_prompts=min(parts.cfg.eval_prompts, len(parts.test_split.examples)))
        if state.step == first_step and (parts.run_dir / "summary.json").exists():
            if procs.is_main:
                say(f"{parts.run_dir} finished earlier at step {state.step}; nothing to do (raise max_steps or "
                    f"max_minutes to train further)")
            return result
        result.failure = self._learned_nothing(state.step - first_step, trained)
        if not (parts.checkpoints / f"step_{state.step:07d}").is_dir():
            self.checkpoint()
        weights = procs.full_state(parts.policy, parts.optimizer)[0] if procs.sharded else None  # every process
        if procs.is_main:
            self._save_model(weights)
            (parts.run_dir / "summary.json").write_text(json.dumps({
                "steps": state.step, "train_seconds": round(state.train_seconds, 2), "initial": initial,
                "final": final, **({"failure": result.failure} if result.failure else {})}, indent=2) + "\n")
        procs.barrier()
        return result

    def _learned_nothing(self, steps: int, trained: int) -> str:
        """Why the ``steps`` steps this process ran taught the model nothing, or "" when they
        did: no reward ever applied (all None / NaN, or failed under the 'zero' policy: every
        advantage is 0), or every optimizer step was skipped (non-finite). Such a run is a
        failure, not a success (every process gets the same answer: the count is summed)."""
        parts = self.components
        applied = parts.procs.sum([float(parts.scorer.applied)])[0]
        if not steps:
            return ""
        if not applied:
            return (f"no reward applied in the {steps} steps run: every reward was None / NaN or its function failed "
                    f"(reward_error_policy {parts.cfg.reward_error_policy}; see reward_failures and unverifiable "
                    f"in metrics.jsonl), so nothing was learned")
        if not trained:
            return (f"all {steps} optimizer steps were skipped (a non-finite loss or gradient: skipped_step 1 in "
                    f"metrics.jsonl), so the weights never changed")
        return ""

    def _save_model(self, weights: dict | None) -> None:
        """Write model/ as a whole: into model.tmp, then swapped in, so a crash while saving
        leaves the previous model/ (a resumed run's) loadable. A write error (a full disk) is
        one line saying how to export the last checkpoint instead; model.tmp is removed."""
        parts = self.components
        final, staging, previous = (parts.run_dir / name for name in ("model", "model.tmp", "model.previous"))
        for leftover in (staging, previous):
            shutil.rmtree(leftover, ignore_errors=True)
        # podsrl never resizes the vocabulary, so the adapter needs no embedding weights;
        # peft's default ("auto") would look the base's config up on the hub to check
        lora = {"save_embedding_layers": False} if parts.bundle.uses_lora else {}
        try:
            parts.policy.save_pretrained(staging, state_dict=weights, **lora)
            parts.bundle.tokenizer.save_pretrained(staging)
            if final.exists():
                os.replace(final, previous)
            os.replace(staging, final)
        except (OSError, RuntimeError) as err:  # a full disk: safetensors may raise either
            if previous.exists() and not final.exists():
                os.replace(previous, final)  # the swap failed half-way: the previous model/ comes back
            shutil.rmtree(staging, ignore_errors=True)
            raise OSError(self._save_failed(final, err)) from None
        shutil.rmtree(previous, ignore_errors=True)

    def _save_failed(self, final: Path, err: BaseException) -> str:
        """The one line for a final model that could not be written: what is kept, and the
        export that redoes it once there is room."""
        parts = self.components
        good = list_checkpoints(parts.checkpoints)
        kept = "the previous model/ is as it was" if final.exists() else "no model/ was written"
        redo = (f"free space, then export the last checkpoint: podsrl export {parts.run_dir} OUTPUT_DIR "
                f"--checkpoint {good[-1].name}" if good else "no checkpoint to export")
        return (f"model: could not write {final} ({error_line(err)}); removed model.tmp, {kept}; the training "
                f"is kept in {good[-1] if good else 'no checkpoint'}: {redo}")

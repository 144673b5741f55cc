"""A training run (its stages, state and limits, and the jobs the loop calls:
:mod:`podsrl.trainer.jobs`): starting or resuming, a step's timing, finishing with the final
files, and releasing what it holds. Each part is built by set-up with what it reads (nothing
here reads the config); where it stops early is :mod:`podsrl.trainer.stops`'s."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from podsrl.distributed import Processes
from podsrl.provenance import record_environment
from podsrl.run_folder.claim import RunLock
from podsrl.scoring import Scorer
from podsrl.trainer.checkpoints import HeldBackStep, Resume
from podsrl.trainer.jobs import Checkpointer, RunEvaluation, RunLog
from podsrl.trainer.limits import Limits
from podsrl.trainer.logging import logged_evals, say
from podsrl.trainer.stages import StepStages
from podsrl.trainer.state import RunState
from podsrl.trainer.stops import Signals, Stops
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


@dataclass
class Run:
    """A training run: its :class:`StepStages` (the step, configured), its :class:`RunState`
    (checkpointed) and its :class:`Limits`; the jobs the loop calls around each step
    (:mod:`podsrl.trainer.jobs`: ``evaluation``, ``log``, ``checkpoints``); and what the run itself
    does: start or resume, time a step, finish with the final files, and release what it holds."""

    stages: StepStages
    state: RunState
    limits: Limits
    resume: Resume
    procs: Processes  # the collectives every process takes part in
    evaluation: RunEvaluation
    log: RunLog
    checkpoints: Checkpointer
    autocast: Callable  # the forward passes' precision: bfloat16 under bf16 (weights stay float32)
    policy: torch.nn.Module  # the bare model, wrapped for the update (DDP / FSDP) when the run starts
    optimizer: torch.optim.Optimizer
    scorer: Scorer  # whether any reward applied: a run that learned nothing says why
    engine: object  # shut down when the run ends (its close(), where it has one)
    run_dir: Path
    recorded_config: dict  # the config as config.json and the trackers record it
    tokenizer: object  # environment.json records its end of turn
    lock: RunLock | None = None  # the run folder's lock, held by the main process until the run ends
    # from the checkpoint resumed: its evaluation was cut short
    held_back: HeldBackStep | None = None

    def stops(self, signals: Signals) -> Stops:
        """Where this run stops before its end, on ``signals`` (:mod:`podsrl.trainer.stops`)."""
        return Stops(signals, self.procs, self.state, self.limits, self.checkpoints, self.log.rollout_rows,
                     self.resume.keeps, self.timed_step)

    def release(self) -> None:
        """However the run ends: trackers flushed and closed, the generation engine shut down
        (vllm frees its memory), the run folder's lock released."""
        try:
            self.log.close()
            close = getattr(self.engine, "close", None)
            if close:
                close()
        finally:
            if self.lock:
                self.lock.release()

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
        recorded = self.recorded_config
        if self.resume.wanted:
            resumed, self.held_back = self.checkpoints.restore()
        self.stages.update.bind(*self.procs.prepare(self.policy, self.optimizer))  # DDP / FSDP
        if not self.resume.wanted:
            self.log.start(recorded, first_step=0)
            initial = self.evaluation()
            self.log.write({"step": 0, "train_seconds": 0.0, **initial})
            return initial, initial
        held_back = self.held_back
        # the steps after the checkpoint are redone, and its own when held back (logged below)
        self.log.truncate_after(self.state.step - bool(held_back))
        if self.procs.is_main:
            # the run as it would be started from scratch: the fields a resume may change, as changed
            # now (checked against the checkpoint's config); each start's command is in environment.json
            started = {**recorded, "resume": False}
            (self.run_dir / "config.json").write_text(json.dumps(started, indent=2) + "\n")
            record_environment(self.run_dir, self.tokenizer)
            say(f"resumed from {resumed} at step {self.state.step}"
                f"{', evaluating it first (a stop came before its evaluation)' if held_back else ''}")
        self.log.start(recorded, first_step=self.state.step + (0 if held_back else 1))
        # the evaluation a stop cut short, then the step's log, as an uninterrupted run had them
        if held_back:
            self.evaluation.into(held_back.record)
            self.log.write(held_back.record, held_back.rollouts)
        self.procs.barrier()  # the other processes read the log only once it is rewritten
        return logged_evals(self.run_dir / "metrics.jsonl")

    def finish(self, initial: dict[str, float], final: dict[str, float], first_step: int,
               trained: int, informative: int) -> RunResult:
        """The last checkpoint, the final model (whole weights or the LoRA adapter) and
        summary.json; the accuracy plot is the caller's (``podsrl train`` draws it). A resumed
        run that had no step left to do (``first_step`` is the step it started at) leaves its
        finished files as they are. ``trained``: the steps since ``first_step`` whose update was
        not skipped; ``informative``: those with a non-zero advantage on this process. A run that
        learned nothing still writes its files, and says why in ``RunResult.failure`` and summary.json."""
        state, procs, run_dir = self.state, self.procs, self.run_dir
        result = RunResult(run_dir=run_dir, initial=initial, final=final, steps=state.step,
                           train_seconds=state.train_seconds, is_main=procs.is_main,
                           eval_prompts=self.evaluation.prompts)
        if state.step == first_step and (run_dir / "summary.json").exists():
            if procs.is_main:
                say(f"{run_dir} finished earlier at step {state.step}; nothing to do (raise "
                    "max_steps or max_minutes to train further)")
            return result
        result.failure = self._learned_nothing(state.step - first_step, trained, informative)
        if not self.checkpoints.holds(state.step):
            self.checkpoints.write()
        # every process takes part; only a sharded run needs the gathered weights
        weights = procs.full_state(self.policy, self.optimizer)[0] if procs.sharded else None
        if procs.is_main:
            self.checkpoints.save_model(weights)
            (run_dir / "summary.json").write_text(json.dumps({
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
        applied, informative = self.procs.sum([float(self.scorer.applied), float(informative)])
        if not steps:
            return ""
        if not applied:
            return (f"no reward applied in the {steps} steps run: every reward was None / NaN or its "
                    f"function failed (reward_error_policy {self.scorer.error_policy}; see "
                    "reward_failures and unverifiable in metrics.jsonl), so nothing was learned")
        if not informative:
            return (f"every advantage was 0 in the {steps} steps run: no prompt group's kept rollouts "
                    "differed in reward (kept_reward_zero_var_frac 1 in metrics.jsonl; e.g. a reward that "
                    "scores every completion the same), so there was nothing to learn from")
        if not trained:
            return (f"all {steps} optimizer steps were skipped (a non-finite loss or gradient: skipped_step "
                    "1 in metrics.jsonl), so the weights never changed")
        return ""

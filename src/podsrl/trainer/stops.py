"""Where a run stops before its end, in one place: :class:`Stops` owns the signals (SIGINT /
SIGTERM ask for a clean stop, a second one stops at once: :mod:`podsrl.interrupts`), what a
stop does at each point of the run (before the steps, in a step, before or during its
evaluation, after it, outside any step), and the one line each stop ends with
(:class:`TrainingStopped`). The loop asks it at those points and reads on.

Where a stop lands:

* set-up, or the start's evaluation: no step is begun; the files are as a stopped run leaves them;
* in a step (a signal that could not wait, a reward failure under 'raise', a user component
  failing): the step is abandoned, its learned parts rolled back, and the last finished step
  is checkpointed as an uninterrupted run had it (not once the update has begun);
* before or during the evaluation due after a step: the step is checkpointed with its record
  held back; the resumed run evaluates it first, so its metrics equal an uninterrupted run's;
* after a step: a checkpoint, then the stop.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from podsrl import interrupts
from podsrl.contracts import UserCodeError
from podsrl.interrupts import StopNow
from podsrl.rewards import RewardError
from podsrl.trainer.run import Run
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.timer import StageTimer


class TrainingStopped(RuntimeError):
    """The run stopped before its end: a signal (``signum`` set, a checkpoint was written)
    or too many consecutive non-finite steps (the last good checkpoint is left as it was)."""

    def __init__(self, message: str, signum: int | None = None) -> None:
        super().__init__(message)
        self.signum = signum


class Stops:
    """SIGINT / SIGTERM request a clean stop; user code running then (or later in the step)
    gets a few seconds to return before it is interrupted, and a second SIGINT or SIGTERM
    interrupts at once (both raise ``StopNow``, a ``KeyboardInterrupt``). Handlers are
    installed only in the main thread, and restored. :meth:`watch` gives it the run whose
    stops it then decides."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.setting_up = True  # until the first step: a stop then comes before it, with no checkpoint to write
        self.run: Run | None = None
        self._previous: dict[int, object] = {}

    # --- the signals ---------------------------------------------------------------------------
    def __enter__(self) -> "Stops":
        interrupts.clear()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
                self._previous[sig] = signal.getsignal(sig)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._request)
        return self

    def _request(self, signum, _frame) -> None:
        if self.signum is not None:
            interrupts.stop_now(signum)  # the second: no more waiting
        self.signum = signum
        when = "once the run is set up, before its first step" if self.setting_up else \
            "after this step and writing a checkpoint"
        print(f"\n{signal.Signals(signum).name}: stopping {when} ... (again: stop at once)", file=sys.stderr,
              flush=True)
        interrupts.stop_requested(signum)

    def __exit__(self, *exc) -> None:
        interrupts.clear()
        for sig, handler in self._previous.items():
            if handler is not None:  # None: a handler not installed from Python, left as it is
                signal.signal(sig, handler)

    def watch(self, run: Run) -> None:
        """The run whose stops this decides, once it is set up."""
        self.run = run

    def _agreed_signal(self) -> int:
        """The signal any process got (a signal may reach one process only), or 0."""
        return int(self.run.procs.max([float(self.signum or 0)])[0])

    # --- the points of the run where a stop lands -------------------------------------------------
    def before_steps(self, where: str = "") -> None:
        """A stop asked for while the run was set up (``where``: its files are then as a stopped
        run leaves them, a resumed run's as they were) or evaluated its start: no step is begun."""
        signum = self._agreed_signal()
        if signum:
            raise TrainingStopped(f"stopped by {signal.Signals(signum).name} "
                                  f"{where or f'before step {self.run.state.step + 1}'}; {self.run.stopped_here()}",
                                  signum=signum)

    def first_step_begins(self) -> None:
        """The last stop before the steps; from here a signal waits for the step to end."""
        self.before_steps()
        self.setting_up = False

    @contextmanager
    def step(self) -> Iterator[StageTimer]:
        """Around the step's pipeline: its timer, the forward passes' precision, and the run's
        training time advanced by the slowest process's. A reward failure (the 'raise' policy),
        a user component's failure or a stop that could not wait abandons the step
        (:meth:`abandon`)."""
        run = self.run
        timer, before = StageTimer(), run.state.snapshot()
        try:
            with run.autocast():
                yield timer
        except RewardError as err:
            raise self.abandon(before, err, "fix the reward function") from None
        except UserCodeError as err:
            raise self.abandon(before, err, "fix it", update_began="update" in timer.seconds,
                               kept=self._kept_setting(err)) from None
        except StopNow as stop:
            raise self.abandon(before, stop, "", update_began="update" in timer.seconds) from None
        run.state.train_seconds += run.procs.max([timer.total])[0]  # the slowest process sets the pace

    def evaluate(self, record: dict, outcome: StepOutcome) -> dict[str, float]:
        """The evaluation due after this step, added to its ``record``. A stop does not wait for
        it (an evaluation of a large model can outlast a scheduler's grace period between
        SIGTERM and SIGKILL): asked for before it, the evaluation is not begun; asked for during
        it, it gets the grace, then is cut short (:meth:`Run.evaluate`). Either way the step is
        checkpointed with its record held back (:meth:`hold_back_evaluation`). A multi-process
        run waits for the evaluation: a signal may reach one process only, and a checkpoint
        needs every process."""
        single = self.run.procs.world_size == 1
        if single and self.signum:
            raise self.hold_back_evaluation(record, outcome, self.signum)
        try:
            return self.run.evaluate_into(record)
        except StopNow as interrupted:
            if not (interrupted.waited and single):  # a second signal: stop at once, no checkpoint
                raise
            raise self.hold_back_evaluation(record, outcome, interrupted.signum) from None

    def after_step(self, consecutive_skips: int) -> None:
        """Checkpoint when due (every save_steps steps, every checkpoint_minutes, or on a
        signal); stop on a signal or too many non-finite steps in a row."""
        run = self.run
        state, cadence, procs = run.state, run.cadence, run.procs
        if consecutive_skips >= cadence.max_consecutive_skips:
            raise TrainingStopped(f"stopped at step {state.step}: {consecutive_skips} consecutive steps had a "
                                  f"non-finite loss or gradient (max_consecutive_skips); last good checkpoint: "
                                  f"{run.last_checkpoint()}")
        signum = self._agreed_signal()
        due_by_time = bool(procs.max([float(cadence.checkpoint_due_by_time())])[0])  # every process must agree
        if cadence.checkpoint_due_by_steps(state) or due_by_time or signum:
            run.checkpoint()
        if signum:
            raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {state.step}; checkpoint "
                                  f"written to {run.checkpoints}; continue with the same command plus --resume "
                                  f"true", signum=signum)

    def during_set_up(self, interrupted: StopNow) -> TrainingStopped:
        return TrainingStopped(f"stopped by {interrupted} while setting the run up; nothing was trained: run the "
                               f"same command again", signum=interrupted.signum)

    def outside_step(self, interrupted: StopNow) -> TrainingStopped:
        """A second signal outside a step (evaluating, logging, writing a checkpoint)."""
        return TrainingStopped(f"stopped by {interrupted} after step {self.run.state.step}; {self.run.stopped_here()}",
                               signum=interrupted.signum)

    # --- what a stop leaves -----------------------------------------------------------------------
    def hold_back_evaluation(self, record: dict, outcome: StepOutcome, signum: int) -> TrainingStopped:
        """A stop came before the finished step's evaluation or during it: checkpoint the step
        with its record and rollout rows held back (not logged), and return the one-line stop
        to raise. The resumed run evaluates the step first, then logs it (:meth:`Run.resume_or_start`)."""
        run = self.run
        run.checkpoint(held_back={"record": record, "rollouts": run.rollout_rows(outcome)})
        return TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {run.state.step}, before its "
                               f"evaluation; checkpoint written to {run.checkpoints}; continue with the same "
                               f"command plus --resume true (it evaluates step {run.state.step} first)",
                               signum=signum)

    def _kept_setting(self, err: UserCodeError) -> str:
        """What a fix may not do, where the component's error names a setting a resume may not
        change (a user's engine over generation_memory_mb: podsrl's errors name their field
        first): changing it means a new run, which '--resume true' would refuse to be."""
        component, named = (re.match(r"\w*", str(e)).group() for e in (err, err.__cause__ or ""))
        if named == component or named not in self.run.settings.resume_keeps:
            return ""
        return f" (a resume keeps the run's {named}: with another {named}, start a new run in another --output_dir)"

    def abandon(self, before: dict[str, dict], reason: BaseException, fix: str = "",
                update_began: bool = False, kept: str = "") -> TrainingStopped:
        """Undo the unfinished step (its learned parts back to ``before``, the snapshot taken at
        its start), checkpoint the last finished step exactly as an uninterrupted run had it, and
        return the one-line stop to raise, advising ``fix`` first (``kept``: what a fix may not
        change and still resume). Not where the step's update had begun (the weights may have
        moved), nor where only this process failed in a multi-process run (a checkpoint needs
        every process): the last checkpoint on disk is then left as it was, and with none there
        is nothing to resume. Nor in step 1 for a failure to fix: nothing was trained, so the
        same command starts afresh whatever the fix changes, where a checkpoint of step 0 would
        hold the run to a resume that refuses a changed setting."""
        run = self.run
        state = run.state
        state.step -= 1
        signum = getattr(reason, "signum", None)
        agreed = isinstance(reason, RewardError) or run.procs.world_size == 1
        how = f"by {reason}" if isinstance(reason, StopNow) else f"{reason}"
        first = f"{fix}, then " if fix else ""
        resume = f"{fix}{kept}, then " if fix else ""
        resume += "continue with the same command plus --resume true"
        if update_began or not agreed or (fix and state.step == 0):
            last = run.last_checkpoint()
            if last == "none":  # --resume would be refused: there is nothing to resume
                return TrainingStopped(f"stopped in step {state.step + 1}: {how}; no checkpoint yet: {first}run the "
                                       f"same command again to start afresh (podsrl reuses the folder)", signum=signum)
            return TrainingStopped(f"stopped in step {state.step + 1}: {how}; last checkpoint, left as it was: "
                                   f"{last}; {resume}", signum=signum)
        state.roll_back(before)
        if not (run.checkpoints / f"step_{state.step:07d}").is_dir():
            run.checkpoint()
        return TrainingStopped(f"stopped in step {state.step + 1}: {how}; checkpoint of step {state.step} in "
                               f"{run.checkpoints}: {resume}", signum=signum)

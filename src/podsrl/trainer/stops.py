"""Where a run stops before its end, in one place: :class:`Signals` owns the signals (SIGINT /
SIGTERM ask for a clean stop, a second one stops at once: :mod:`podsrl.interrupts`) from before
the run is set up; :class:`Stops`, built for the run once it is, decides what a stop does at
each point of the run (before the steps, in a step, before or during its evaluation, after it,
outside any step), and the one line each stop ends with (:class:`TrainingStopped`). The loop
asks it at those points and reads on.

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
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from podsrl import interrupts
from podsrl.contracts import UserCodeError
from podsrl.distributed import Processes
from podsrl.interrupts import StopNow
from podsrl.rewards import RewardError
from podsrl.trainer.checkpoints import HeldBackStep
from podsrl.trainer.jobs import Checkpointer
from podsrl.trainer.limits import Limits
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.state import RunState
from podsrl.trainer.timer import StageTimer


class TrainingStopped(RuntimeError):
    """The run stopped before its end: a signal (``signum`` set, a checkpoint was written)
    or too many consecutive non-finite steps (the last good checkpoint is left as it was)."""

    def __init__(self, message: str, signum: int | None = None) -> None:
        super().__init__(message)
        self.signum = signum


class Signals:
    """SIGINT / SIGTERM request a clean stop; user code running then (or later in the step)
    gets a few seconds to return before it is interrupted, and a second SIGINT or SIGTERM
    interrupts at once (both raise ``StopNow``, a ``KeyboardInterrupt``). Handlers are
    installed only in the main thread, and restored."""

    def __init__(self) -> None:
        self.signum: int | None = None
        # until the first step: a stop then comes before it, with no checkpoint to write
        self.setting_up = True
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "Signals":
        main = threading.current_thread() is threading.main_thread()
        interrupts.clear(owned=main)
        if main:
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

    def during_set_up(self, interrupted: StopNow) -> TrainingStopped:
        return TrainingStopped(f"stopped by {interrupted} while setting the run up; nothing was trained: run "
                               "the same command again", signum=interrupted.signum)


@dataclass(frozen=True)
class Stops:
    """What a stop does at each point of a run (its :class:`Signals`): built for the run once it
    is set up (:meth:`podsrl.trainer.run.Run.stops`), with what the stops read and write."""

    signals: Signals
    procs: Processes
    state: RunState  # the step, and the parts an abandoned step rolls back
    limits: Limits  # when the run gives up
    checkpoints: Checkpointer
    rollout_rows: Callable[[StepOutcome], list[dict]]  # the step's rows, kept with a held-back record
    keeps: frozenset[str]  # the settings a resume may not change
    timed_step: Callable[[], AbstractContextManager[StageTimer]]  # around the step's pipeline

    @property
    def signum(self) -> int | None:
        return self.signals.signum

    # --- the points of the run where a stop lands -------------------------------------------------
    def before_steps(self, where: str = "") -> None:
        """A stop asked for while the run was set up (``where``: its files are then as a stopped
        run leaves them, a resumed run's as they were) or evaluated its start: no step is begun."""
        signum = self.agreed_signal()
        if signum:
            raise TrainingStopped(f"stopped by {signal.Signals(signum).name} "
                                  f"{where or f'before step {self.state.step + 1}'}; "
                                  f"{self.checkpoints.stopped_here()}",
                                  signum=signum)

    def first_step_begins(self) -> None:
        """The last stop before the steps; from here a signal waits for the step to end."""
        self.before_steps()
        self.signals.setting_up = False

    @contextmanager
    def guard_step(self) -> Iterator[StageTimer]:
        """Around the step (``timed_step``: its timer, precision and training time): a reward
        failure (the 'raise' policy), a user component's failure or a stop that could not wait
        abandons the step (:meth:`abandon`)."""
        before = self.state.snapshot()
        timer = None
        try:
            with self.timed_step() as timer:
                yield timer
        except RewardError as err:
            raise self.abandon(before, err, "fix the reward function") from None
        except UserCodeError as err:
            raise self.abandon(before, err, "fix it", update_began=_update_began(timer),
                               kept=self._kept_setting(err)) from None
        except StopNow as stop:
            raise self.abandon(before, stop, "", update_began=_update_began(timer)) from None

    @contextmanager
    def guard_evaluation(self, record: dict, outcome: StepOutcome) -> Iterator[None]:
        """Around the evaluation due after this step. A stop does not wait for it (an
        evaluation of a large model can outlast a scheduler's grace period between SIGTERM and
        SIGKILL): asked for before it, the evaluation is not begun; asked for during it, it
        gets the grace, then is cut short (:class:`~podsrl.trainer.jobs.RunEvaluation`). Either way the step
        is checkpointed with its record held back (:meth:`hold_back_evaluation`). A multi-process
        run waits for the evaluation: a signal may reach one process only, and a checkpoint
        needs every process."""
        single = self.procs.world_size == 1
        if single and self.signum:
            raise self.hold_back_evaluation(record, outcome, self.signum)
        try:
            yield
        except StopNow as interrupted:
            if not (interrupted.waited and single):  # a second signal: stop at once, no checkpoint
                raise
            raise self.hold_back_evaluation(record, outcome, interrupted.signum) from None

    def give_up_after(self, outcome: StepOutcome) -> None:
        """Give up where the run's :class:`~podsrl.trainer.limits.Limits` say so after this
        step (too many non-finite steps in a row), leaving the last good checkpoint as it is."""
        given_up = self.limits.give_up(outcome)
        if given_up:
            raise TrainingStopped(f"stopped at step {self.state.step}: {given_up}; last good checkpoint: "
                                  f"{self.checkpoints.last()}")

    def agreed_signal(self) -> int:
        """The signal any process got since the run began (a signal may reach one process
        only), or 0: the run checkpoints, then :meth:`stop_on` stops it."""
        return int(self.procs.max([float(self.signum or 0)])[0])

    def stop_on(self, signum: int) -> None:
        """After a signal's checkpoint: the stop."""
        if signum:
            raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {self.state.step}; "
                                  f"checkpoint written to {self.checkpoints.folder}; continue with the same "
                                  "command plus --resume true", signum=signum)

    def outside_step(self, interrupted: StopNow) -> TrainingStopped:
        """A second signal outside a step (evaluating, logging, writing a checkpoint)."""
        return TrainingStopped(f"stopped by {interrupted} after step {self.state.step}; "
                               f"{self.checkpoints.stopped_here()}",
                               signum=interrupted.signum)

    # --- what a stop leaves -----------------------------------------------------------------------
    def hold_back_evaluation(self, record: dict, outcome: StepOutcome, signum: int) -> TrainingStopped:
        """A stop came before the finished step's evaluation or during it: checkpoint the step
        with its record and rollout rows held back (not logged), and return the one-line stop
        to raise. The resumed run evaluates the step first, then logs it
        (:meth:`podsrl.trainer.run.Run.resume_or_start`)."""
        self.checkpoints.write(held_back=HeldBackStep(record, self.rollout_rows(outcome)))
        return TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {self.state.step}, "
                               f"before its evaluation; checkpoint written to {self.checkpoints.folder}; "
                               "continue with the same command plus --resume true (it evaluates step "
                               f"{self.state.step} first)",
                               signum=signum)

    def _kept_setting(self, err: UserCodeError) -> str:
        """What a fix may not do, where the component's error names a setting a resume may not
        change (a user's engine over generation_memory_mb: podsrl's errors name their field
        first): changing it means a new run, which '--resume true' would refuse to be."""
        component, named = (re.match(r"\w*", str(e)).group() for e in (err, err.__cause__ or ""))
        if named == component or named not in self.keeps:
            return ""
        return (f" (a resume keeps the run's {named}: with another {named}, start a new run in another "
                "--output_dir)")

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
        state, checkpoints = self.state, self.checkpoints
        state.step -= 1
        signum = getattr(reason, "signum", None)
        agreed = isinstance(reason, RewardError) or self.procs.world_size == 1
        how = f"by {reason}" if isinstance(reason, StopNow) else f"{reason}"
        first = f"{fix}, then " if fix else ""
        resume = f"{fix}{kept}, then " if fix else ""
        resume += "continue with the same command plus --resume true"
        if update_began or not agreed or (fix and state.step == 0):
            last = checkpoints.last()
            if last == "none":  # --resume would be refused: there is nothing to resume
                return TrainingStopped(f"stopped in step {state.step + 1}: {how}; no checkpoint yet: "
                                       f"{first}run the same command again to start afresh (podsrl reuses "
                                       "the folder)", signum=signum)
            return TrainingStopped(f"stopped in step {state.step + 1}: {how}; last checkpoint, left as it "
                                   f"was: {last}; {resume}", signum=signum)
        state.roll_back(before)
        if not checkpoints.holds(state.step):
            checkpoints.write()
        return TrainingStopped(f"stopped in step {state.step + 1}: {how}; checkpoint of step {state.step} in "
                               f"{checkpoints.folder}: {resume}", signum=signum)


def _update_began(timer: StageTimer | None) -> bool:
    """Whether the step's update had begun (the weights may have moved) when it failed."""
    return timer is not None and "update" in timer.seconds

"""The run's limits, each with its setting beside it and its own count: the step budget
(max_steps) and the training-time budget (max_minutes), where the run ends as planned, and
giving up after too many non-finite steps in a row (max_consecutive_skips). Signals are
:mod:`podsrl.trainer.stops`'s. :class:`StopOptions` is declared here only; the config
composes it, so a new reason to stop is a field of it and a few lines of :class:`Limits`,
which sees every finished step (:meth:`Limits.give_up`)."""

from __future__ import annotations

from dataclasses import dataclass

from podsrl.options import POSITIVE, Range, option
from podsrl.trainer.stages import StepOutcome
from podsrl.trainer.state import RunState


@dataclass(frozen=True)
class StopOptions:
    """When the run ends (the config's fields of these names)."""

    max_steps: int = option(150, "Number of optimizer steps (generation batches; TRL's field).", POSITIVE)
    max_minutes: float = option(0.0, "Stop after this much training time (eval excluded); 0 = no limit.",
                                Range(0, why="0 = no limit"))
    max_consecutive_skips: int = option(5, "Stop the run after this many consecutive steps skipped for a "
                                           "non-finite loss or gradient.", POSITIVE)


class Limits:
    """Whether the run takes another step, and whether it gives up after one."""

    def __init__(self, options: StopOptions) -> None:
        self.options = options
        self.consecutive_skips = 0  # steps skipped in a row (non-finite), up to the last one

    def out_of_time(self, state: RunState) -> bool:
        return bool(self.options.max_minutes) and state.train_seconds >= self.options.max_minutes * 60

    def more_steps(self, state: RunState) -> bool:
        return state.step < self.options.max_steps and not self.out_of_time(state)

    def give_up(self, outcome: StepOutcome) -> str:
        """Count a finished step; why the run gives up after it, or '' when it goes on."""
        self.consecutive_skips = self.consecutive_skips + 1 if outcome.update.skipped_step else 0
        if self.consecutive_skips < self.options.max_consecutive_skips:
            return ""
        return (f"{self.consecutive_skips} consecutive steps had a non-finite loss or gradient "
                f"(max_consecutive_skips)")

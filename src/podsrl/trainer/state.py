"""Run state that outlives one step: the rollout seeds (reproducible; the order of the
training prompts is podsrl.prompt_selection's), and clean stops on SIGINT / SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading

from podsrl import interrupts


def sampling_seed(seed: int, step: int, first_prompt: int) -> int:
    """The RNG seed of the rollouts of one chunk of a step's prompts.

    Seeding per chunk by the chunk's position in the step's batch, not by process, makes
    the samples independent of how the batch is split: a run over W processes draws the
    same rollouts as one process generating the same chunks (generation_batch_size)."""
    return hash((seed, step, first_prompt)) % 2**63


class TrainingStopped(RuntimeError):
    """The run stopped before its end: a signal (``signum`` set, a checkpoint was written)
    or too many consecutive non-finite steps (the last good checkpoint is left as it was)."""

    def __init__(self, message: str, signum: int | None = None) -> None:
        super().__init__(message)
        self.signum = signum


class StopSignals:
    """SIGINT / SIGTERM request a clean stop after the current step; user code running then
    (or later in the step) gets a few seconds to return before it is interrupted, and a second
    SIGINT or SIGTERM interrupts at once (:mod:`podsrl.interrupts`: both raise ``StopNow``, a
    ``KeyboardInterrupt``). Handlers are installed only in the main thread, and restored."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.setting_up = True  # until the first step: a stop then comes before it, with no checkpoint to write
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
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

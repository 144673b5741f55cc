"""Stops that reach user code: a signal ends a run within seconds even while a user's rule,
estimator, loss, prompt selector, engine or reward hangs.

The trainer's signal handler (:class:`podsrl.trainer.stops.Stops`) asks for a clean stop
after the current step. That is enough while podsrl's own code runs, since a step ends; user
code may never return, and an evaluation of a large model can outlast a scheduler's grace
period. So every call into user code, and every evaluation during training, runs inside
:func:`interruptible`: a stop asked for while it runs (or already pending when it starts)
gives it ``GRACE_SECONDS`` to return, then :class:`StopNow` is raised inside it (from a
``SIGALRM`` timer, in the main thread, where Python runs signal handlers: a ``time.sleep``, a
socket wait or a pure-Python loop is interrupted; a C extension that never returns to the
interpreter is not). A second signal raises :class:`StopNow` at once, wherever the run is.

:class:`StopNow` is a ``KeyboardInterrupt``: user code that catches ``Exception`` does not
swallow it, and code that cleans up after a Ctrl-C cleans up after it too.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

GRACE_SECONDS = 2.0  # how long user code may take to return once a stop is asked for


class StopNow(KeyboardInterrupt):
    """A stop that could not wait for the step to end: ``signum`` the signal, ``where`` the
    code it interrupted ('' where it was not inside :func:`interruptible`), ``waited``: True
    where a first signal's grace ran out, False for a second signal (stop at once)."""

    def __init__(self, signum: int, where: str = "", waited: bool = False) -> None:
        super().__init__(f"{signal.Signals(signum).name}{f' in {where}' if where else ''}")
        self.signum, self.where, self.waited = signum, where, waited


class _SignalState:
    """The process's one view of stops: which interruptible code runs now, and the pending signal."""

    # a label of the code running now ('advantage_estimator my.py:adv', 'evaluation')
    inside: str | None = None
    pending: int | None = None  # the signal of a stop asked for and not yet done
    # a run's handler owns SIGINT / SIGTERM (podsrl.trainer.stops.Stops): a signal then raises
    # StopNow or nothing, so a bare KeyboardInterrupt is code raising it
    owned: bool = False


_signal_state = _SignalState()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_if_inside(_signum, _frame) -> None:
    """SIGALRM: the grace is over; interrupt the code still running."""
    if _signal_state.inside is not None and _signal_state.pending is not None:
        raise StopNow(_signal_state.pending, _signal_state.inside, waited=True)


def _arm(seconds: float) -> None:
    if _in_main_thread():
        signal.signal(signal.SIGALRM, _raise_if_inside)
        signal.setitimer(signal.ITIMER_REAL, seconds)


def _disarm() -> None:
    if _in_main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextmanager
def interruptible(label: str):
    """Run code that may not return soon (``label`` names it, e.g. ``"loss_type
    my_losses.py:mean"``) where a stop can end it: see the module's docstring."""
    outer, _signal_state.inside = _signal_state.inside, label
    if outer is None and _signal_state.pending is not None:
        _arm(GRACE_SECONDS)  # a stop is pending: this call gets the grace, not forever
    try:
        yield
    finally:
        _signal_state.inside = outer
        if outer is None:
            _disarm()


def stop_requested(signum: int) -> None:
    """A first signal: the run stops after the step; interruptible code running now gets the grace."""
    _signal_state.pending = signum
    if _signal_state.inside is not None:
        _arm(GRACE_SECONDS)


def stop_now(signum: int) -> None:
    """A second signal: stop wherever the run is."""
    _signal_state.pending = signum
    raise StopNow(signum, _signal_state.inside or "")


def clear(owned: bool = False) -> None:
    """A run starts (``owned``: its handler now owns the signals) or is over: no stop pending, no
    timer left."""
    _signal_state.pending, _signal_state.inside, _signal_state.owned = None, None, owned
    _disarm()


def raised_by_code(err: KeyboardInterrupt) -> bool:
    """Whether ``err`` came from code raising it (a user's function that raises KeyboardInterrupt:
    that function's failure), not from a signal: a run's handler owns the signals, under which a
    signal raises :class:`StopNow` or nothing."""
    return _signal_state.owned and not isinstance(err, StopNow)

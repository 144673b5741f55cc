"""The worker process that runs user reward functions for a :class:`~podsrl.rewards.stack.RewardStack`
(forked, reused call after call, killed with what it started at a timeout), and the check of
what a reward function returns."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import multiprocessing
import numbers
import os
import pickle
import signal
import sys
import types
import weakref
from typing import Any, Callable, Sequence

import torch

from podsrl import interrupts
from podsrl.registry import error_line

RewardFn = Callable[..., list]
_GRACE = 1.0  # seconds a timed-out worker gets between SIGTERM and SIGKILL


class RewardError(RuntimeError):
    """A reward function failed under the ``raise`` policy (one line, naming it)."""


class CallFailed(Exception):
    """One call failed; the message is one line (``ZeroDivisionError: division by zero``)."""


class CallTimedOut(CallFailed):
    pass


class RewardWorker:
    """A forked process that calls a stack's user functions (by index: it has them from the
    fork, so closures and lambdas work) and sends back checked values or a one-line error."""

    def __init__(self, fns: Sequence[RewardFn]):
        self.fns = list(fns)
        self.process = self.conn = None
        self.owner = os.getpid()
        _LIVE.add(self)

    def start(self, fn: RewardFn) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child_end = context.Pipe()
        process = context.Process(target=_serve, args=(child_end, self.conn, self.fns, os.getpid()),
                                  name="podsrl-reward-worker")
        try:
            process.start()
        except (OSError, AssertionError) as err:  # out of memory / processes; a daemonic trainer process
            self.conn.close()
            self.conn = None
            raise RewardError(f"reward function {reward_name(fn)}: cannot start a worker process "
                              f"({error_line(err)}); podsrl.rewards.in_process runs it in the trainer "
                              "instead") from None
        finally:
            child_end.close()
        # the child sets it too; whichever runs first, a kill finds the group
        with contextlib.suppress(OSError):
            os.setpgid(process.pid, process.pid)
        self.process, self.owner = process, os.getpid()
        _stop_workers_at_exit()

    def call(self, fn: RewardFn, index: int, args: tuple, timeout: float) -> list[float | None]:
        request = _request(fn, index, args)
        if self.owner != os.getpid():  # a copy in a forked process: the worker is the original's
            self.process, self.conn, self.owner = None, None, os.getpid()
        if self.process is not None and not self.process.is_alive():
            self.stop()  # killed between calls, from outside or with the thread that forked it
        if self.process is None:
            self.start(fn)
        try:
            self.conn.send_bytes(request)
            # a stop does not wait for the timeout
            with interrupts.interruptible(f"reward_funcs {reward_name(fn)}"):
                reply = self.conn.recv_bytes() if self.conn.poll(timeout) else None
        except (EOFError, OSError):  # the function ended the process: os._exit, a crash, the OOM killer
            raise CallFailed(f"its worker process ended ({self.stop()})") from None
        except BaseException:  # Ctrl-C in the trainer: the worker is mid-call, out of step with us
            self.stop()
            raise
        if reply is None:
            self.stop(grace=_GRACE)
            raise CallTimedOut(f"timed out after {timeout:g}s")
        status, value = pickle.loads(reply)
        if status != "ok":
            raise CallFailed(value)
        return value

    def stop(self, grace: float = 0.0) -> str:
        """End the process and whatever it started (its process group): SIGTERM, then SIGKILL
        after ``grace`` seconds. Returns how it ended, in words."""
        process, conn, self.process, self.conn = self.process, self.conn, None, None
        if process is None or self.owner != os.getpid():  # in a forked copy (a worker, too), it is not ours
            return "not running"
        if grace:
            _signal_group(process.pid, signal.SIGTERM)
            process.join(grace)
        _signal_group(process.pid, signal.SIGKILL)  # also what it started, if it ended itself
        process.join(5.0)
        conn.close()
        return _exit_status(process.exitcode)


def _request(fn: RewardFn, index: int, args: tuple) -> bytes:
    """The call, pickled for the worker. Callables among the inputs (callbacks into the trainer,
    like TRL's ``log_extra`` / ``log_metric``) cross only as module-level functions; others
    (bound methods would carry their whole object) become no-ops there. Other inputs that
    cannot cross are an error whatever the policy: no call could work."""
    prompts, completions, kwargs, expected = args
    kwargs = {name: _portable(value) for name, value in kwargs.items()}
    try:
        return pickle.dumps((index, prompts, completions, kwargs, expected), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:
        raise RewardError(f"reward function {reward_name(fn)}: its inputs cannot be sent to its worker "
                          f"process ({error_line(err)}); podsrl.rewards.in_process runs it in the "
                          "trainer") from None


def _portable(value):
    if not callable(value) or isinstance(value, type):
        return value
    try:  # a module-level function pickles as its name
        return value if isinstance(value, types.FunctionType) and pickle.dumps(value) else _ignored
    except Exception:
        return _ignored


def _ignored(*_args, **_kwargs) -> None:
    """Stands in for a trainer callback in the worker process."""


def _serve(conn, trainer_end, fns: list[RewardFn], trainer_pid: int) -> None:
    """The worker's loop, until the trainer closes the pipe."""
    trainer_end.close()  # else the worker holds its own pipe open and never sees the trainer go
    with contextlib.suppress(OSError):
        # its own group: a kill reaches what the function started, and Ctrl-C only the trainer
        os.setpgid(0, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        # the trainer's handlers (a checkpoint on SIGTERM) are not the worker's
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _die_with(trainer_pid)
    # the trainer's OpenMP pool does not survive fork; one thread leaves it the cores
    torch.set_num_threads(1)
    # what a function prints shows even if it then hangs
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)
    while True:
        try:
            request = conn.recv_bytes()
        except EOFError:
            return
        reply = pickle.dumps(_handle(fns, request))
        for stream in (sys.stdout, sys.stderr):  # a killed worker never flushes
            with contextlib.suppress(Exception):
                stream.flush()
        conn.send_bytes(reply)


def _handle(fns: list[RewardFn], request: bytes) -> tuple[str, Any]:
    try:
        index, prompts, completions, kwargs, expected = pickle.loads(request)
        fn = fns[index]
        return "ok", checked_values(fn, fn(prompts=prompts, completions=completions, **kwargs), expected)
    # SystemExit; a KeyboardInterrupt is the function's own (Ctrl-C goes to the trainer)
    except BaseException as err:
        return "error", error_line(err)


def _die_with(trainer_pid: int) -> None:
    """Linux: SIGKILL when the trainer thread that forked the worker ends, so a worker stuck in a
    function never outlives a killed trainer (an idle one ends when the pipe closes anyway)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != trainer_pid:  # the trainer died before prctl took effect
        os._exit(1)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)  # in case the group was not set yet


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running after SIGKILL"
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


_LIVE: weakref.WeakSet[RewardWorker] = weakref.WeakSet()
_exit_hook_registered = False


def _stop_workers_at_exit() -> None:
    """Registered after multiprocessing's own exit hook (which the first start imports), so it
    runs first: that hook joins child processes, and would wait forever on a worker blocked in
    its pipe or in a hung function."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(lambda: [worker.stop() for worker in list(_LIVE)])
        _exit_hook_registered = True


def reward_name(fn) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def checked_values(fn, values, expected: int) -> list[float | None]:
    """One float or None per completion from what ``fn`` returned, or an error naming it and
    what it returned. NaN becomes None (not applicable, as TRL treats them alike)."""
    if hasattr(values, "ndim") and hasattr(values, "tolist"):  # a numpy array, a torch tensor
        if values.ndim != 1:
            raise TypeError(f"reward function {reward_name(fn)} returned a {type(values).__name__} of shape "
                            f"{tuple(values.shape)}, expected one value per completion")
        values = values.tolist()
    elif not isinstance(values, (list, tuple)):
        raise TypeError(f"reward function {reward_name(fn)} returned {type(values).__name__}, expected a "
                        "list of numbers or None, one per completion")
    if len(values) != expected:
        raise ValueError(f"reward function {reward_name(fn)} returned {len(values)} values "
                         f"for {expected} completions")
    return [_number(fn, value, i) for i, value in enumerate(values)]


def _number(fn, value, i: int) -> float | None:
    if value is None:
        return None
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy scalar, a 0-d tensor
        value = value.item()
    # bool is an int, but True is no reward
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"reward function {reward_name(fn)} returned {type(value).__name__} {value!r:.40} "
                        f"at index {i}, "
                        f"expected a number or None")
    value = float(value)
    if math.isinf(value):
        raise ValueError(f"reward function {reward_name(fn)} returned {value!r}")
    return None if math.isnan(value) else value

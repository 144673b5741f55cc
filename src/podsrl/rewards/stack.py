"""A weighted sum of reward functions with a policy for functions that raise, hang, exit or
return malformed values: none of them can take the trainer down.

Where functions run: podsrl's own (``podsrl.*``: REWARDS, the tasks' graders) run in the
trainer's process, fast, and bound their own work (the math grader's timeouts). User
functions run in a worker process per stack, forked when the stack is built (before the
model loads, so it shares little memory with the trainer) and reused call after call: one
that hangs past the timeout (``timeout``, or :data:`DEFAULT_REWARD_TIMEOUT` when it is <= 0)
is killed with whatever it started, and a fresh worker serves the next call; one that
raises, calls ``sys.exit`` / ``os._exit`` or crashes ends only the worker. The worker gets
the inputs pickled (equal values: rewards do not change) and sends back checked floats, so
state the function keeps lives in the worker, not in the trainer. :func:`in_process` marks a
function that must run in the trainer (a reward model on the trainer's GPU: CUDA does not
survive fork; state shared with the caller); it then has no timeout.

Return values: a list or tuple (or a 1-D array / tensor) of numbers or None, one per
completion. None or NaN means "not applicable to this sample" (TRL's convention): the
weighted sum skips it, like TRL's ``torch.nansum(rewards_per_func * weights, dim=1)``, and a
sample no function applies to is NaN (unverifiable). +/-inf, bools, strings, and a weighted
sum beyond +/-:data:`REWARD_LIMIT` (finite, but its group's mean and variance overflow
float32, so nothing would train) are errors. Under ``error_policy="raise"`` every failure is a one-line
:class:`RewardError` naming the function.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from podsrl import interrupts
from podsrl.rewards.functions import checked_bounds
from podsrl.rewards.worker import (
    CallFailed,
    CallTimedOut,
    RewardError,
    RewardFn,
    RewardWorker,
    checked_values,
    error_line,
    reward_name,
)

DEFAULT_REWARD_TIMEOUT = 300.0  # seconds a call of a user function may take when the stack's timeout is <= 0
# Rewards beyond this are refused: float32 holds 1e38, but a group's mean and variance square
# and sum the rewards (1e38 gives inf and NaN advantages); 1e15 leaves room for any batch
REWARD_LIMIT = 1e15


class _Failed(float):
    """The 0 a failing function scores under the 'zero' policy: a number in the sum, but
    not a reward that applied (``RewardStack.applied`` does not count it)."""


def in_process(fn: RewardFn) -> RewardFn:
    """Run ``fn`` in the trainer's process, as podsrl's own functions run, instead of a worker
    process: for a function that needs the trainer's GPU (CUDA does not survive fork) or state
    shared with its caller. It then has no timeout, and a hang or ``os._exit`` there stops the
    trainer: use it for code you trust."""
    fn.reward_in_process = True
    return fn


def runs_in_worker(fn: RewardFn) -> bool:
    """User code runs in a worker process; podsrl's own functions and :func:`in_process` ones
    run in the trainer."""
    module = getattr(fn, "__module__", None) or ""
    return not (module == "podsrl" or module.startswith("podsrl.") or getattr(fn, "reward_in_process", False))


@dataclass
class RewardStack:
    """Weighted sum of reward functions with an error policy.

    ``error_policy="raise"``: a function that raises (SystemExit and a KeyboardInterrupt of its
    own included), hangs past the timeout, ends its worker process or returns a malformed value
    stops the run with a :class:`RewardError` naming it and the failing prompt index.
    ``"zero"``: the failing samples score 0 from that function and are counted in ``failures``
    (logged in metrics as ``reward_failures``). ``applied`` counts the samples that got a
    reward (some function returned a usable value): a run where it stays 0 learned nothing.
    ``timeout``: seconds a call of a user function may take; <= 0 means
    :data:`DEFAULT_REWARD_TIMEOUT`. podsrl's own functions have none.
    """

    fns: list[RewardFn]
    weights: list[float]
    error_policy: str = "raise"
    timeout: float = DEFAULT_REWARD_TIMEOUT
    failures: int = field(default=0, init=False)
    applied: int = field(default=0, init=False)
    _worker: RewardWorker | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for fn in self.fns:  # malformed bounds refused before any work
            declared_bounds(fn)
        user_fns = [fn for fn in self.fns if runs_in_worker(fn)]
        if user_fns:  # forked now, before the model loads: the worker shares little memory with the trainer
            self._new_worker().start(user_fns[0])

    def _new_worker(self) -> RewardWorker:
        self._worker = RewardWorker(self.fns)
        weakref.finalize(self, self._worker.stop)  # a stack no longer used leaves no process behind
        return self._worker

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list],
                 shared: dict[str, Any] | None = None) -> torch.Tensor:
        """Rewards ``[N = len(completions)]``; NaN where every function returned None / NaN.

        ``columns``: keyword arguments with one value per completion (``completion_ids``, the
        dataset columns), each [N]; ``shared``: keyword arguments passed as they are
        (``trainer_state``, ``log_extra``, ``log_metric``).
        """
        n = len(completions)
        total, verifiable, applied, per_fn = [0.0] * n, [False] * n, [False] * n, []
        for index, (fn, weight) in enumerate(zip(self.fns, self.weights)):
            values = self._call(index, fn, prompts, completions, columns, shared or {})
            if (bounds := declared_bounds(fn)) is not None:
                values = self._within_bounds(fn, values, bounds)
            per_fn.append(values)
            for i, value in enumerate(values):
                if value is not None:
                    total[i] += weight * value  # float64, function after function, as TRL's sum
                    verifiable[i] = True
                    applied[i] |= not isinstance(value, _Failed)
        rewards = torch.tensor([t if v else math.nan for t, v in zip(total, verifiable)], dtype=torch.float64)
        rewards, bad = self._finite(rewards.float(), verifiable, per_fn)
        self.applied += sum(applied) - sum(applied[i] for i in bad)
        return rewards

    @property
    def user_timeout(self) -> float:
        return self.timeout if self.timeout > 0 else DEFAULT_REWARD_TIMEOUT

    def close(self) -> None:
        """Stop the worker process now (it also stops when the stack is garbage-collected, and
        at exit)."""
        if self._worker is not None:
            self._worker.stop()

    def bounds(self) -> tuple[float, float] | None:
        """[low, high] of the weighted sum when every function declares its ``reward_bounds``,
        else None. A term can also be 0 (a function skipping a sample, or failing under the
        'zero' policy), so each term's interval is widened to include 0."""
        low = high = 0.0
        for fn, weight in zip(self.fns, self.weights):
            declared = declared_bounds(fn)
            if declared is None:
                return None
            terms = (weight * declared[0], weight * declared[1], 0.0)
            low, high = low + min(terms), high + max(terms)
        return low, high

    def _within_bounds(self, fn: RewardFn, values: list, bounds: tuple[float, float]) -> list[float | None]:
        """``values`` held to ``fn``'s declared bounds: early stop's lossless stop rests on them, so a
        value outside is a failure of the function (the error policy applies), never trained on."""
        low, high = bounds
        outside = [i for i, v in enumerate(values) if v is not None and not isinstance(v, _Failed)
                   and not low <= v <= high]  # prompt indices, in order
        if not outside:
            return values
        if self.error_policy == "raise":
            raise RewardError(f"reward function {reward_name(fn)} returned {values[outside[0]]:g} on prompt "
                              f"index {outside[0]}, outside its declared reward_bounds [{low:g}, {high:g}] "
                              "(group_early_stop rests on them): fix the function or its bounds")
        self.failures += len(outside)
        failed = set(outside)
        return [_Failed(0.0) if i in failed else v for i, v in enumerate(values)]

    def _call(self, index: int, fn: RewardFn, prompts, completions, columns, shared) -> list[float | None]:
        n = len(completions)
        try:
            return self._run(index, fn, list(prompts), list(completions), {**columns, **shared}, n)
        except CallTimedOut as timeout:
            if self.error_policy == "raise":
                raise RewardError(f"reward function {reward_name(fn)} {timeout} on a batch of {n} "
                                  f"completions") from None
            self.failures += n  # retrying one by one could hang n times
            return [_Failed(0.0)] * n
        except CallFailed as batch_error:  # find which sample fails, then apply the policy
            return self._one_by_one(index, fn, prompts, completions, columns, shared, batch_error)

    def _one_by_one(self, index, fn, prompts, completions, columns, shared,
                    batch_error) -> list[float | None]:
        values = []
        for i in range(len(completions)):
            one = {**{k: v[i:i + 1] for k, v in columns.items()}, **shared}
            try:
                values += self._run(index, fn, [prompts[i]], [completions[i]], one, 1)
            except CallFailed as err:
                if self.error_policy == "raise":
                    raise RewardError(f"reward function {reward_name(fn)} failed on prompt index {i} "
                                      f"({err})") from None
                self.failures += 1
                values.append(_Failed(0.0))
        if self.error_policy == "raise":  # every sample passes alone: the batch call is at fault
            raise RewardError(f"reward function {reward_name(fn)} failed on the batch "
                              f"({batch_error})") from None
        return values

    def _run(self, index, fn, prompts, completions, kwargs, expected) -> list[float | None]:
        if not runs_in_worker(fn):
            return _in_trainer(fn, prompts, completions, kwargs, expected)
        worker = self._worker or self._new_worker()  # none yet: a user function put in ``fns`` after building
        return worker.call(fn, index, (prompts, completions, kwargs, expected), self.user_timeout)

    def _finite(self, rewards: torch.Tensor, verifiable: list[bool],
                per_fn: list[list]) -> tuple[torch.Tensor, list[int]]:
        """Finite values can still sum past float32's range (1e308 * 10, or 3e38 + 3e38), or
        land where the group statistics overflow (1e38): an error naming the functions that
        contributed, never a silent inf / NaN reward or advantage. Returns the rewards and the
        samples refused (0 under the 'zero' policy)."""
        bad = [i for i, v in enumerate(verifiable) if v and not abs(rewards[i]) <= REWARD_LIMIT]
        if not bad:
            return rewards, bad
        if self.error_policy == "raise":
            names = [reward_name(fn) for fn, values in zip(self.fns, per_fn) if values[bad[0]] is not None]
            raise RewardError(f"reward function{'s' * (len(names) > 1)} {', '.join(names)}: the weighted sum "
                              f"is {rewards[bad[0]].item():.3g} on prompt index {bad[0]} (beyond "
                              f"+/-{REWARD_LIMIT:g}: too large for float32 rewards and their group "
                              "statistics)")
        self.failures += len(bad)
        rewards[bad] = 0.0
        return rewards, bad


def declared_bounds(fn: RewardFn) -> tuple[float, float] | None:
    """``fn``'s declared [low, high] (``reward_bounds``), checked; None where it declares none."""
    declared = getattr(fn, "reward_bounds", None)
    return None if declared is None else checked_bounds(declared, f"reward function {reward_name(fn)}")


def _in_trainer(fn, prompts, completions, kwargs, expected) -> list[float | None]:
    try:
        return checked_values(fn, fn(prompts=prompts, completions=completions, **kwargs), expected)
    except (Exception, SystemExit) as err:
        raise CallFailed(error_line(err)) from err
    except KeyboardInterrupt as err:  # a signal's goes on; one the function raised itself is its failure
        if not interrupts.raised_by_code(err):
            raise
        raise CallFailed(f"{error_line(err)} (raised by the function, no signal was sent)") from err



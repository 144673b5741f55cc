"""A weighted sum of reward functions with a policy for functions that raise, hang or
return malformed values.

None or NaN from a function means "not applicable to this sample" (TRL's convention):
the weighted sum skips it, like TRL's ``torch.nansum(rewards_per_func * weights, dim=1)``,
and a sample no function applies to is NaN (unverifiable). +/-inf is an error.
"""

from __future__ import annotations

import concurrent.futures
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch


RewardFn = Callable[..., list]


class RewardError(RuntimeError):
    """A reward function failed under the ``raise`` policy."""


@dataclass
class RewardStack:
    """Weighted sum of reward functions with an error policy.

    ``error_policy="raise"``: a function that raises, hangs past ``timeout`` seconds or
    returns a malformed value stops the run with its name and the failing prompt index.
    ``"zero"``: the failing samples score 0 from that function and are counted in
    ``failures`` (logged in metrics as ``reward_failures``).
    """

    fns: list[RewardFn]
    weights: list[float]
    error_policy: str = "raise"
    timeout: float = 0.0
    failures: int = field(default=0, init=False)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, list],
                 shared: dict[str, Any] | None = None) -> torch.Tensor:
        """Rewards ``[N = len(completions)]``; NaN where every function returned None / NaN.

        ``columns``: keyword arguments with one value per completion (``completion_ids``, the
        dataset columns), each [N]; ``shared``: keyword arguments passed as they are
        (``trainer_state``, ``log_extra``, ``log_metric``).
        """
        total = torch.zeros(len(completions), dtype=torch.float64)
        verifiable = torch.zeros(len(completions), dtype=torch.bool)
        for fn, weight in zip(self.fns, self.weights):
            for i, value in enumerate(self._call(fn, prompts, completions, columns, shared or {})):
                if value is not None:
                    total[i] += weight * value
                    verifiable[i] = True
        total[~verifiable] = float("nan")
        return total.float()

    def bounds(self) -> tuple[float, float] | None:
        """[low, high] of the weighted sum when every function declares its ``reward_bounds``,
        else None. A term can also be 0 (a function skipping a sample, or failing under the
        'zero' policy), so each term's interval is widened to include 0."""
        low = high = 0.0
        for fn, weight in zip(self.fns, self.weights):
            declared = getattr(fn, "reward_bounds", None)
            if declared is None:
                return None
            terms = (weight * declared[0], weight * declared[1], 0.0)
            low, high = low + min(terms), high + max(terms)
        return low, high

    def _call(self, fn: RewardFn, prompts, completions, columns, shared) -> list[float | None]:
        try:
            return _checked(fn, self._run(fn, list(prompts), list(completions), {**columns, **shared}),
                            len(completions))
        except concurrent.futures.TimeoutError:
            if self.error_policy == "raise":
                raise RewardError(f"reward function {_name(fn)} timed out after {self.timeout}s "
                                  f"on a batch of {len(completions)} completions") from None
            self.failures += len(completions)  # retrying one by one could hang N times
            return [0.0] * len(completions)
        except Exception as batch_error:  # find which sample fails, then apply the policy
            values = []
            for i in range(len(completions)):
                one = {**{k: v[i:i + 1] for k, v in columns.items()}, **shared}
                try:
                    values += _checked(fn, self._run(fn, [prompts[i]], [completions[i]], one), 1)
                except Exception as err:
                    if self.error_policy == "raise":
                        raise RewardError(f"reward function {_name(fn)} failed on prompt index {i} "
                                          f"({type(err).__name__}: {err})") from err
                    self.failures += 1
                    values.append(0.0)
            if self.error_policy == "raise":  # every sample passes alone: the batch call is at fault
                raise RewardError(f"reward function {_name(fn)} failed on the batch: {batch_error}") from batch_error
            return values

    def _run(self, fn, prompts, completions, columns):
        if not self.timeout:
            return fn(prompts=prompts, completions=completions, **columns)
        # A thread, not SIGALRM: the math grader uses signals itself. A hung function's
        # thread cannot be killed; it is abandoned (daemon) and the policy applies.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            return pool.submit(fn, prompts=prompts, completions=completions, **columns).result(self.timeout)
        finally:
            pool.shutdown(wait=False)


def _name(fn) -> str:
    return getattr(fn, "__name__", repr(fn))


def _checked(fn, values, expected: int) -> list[float | None]:
    """Reject wrong lengths and infinite values, naming the function; NaN becomes None
    (not applicable), as TRL treats them alike."""
    values = list(values) if values is not None else []
    if len(values) != expected:
        raise ValueError(f"reward function {_name(fn)} returned {len(values)} values for {expected} completions")
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        v = float(v)
        if math.isinf(v):
            raise ValueError(f"reward function {_name(fn)} returned {v!r}")
        out.append(None if math.isnan(v) else v)
    return out

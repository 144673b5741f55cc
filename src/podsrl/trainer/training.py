"""``train(cfg)``: set the run up from its config (:mod:`podsrl.trainer.setup`), then run its
steps (:mod:`podsrl.trainer.loop`), stopping cleanly on SIGINT / SIGTERM."""

from __future__ import annotations

from typing import Sequence

from podsrl.interrupts import StopNow
from podsrl.rewards import RewardFn
from podsrl.trainer.config import Config
from podsrl.trainer.loop import run_steps
from podsrl.trainer.run import RunResult
from podsrl.trainer.setup import set_up
from podsrl.trainer.stops import Signals


def train(cfg: Config, reward_funcs: Sequence[RewardFn | str] | None = None) -> RunResult:
    """Train with ``cfg``; stops cleanly (with a checkpoint) on SIGINT / SIGTERM.

    ``reward_funcs``: reward functions as Python callables (TRL's signature), replacing the
    task's reward like the config's ``reward_funcs`` names do (not both); weighted by the
    config's ``reward_weights``. A run that finished but learned nothing (no reward applied,
    or every step skipped) returns with ``RunResult.failure`` saying why (``podsrl train``
    exits 1 then)."""
    with Signals() as signals:
        try:
            run = set_up(cfg, reward_funcs)
        except StopNow as interrupted:
            raise signals.during_set_up(interrupted) from None
        stops = run.stops(signals)
        try:
            return run_steps(run, stops)
        except StopNow as interrupted:  # outside a step: evaluating, logging, writing a checkpoint
            raise stops.outside_step(interrupted) from None
        finally:
            run.release()

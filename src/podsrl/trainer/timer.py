"""Wall-clock seconds per stage of a step (``generate``, ``reward``, ``select``, ...)."""

from __future__ import annotations

import time
from contextlib import contextmanager


class StageTimer:
    """Wall-clock seconds per named stage of one step: ``with timer("generate"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

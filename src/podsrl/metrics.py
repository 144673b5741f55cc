"""A run's metrics.jsonl: one JSON record per step, appended and flushed as written; NaN
and inf are written as null. Read by the trainer (on resume), ``podsrl plot`` /
``compare`` and the benchmarks."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _clean(value):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Append-only ``metrics.jsonl``, one record per step, flushed as written."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        partial = self.path.with_suffix(".jsonl.partial")  # replaced in one step: a crash keeps the old log
        partial.write_text("".join(line + "\n" for line in kept))
        partial.replace(self.path)

    def write(self, record: dict) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

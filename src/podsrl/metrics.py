"""A run's metrics.jsonl: one JSON record per step, appended and flushed as written (and
fsync'ed before each checkpoint: :meth:`MetricsLog.sync`); NaN and inf are written as null.
Read by the trainer (on resume), ``podsrl plot`` / ``compare`` and the benchmarks.
rollouts.jsonl (a sample of each step's rollouts, one record per rollout) is the same kind
of log."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path


def _clean(value):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """An append-only JSONL log of records with a ``step`` (``metrics.jsonl``: one per step),
    flushed as written."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone)."""
        if not self.path.exists():
            return
        kept = [json.dumps(r) for r in read_metrics(self.path) if r["step"] <= step]
        partial = self.path.with_suffix(".jsonl.partial")  # replaced in one step: a crash keeps the old log
        partial.write_text("".join(line + "\n" for line in kept))
        partial.replace(self.path)

    def sync(self) -> None:
        """Force what was written onto the disk. Called before a checkpoint: a crash right
        after it must not lose records the checkpoint counts as done, since a resume
        continues after the checkpoint's step and would leave a permanent gap."""
        if not self.path.exists():
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write(self, record: dict) -> None:
        self.write_many([record])

    def write_many(self, records: list[dict]) -> None:
        """Append ``records``; a write that fails (a full disk) is cut back off, so the log
        still ends at its last complete record, and raised as one line naming the file."""
        size = self.path.stat().st_size if self.path.exists() else 0
        try:
            with self.path.open("a") as fh:
                fh.write("".join(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n" for r in records))
        except OSError as err:
            with contextlib.suppress(OSError):  # truncating frees space: it works on a full disk
                os.truncate(self.path, size)
            raise OSError(f"{self.path.stem}: could not append to {self.path} ({type(err).__name__}: {err}); "
                          "cut back to its last complete record") from None


def read_metrics(path: Path) -> list[dict]:
    """The records of a JSONL log. A cut-off last line (a crash mid-write) is dropped with a
    warning naming the file and line; a bad line before the last is corruption: an error
    naming them."""
    raw = Path(path).read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:  # podsrl writes ASCII: damage, not a cut-off record
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not valid UTF-8 "
                         f"(byte {raw[err.start:err.start + 1]!r})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        except ValueError as err:
            if number == len(lines):
                print(f"warning: {path}, line {number}: cut off ({err}); dropped (a run stopped mid-write)",
                      file=sys.stderr)
                break
            raise ValueError(f"{path}, line {number}: not a JSON record ({err})") from None
        records.append(record)
    return records

"""Experiment trackers (TensorBoard, Weights & Biases, Trackio) beside metrics.jsonl.

A thin wrapper over accelerate's tracker classes (``accelerate.tracking``): podsrl starts
them itself, on the main process only, rather than through ``Accelerator(log_with=...)``,
because a one-process run creates no Accelerator (see :mod:`podsrl.distributed`). What
the wrapper adds: ``report_to`` parsed as TRL parses it, a clear error when a tracker's
package is missing, TensorBoard and W&B writing under the run directory (trackio into its
own store), W&B offline without an API key, TensorBoard hiding the steps a resumed run
redoes, and rollout tables (text in TensorBoard). Nothing here reads the run config: the
trainer passes plain values.
"""

from __future__ import annotations

import contextlib
import json
import math
import netrc
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from accelerate import PartialState
from accelerate.tracking import GeneralTracker, TensorBoardTracker, TrackioTracker, WandBTracker
from accelerate.utils import is_tensorboard_available, is_trackio_available, is_wandb_available


@dataclass(frozen=True)
class TrackerKind:
    installed: Callable[[], bool]  # accelerate's check: the package can be imported
    package: str  # what pip installs


TRACKERS = {"tensorboard": TrackerKind(is_tensorboard_available, "tensorboard"),
            "wandb": TrackerKind(is_wandb_available, "wandb"),
            "trackio": TrackerKind(is_trackio_available, "trackio")}


def _install_hint(name: str) -> str:
    package = TRACKERS[name].package
    return f"pip install '.[{name}]' in a podsrl clone (or pip install {package})"


def _asked(report_to: str) -> list[str]:
    """The names in ``report_to`` (comma-separated, case-insensitive), checked but not for installation."""
    asked = [part.strip().lower() for part in report_to.split(",") if part.strip()]
    if len(asked) > 1 and {"none", "all"} & set(asked):
        raise ValueError(f"report_to: 'none' and 'all' stand alone, got {report_to!r}")
    for name in asked:
        if name not in TRACKERS and name not in ("none", "all"):
            raise ValueError(f"report_to: unknown tracker {name!r}; known: none, all, {', '.join(TRACKERS)}")
    return asked


def missing_trackers(report_to: str) -> list[str]:
    """The trackers ``report_to`` names explicitly whose package is not installed."""
    return [name for name in _asked(report_to) if name in TRACKERS and not TRACKERS[name].installed()]


def tracker_names(report_to: str) -> list[str]:
    """The trackers ``report_to`` asks for: [] for 'none' (or ''), every installed one for
    'all' (as TRL's report_to), else the listed ones, each of which must be installed.
    Errors name the field and the pip command, before any work starts."""
    asked = _asked(report_to)
    if asked in ([], ["none"]):
        return []
    if asked == ["all"]:
        installed = [name for name, kind in TRACKERS.items() if kind.installed()]
        if not installed:
            raise ValueError(f"report_to: 'all', but none of {', '.join(TRACKERS)} is installed; "
                             f"e.g. {_install_hint('tensorboard')}")
        return installed
    for name in missing_trackers(report_to):
        raise ValueError(f"report_to: {name!r} needs the {TRACKERS[name].package} package, which is not "
                         f"installed: {_install_hint(name)}")
    return list(dict.fromkeys(asked))  # repeats dropped, order kept


def numeric_fields(record: dict) -> dict[str, float | int]:
    """The values trackers plot: every finite number of a metrics record but its step
    (the x axis); null-in-JSON values (NaN: not measured) are left out, booleans become 0/1."""
    return {key: int(value) if isinstance(value, bool) else value for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value)}


def _has_wandb_credentials() -> bool:
    """An API key in the environment or in ~/.netrc (where `wandb login` writes it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        hosts = netrc.netrc(os.environ.get("NETRC")).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    return any("wandb" in host for host in hosts)


def wandb_mode() -> str | None:
    """WANDB_MODE when set (None lets wandb read it); else online with credentials, offline
    without them (no prompt for a key, no network)."""
    if os.environ.get("WANDB_MODE"):
        return None
    return "online" if _has_wandb_credentials() else "offline"


def _start_tensorboard(log_dir: Path, run_name: str, first_step: int) -> GeneralTracker:
    # purge_step: TensorBoard hides events from first_step on written before a resume (they are redone)
    return TensorBoardTracker("tensorboard", log_dir, purge_step=first_step)


def _start_wandb(log_dir: Path, run_name: str, first_step: int) -> GeneralTracker:
    mode = wandb_mode()
    if mode == "offline":
        print(f"report_to wandb: no W&B API key (WANDB_API_KEY or `wandb login`): logging offline to "
              f"{log_dir}/wandb; upload later with `wandb sync`", file=sys.stderr, flush=True)
    return WandBTracker(os.environ.get("WANDB_PROJECT", "podsrl"), name=run_name, dir=str(log_dir), mode=mode)


def _start_trackio(log_dir: Path, run_name: str, first_step: int) -> GeneralTracker:
    # trackio keeps one store per process (TRACKIO_DIR, read when trackio is first imported;
    # default ~/.cache/huggingface/trackio), so it cannot follow each run's folder: runs are
    # told apart by name in the project's database
    return TrackioTracker(os.environ.get("TRACKIO_PROJECT", "podsrl"), name=run_name)


STARTERS = {"tensorboard": _start_tensorboard, "wandb": _start_wandb, "trackio": _start_trackio}


def markdown_table(columns: list[str], rows: list[list]) -> str:
    """Rows as a Markdown table (TensorBoard renders text summaries as Markdown)."""
    def cell(value) -> str:
        return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def _tensorboard_table(tracker, name: str, columns: list[str], rows: list[list], step: int) -> None:
    tracker.log({name: markdown_table(columns, rows)}, step=step)  # add_text


def _wandb_table(tracker, name: str, columns: list[str], rows: list[list], step: int) -> None:
    tracker.log_table(name, columns=columns, data=rows, step=step)


def _trackio_table(tracker, name: str, columns: list[str], rows: list[list], step: int) -> None:
    import trackio

    tracker.log({name: trackio.Table(columns=columns, data=rows)}, step=step)


TABLE_WRITERS = {"tensorboard": _tensorboard_table, "wandb": _wandb_table, "trackio": _trackio_table}


class Trackers:
    """The run's trackers: none with report_to 'none' and on every process but the main one."""

    def __init__(self, names: list[str], log_dir: Path, run_name: str) -> None:
        self.names, self.log_dir, self.run_name = names, log_dir, run_name
        self.running: list[GeneralTracker] = []

    def start(self, hyperparameters: dict, first_step: int) -> None:
        """Start each tracker and record the run config; ``first_step`` is the first step this
        session logs (0, or the checkpoint's step + 1 on resume). A value that is no number,
        text or true/false (a component's mapping with its arguments) is recorded as its JSON
        text: TensorBoard's hyperparameters take nothing else."""
        if not self.names:
            return
        hyperparameters = {key: value if value is None or isinstance(value, (bool, int, float, str))
                           else json.dumps(value, sort_keys=True) for key, value in hyperparameters.items()}
        # accelerate's trackers log through its logging utility, which needs its process state:
        # made by the Accelerator under a launcher; in one process it forms no process group
        PartialState()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            tracker = STARTERS[name](self.log_dir, self.run_name, first_step)
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries podsrl's results
                tracker.start()
            tracker.store_init_configuration(hyperparameters)
            self.running.append(tracker)

    def log_metrics(self, record: dict) -> None:
        """A metrics.jsonl record's numbers, at its step."""
        values = numeric_fields(record)
        for tracker in self.running:
            tracker.log(values, step=record["step"])

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        """Rows (dicts with the same keys) as a table; TensorBoard shows it as text."""
        if not rows:
            return
        columns = list(rows[0])
        data = [[row[c] for c in columns] for row in rows]
        for tracker in self.running:
            TABLE_WRITERS[tracker.name](tracker, name, columns, data, step)

    def finish(self) -> None:
        """Flush and close every tracker (safe to call twice)."""
        running, self.running = self.running, []
        for tracker in running:
            with contextlib.redirect_stdout(sys.stderr):
                tracker.finish()

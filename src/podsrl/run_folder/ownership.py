"""What podsrl may remove: proofs, by a file's content (never its name alone), that podsrl
wrote it.

podsrl removes files in two places outside its checkpoint rotation: a run that stopped
before its first checkpoint, started afresh in its folder (:func:`stopped_run_files`), and an
earlier export replaced by ``podsrl export --overwrite`` (:func:`unproven_exported`). A file
there is podsrl's only if its content is what podsrl writes under that name: a user's notes
saved as ``rollouts.jsonl`` or a W&B run folder are kept, and so is anything not provable. A
file podsrl wrote may be cut off by a crash or a full disk (a prefix of what it wrote, or NUL
bytes where a crash lost the data): that is still podsrl's, so the folder stays usable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Callable

from podsrl.trainer.checkpoints import OPTIMIZER_FILE, PARTS_FILE, STATE_FILE, WEIGHTS_FILE
from podsrl.trainer.config import Config

LOCK_FILE = ".podsrl.lock"
CONFIG_HEAD = f'{{\n  "{dataclasses.fields(Config)[0].name}": '  # how every config.json podsrl writes begins
LOG_HEAD = '{"step": '  # how every record of metrics.jsonl and rollouts.jsonl begins
LOCK_LINE = re.compile(r"pid \d+ on .+, started \S+\n?")  # RunLock's holder line
# provenance.record_environment()'s keys (older podsrl wrote fewer) and setup._write_run_files's data.json
# keys: a key added there goes here too, or a stopped run's folder is refused (the fresh-start tests say so)
ENVIRONMENT_KEYS = frozenset({"date", "unix_time", "commit", "machine", "python", "torch", "torch_threads",
                              "transformers", "podsrl", "argv", "eos_token_id", "eos_token"})
DATA_KEYS = frozenset({"task", "train_prompts", "test_prompts", "dropped_train_prompts",
                       "dropped_test_prompts", "system_prompt", "example_prompt", "processes"})
PARTIAL_CHECKPOINT = re.compile(r"step_\d{7,}\.tmp")  # a checkpoint cut off while being written
TRACKING = "tracking"  # the trackers' folder: their files, never podsrl's to remove


# --- what podsrl writes, by name --------------------------------------------------------------
def _cut_off(text: str, head: str) -> bool:
    """Empty, or beginning as podsrl's file of this kind begins (what a crash leaves of it)."""
    return text[:len(head)] == head[:len(text)]


def _json_file(head: str, valid: Callable[[object], bool]) -> Callable[[str], bool]:
    """A JSON file podsrl writes whole: ``valid`` when it parses, else cut off (NUL-padded) at ``head``."""
    def proof(text: str) -> bool:
        try:
            return valid(json.loads(text))
        except ValueError:
            return _cut_off(text.rstrip("\0"), head)
    return proof


def _log(text: str) -> bool:
    """JSON records of podsrl's shape (each a step's), one a line; the last may be cut off or NULs."""
    *complete, last = text.split("\n")
    for line in complete:
        try:
            record = json.loads(line)
        except ValueError:
            return False
        if not (line.startswith(LOG_HEAD) and isinstance(record, dict)
                and isinstance(record.get("step"), int)):
            return False
    return _cut_off(last.rstrip("\0"), LOG_HEAD)


def _keys(saved: object, required: set[str], known: frozenset[str]) -> bool:
    return isinstance(saved, dict) and required <= saved.keys() <= known


PROOFS: dict[str, Callable[[str], bool]] = {
    LOCK_FILE: lambda text: not text.strip("\0") or bool(LOCK_LINE.fullmatch(text)),
    "config.json": _json_file(CONFIG_HEAD, lambda saved: isinstance(saved, dict) and "method" in saved
                              and "model_type" not in saved),
    "environment.json": _json_file("[\n  {\n    \"date\": ", lambda saved: isinstance(saved, list) and all(
        _keys(entry, {"date", "commit"}, ENVIRONMENT_KEYS) for entry in saved)),
    "data.json": _json_file('{\n  "task": ',
                            lambda saved: _keys(saved, {"task", "train_prompts"}, DATA_KEYS)),
    "metrics.jsonl": _log,
    "rollouts.jsonl": _log,
    STATE_FILE: _json_file('{\n  "step": ', lambda saved: isinstance(saved, dict) and "step" in saved),
}
START_FILES = (LOCK_FILE, "environment.json", "data.json", "metrics.jsonl", "rollouts.jsonl", "config.json")


def _torch_archive(path: Path) -> bool:
    """``torch.save``'s zip archive written to ``path`` (maybe cut off), whose first entry,
    ``STEM/data.pkl``, names it; or NUL bytes only, where a crash lost it. Only its head is read
    (an optimizer state can be many GB)."""
    name = f"{path.stem}/data.pkl".encode()
    with path.open("rb") as fh:
        head = fh.read(30 + len(name))
        if not head.strip(b"\0"):
            return not any(chunk.strip(b"\0") for chunk in iter(lambda: fh.read(1 << 20), b""))
    fixed = {0: b"PK\x03\x04", 26: len(name).to_bytes(2, "little"), 30: name}  # zip local header fields
    return all(head[at:at + len(part)] == part[:max(0, len(head) - at)] for at, part in fixed.items())


def is_podsrls(path: Path) -> bool:
    """``path`` is a plain file (not a link) whose content is what podsrl writes under its name."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        if path.name in (WEIGHTS_FILE, OPTIMIZER_FILE, PARTS_FILE):
            return _torch_archive(path)
        proof = PROOFS.get(path.name)
        return proof is not None and proof(path.read_bytes().decode())
    except (OSError, UnicodeDecodeError):
        return False


# --- a run that stopped before its first checkpoint --------------------------------------------
def _folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _other_names(run_dir: Path) -> list[str]:
    """What in a run folder podsrl does not write before a run's first checkpoint, by name
    (a user's file, a checkpoint, model/, summary.json ...): cheap, nothing is read."""
    others = []
    for entry in run_dir.iterdir():
        if entry.name == "checkpoints" and _folder(entry):
            others += [f"{entry.name}/{p.name}" for p in entry.iterdir()
                       if not (PARTIAL_CHECKPOINT.fullmatch(p.name) and _folder(p))]
        elif not (entry.name in START_FILES or entry.name == TRACKING and _folder(entry)):
            others.append(entry.name)
    return sorted(others)


def stopped_run_files(run_dir: Path) -> tuple[list[Path], list[str]]:
    """What podsrl wrote in the folder of a run that stopped before its first checkpoint,
    proven by content, in the order to remove them (each step_N.tmp after its files,
    config.json last: a clearing cut short still leaves a stopped run), and the names of
    everything else. tracking/ is neither: the trackers' folder stays, whatever it holds."""
    others = _other_names(run_dir)
    if others:  # a finished run, a checkpoint, a user's file: no need to read anything
        return [], others
    ours: list[Path] = []
    checkpoints = run_dir / "checkpoints"
    for folder in sorted(checkpoints.iterdir()) if _folder(checkpoints) else ():
        files = sorted(folder.iterdir())
        strangers = [f"{checkpoints.name}/{folder.name}/{p.name}" for p in files
                     if p.name not in (WEIGHTS_FILE, OPTIMIZER_FILE, PARTS_FILE, STATE_FILE)
                     or not is_podsrls(p)]
        others += strangers
        ours += [*files, folder]
    ours += [checkpoints] if _folder(checkpoints) else []
    for name in START_FILES:  # config.json last
        path = run_dir / name
        if path.exists() or path.is_symlink():
            if not is_podsrls(path):
                others.append(name)
            elif name != LOCK_FILE:  # the lock stays: it is this run's now
                ours.append(path)
    return ours, others


# --- an earlier export ----------------------------------------------------------------------
def digest(path: Path) -> str:
    """sha256 of a file's content, read in chunks (weights can be many GB)."""
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def digests(folder: Path) -> dict[str, str]:
    """The digest of each plain file in ``folder``, by name: what an export records of what it wrote."""
    return {p.name: digest(p) for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def unproven_exported(folder: Path, recorded: dict[str, str], marker: str) -> list[str]:
    """The entries of an earlier export's ``folder`` that are not provably the export's: any
    but plain files whose digest is the one ``recorded``; ``marker`` is the export's when it
    recorded digests (it cannot hold its own)."""
    def proven(path: Path) -> bool:
        if path.is_symlink() or not path.is_file():
            return False
        if path.name == marker:
            return bool(recorded)
        return path.name in recorded and digest(path) == recorded[path.name]

    return sorted(p.name for p in folder.iterdir() if not proven(p))

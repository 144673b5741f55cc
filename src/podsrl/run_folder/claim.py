"""A run folder belongs to one run: which folders a run may write into, the lock a run holds
on its folder for its whole life, and resume's check that the config still describes the
checkpoint.

podsrl never writes into a folder it did not make for a run: a model folder, a file, the
current directory's files or another run are refused before anything loads
(docs/reliability.md, "Output folders"). The one exception is podsrl's own: a run that
stopped before its first checkpoint has nothing to resume, so the same command starts it
afresh there, removing only the files podsrl can prove by their content it wrote
(:mod:`podsrl.run_folder.ownership`) and keeping the trackers' folder. ``--resume auto`` (verl's
``resume_mode: auto``, for job scripts that always pass it) resumes where the folder holds a
checkpoint and is ``--resume false`` everywhere else, its refusals included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

from podsrl.config_layouts import current_layout
from podsrl.distributed import Processes
from podsrl.run_folder.ownership import LOCK_FILE, TRACKING, is_podsrls, stopped_run_files
from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.trainer.config import BOOKKEEPING_FIELDS, RESUME_AUTO, Config
from podsrl.trainer.logging import say

MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
               "adapter_config.json", "adapter_model.safetensors", "tokenizer.json")

# Fields a resume may change: when and how the run is logged, checkpointed and stopped, not
# what it trains (docs/reliability.md lists them). Changing any other field would make the
# resumed run something the checkpoint was not written for.
RESUME_SAFE_FIELDS = BOOKKEEPING_FIELDS | {"max_steps", "max_minutes", "eval_steps", "max_consecutive_skips",
                                           "reward_timeout"}


class RunDirError(ValueError):
    """The output folder cannot hold this run (one line: what was found and what to do)."""


class RunExistsError(RunDirError, FileExistsError):
    """The output folder holds a run already (a FileExistsError too, as it always was)."""


def is_run_folder(path: Path) -> bool:
    """A podsrl run: its metrics.jsonl and a config.json that is podsrl's, not a model's."""
    config = path / "config.json"
    if not ((path / "metrics.jsonl").exists() and config.exists()):
        return False
    try:
        return "method" in json.loads(config.read_text())  # podsrl's config, not a model's
    except (ValueError, OSError):
        return False


def is_model_folder(path: Path) -> bool:
    """Weights, an adapter, a tokenizer, or a config.json with a model_type."""
    if any((path / name).exists() for name in MODEL_FILES):
        return True
    try:
        return "model_type" in json.loads((path / "config.json").read_text())
    except (ValueError, OSError):
        return False


def stopped_before_first_checkpoint(path: Path) -> bool:
    """A run folder holding only files podsrl wrote before a run's first checkpoint, proven by
    their content (its config.json among them), besides the trackers' folder: so no checkpoint,
    no model/, no summary.json and nothing of anyone else's. The run has nothing to resume, so
    the same command may start it afresh there (:func:`clear_stopped_run`)."""
    return (path.is_dir() and is_podsrls(path / "config.json")
            and not stopped_run_files(path)[1])


def clear_stopped_run(path: Path) -> None:
    """Remove what a run that stopped before its first checkpoint wrote, each file proven
    podsrl's by its content (the caller holds the lock, so no live run is writing there).
    config.json goes last: a clearing cut short still leaves a folder that
    :func:`stopped_before_first_checkpoint` recognises. tracking/ stays as it is."""
    files, others = stopped_run_files(path)
    if others:  # checked before the lock; proven again right before anything is removed
        raise _stopped_run_refusal(path, others)
    try:
        for file in files:
            if file.is_dir():
                file.rmdir()  # only once emptied of podsrl's files
            else:
                file.unlink()
    except OSError as err:
        raise RunDirError(f"output_dir: could not clear the stopped run in {path} ({err}); remove its files "
                          "by hand or choose another --output_dir") from None


def fresh_start_line(path: Path, field: str = "output_dir") -> str:
    """What the user is told when a stopped run starts afresh in ``path`` (``field``: the
    setting that decided it, ``resume auto`` where that did)."""
    kept = (f"; its trackers' folder {TRACKING}/ stays as it is (the new run's trackers write beside it)"
            if (path / TRACKING).is_dir() else "")
    return (f"{field}: {path} holds a run that stopped before its first checkpoint (nothing to resume); "
            f"starting it afresh{kept}")


def resumes(output_dir: str, resume: bool | str) -> bool:
    """Whether the run resumes: ``resume`` as given, and for ``auto`` whether ``output_dir``
    holds a checkpoint. With none, ``auto`` is ``false``: a new or empty folder, or a run that
    stopped before its first checkpoint, starts afresh; anything else is refused as ``false``
    refuses it (a user's files, a model, a run whose checkpoints are gone)."""
    if resume != RESUME_AUTO:
        return bool(resume)
    return bool(list_checkpoints(Path(output_dir).expanduser() / "checkpoints"))


def auto_line(path: Path, resume: bool, cleared: bool) -> str:
    """The one line that says what ``--resume auto`` did in ``path``."""
    if resume:
        return f"resume auto: {path} holds a checkpoint; resuming the run from the newest that loads"
    if cleared:
        return fresh_start_line(path, f"resume {RESUME_AUTO}")
    return f"resume auto: {path} holds no run yet (nothing to resume); starting a new run there"


def _check_config_readable(path: Path, field: str) -> None:
    """A run with checkpoints whose config.json is unreadable: resume checks the config against
    that file, so podsrl neither guesses it nor treats the folder as foreign; say what to do."""
    config = path / "config.json"
    if not (config.is_file() and list_checkpoints(path / "checkpoints")):
        return
    try:
        json.loads(config.read_text())
    except (ValueError, OSError) as err:
        raise RunDirError(f"{field}: {config} is unreadable ({type(err).__name__}: {err}) and the run has "
                          f"checkpoints; resume checks the config against it: restore it from a backup (the "
                          f"command of each start is in environment.json), or start a new run in another "
                          f"--output_dir") from None


def _stopped_run_refusal(path: Path, others: list[str]) -> RunExistsError:
    return RunExistsError(f"output_dir: {path} holds a run that stopped before its first checkpoint and "
                          f"files podsrl did not write ({_shown(others)}); podsrl removes only its own "
                          "files: move those out to start the run afresh there, or choose another "
                          "--output_dir")


def _refuse_a_stopped_run_with_other_files(path: Path) -> None:
    """A run that stopped before its first checkpoint beside files podsrl cannot prove by their
    content it wrote: podsrl deletes only its own files, so it cannot start afresh there; say
    which files are in the way."""
    if not (is_run_folder(path) and not list_checkpoints(path / "checkpoints")):
        return
    others = stopped_run_files(path)[1]
    if others and not {"model", "summary.json"} & set(others):  # a finished run is a run, as ever
        raise _stopped_run_refusal(path, others)


def check_output_dir(output_dir: str, resume: bool) -> Path:
    """The run folder for ``output_dir``, or :class:`RunDirError` when it cannot be one. A
    run that stopped before its first checkpoint is accepted for a new start (the caller
    clears it under the lock) and refused for a resume, saying how to start it afresh."""
    if not str(output_dir).strip():
        raise RunDirError("output_dir: empty; name a folder for the run, e.g. --output_dir runs/my-run")
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise RunDirError(f"output_dir: {path} is a file, not a folder; choose another --output_dir")
    stopped = stopped_before_first_checkpoint(path)
    if resume and stopped:
        raise RunDirError(f"resume: {path} holds a run that stopped before its first checkpoint, so there is "
                          f"nothing to resume; run the same command without --resume true to start it afresh "
                          f"(podsrl reuses the folder)")
    if stopped:
        return path
    _check_config_readable(path, "resume" if resume else "output_dir")
    if resume:
        if not is_run_folder(path):
            others = _other_files(path)
            # advice that works: a folder with others' files takes no new run either
            way_on = (f"it holds {_shown(others)}, so no new run starts there either: name the run's folder, "
                      "or start a new run in another --output_dir" if others else
                      "drop --resume to start a new run there, or name the run's folder")
            raise RunDirError(f"resume: {path} holds no podsrl run to resume (no metrics.jsonl and "
                              f"config.json); {way_on}")
        return path
    _refuse_a_stopped_run_with_other_files(path)
    if is_run_folder(path):
        raise RunExistsError(f"output_dir: {path} already holds a run; pass --resume true to continue it or "
                          f"choose another --output_dir")
    if path.is_dir() and is_model_folder(path):
        raise RunDirError(f"output_dir: {path} holds a model (config.json / weights / tokenizer), not a run; "
                          f"podsrl never writes into a model folder: choose another --output_dir")
    others = _other_files(path)
    if others:
        raise RunDirError(f"output_dir: {path} is not empty (holds {_shown(others)}); a run starts in a new "
                          "or empty folder: choose another --output_dir")
    return path


def _other_files(path: Path) -> list[str]:
    """What a folder holds besides podsrl's own lock file (a folder that does not exist: nothing)."""
    return sorted(p.name for p in path.iterdir() if not (p.name == LOCK_FILE and is_podsrls(p))) \
        if path.is_dir() else []


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def check_resume_config(run_dir: Path, config: dict) -> list[str]:
    """Refuse a resume whose config differs from the run's config.json in a field that changes
    what the checkpoint means; return the safe fields that changed (they are allowed). A field
    the run's config.json lacks was added by a later podsrl: it had its default's meaning then; one
    an earlier podsrl spelled otherwise is compared in today's spelling."""
    defaults = {field.name: field.default for field in dataclasses.fields(Config)}
    saved = json.loads((run_dir / "config.json").read_text())
    # today's spelling of what an earlier podsrl wrote (podsrl.config_layouts)
    saved = current_layout(saved, {name: defaults[name] for name in config if name in defaults})[0]
    changed = sorted(name for name in set(saved) | set(config) if saved.get(name) != config.get(name))
    unsafe = [name for name in changed if name not in RESUME_SAFE_FIELDS]
    if unsafe:
        shown = "; ".join(f"{name}: run {saved.get(name)!r}, now {config.get(name)!r}" for name in unsafe[:6])
        more = f" and {len(unsafe) - 6} more" if len(unsafe) > 6 else ""
        raise RunDirError(f"resume: the config differs from {run_dir / 'config.json'} in {shown}{more}; "
                          "resume with the run's values (only "
                          f"{', '.join(sorted(RESUME_SAFE_FIELDS - {'resume'}))} may change), or start a new "
                          "run in another --output_dir")
    return [name for name in changed if name != "resume"]


class RunLock:
    """An exclusive lock on a run folder for the whole run (``flock`` on ``.podsrl.lock``).

    The kernel drops a flock when its process dies, however it dies, so a killed run never
    blocks the next one; the file keeps the holder's pid, host and start time while the run
    is alive and is emptied on a clean exit, so a lock file that still names a holder when
    the lock is free is the trace of a killed run: reported, then taken over.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_FILE
        self.created_dir = not run_dir.exists()
        self.stale_holder = ""  # who held the lock when it was taken over ("" = nobody)
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirError(f"output_dir: {self.run_dir} is in use by another run ({holder}); wait for it "
                              "to finish or choose another --output_dir") from None
        self.stale_holder = os.read(fd, 4096).decode(errors="replace").strip()
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode(), 0)
        self._fd = fd
        return self

    @staticmethod
    def holder(run_dir: Path) -> str:
        """Who holds ``run_dir``'s lock now (its pid, host and start), '' when no live run does."""
        try:
            fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
        except OSError:
            return ""
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _holder(fd)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return ""
        finally:
            os.close(fd)

    def release(self) -> None:
        """Unlock; a folder this run created and left empty (it failed before writing) goes too."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # a clean exit: nothing stale left behind
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        if self.created_dir and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
            with contextlib.suppress(OSError):
                self.path.unlink()
                self.run_dir.rmdir()


def _holder(fd: int) -> str:
    """What a held lock file says of its holder (its pid, host and start)."""
    return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown holder"


def _agreed(procs: Processes, refusal: RunDirError | None) -> None:
    """Raise this process's refusal, or another process's, on every process, so none waits
    for the others."""
    others = [message for message in procs.gather_objects(str(refusal) if refusal else "") if message]
    if refusal:
        raise refusal
    if others:
        raise RunDirError(others[0])


def claim_run_dir(cfg: Config, procs: Processes) -> tuple[Path, RunLock | None, bool]:
    """Check that ``output_dir`` can hold this run and lock it (the main process holds the
    lock), before anything loads; on resume, check the config against the run's. Returns the
    folder, the lock and whether the run resumes (``resume auto`` decided)."""
    refusal, run_dir, lock = None, Path(cfg.output_dir), None
    resume = procs.gather_objects(resumes(cfg.output_dir, cfg.resume))[0]  # the main process's view, for all
    try:
        run_dir = check_output_dir(cfg.output_dir, resume)
        if resume:
            check_resume_config(run_dir, cfg.to_dict())
        if cfg.prompts_per_step % procs.world_size:
            raise RunDirError(f"prompts_per_step: {cfg.prompts_per_step} prompts cannot be split evenly over "
                              f"{procs.world_size} processes")
    except RunDirError as err:
        refusal = err
    _agreed(procs, refusal)  # every process has checked output_dir before the main one writes to it
    try:
        lock = _lock_and_recheck(cfg, run_dir, resume) if procs.is_main else None
    except RunDirError as err:
        refusal = err
    _agreed(procs, refusal)
    return run_dir, lock, resume


def _lock_and_recheck(cfg: Config, run_dir: Path, resume: bool) -> RunLock:
    """Lock the folder, then check it again: until the lock was ours another run could write
    there (a folder that looked like a stopped run may now hold its checkpoint). A run that
    stopped before its first checkpoint is cleared only now, when no live run writes there."""
    lock = RunLock(run_dir).acquire()
    try:
        if lock.stale_holder:
            say(f"output_dir: the lock of {run_dir} still names {lock.stale_holder}, which did not exit "
                "cleanly (killed?); that process is gone, so this run takes the folder over")
        check_output_dir(cfg.output_dir, resume)
        cleared = not resume and stopped_before_first_checkpoint(run_dir)
        if cleared:
            clear_stopped_run(run_dir)
        if cfg.resume == RESUME_AUTO:
            say(auto_line(run_dir, resume, cleared))
        elif cleared:
            say(fresh_start_line(run_dir))
    except BaseException:
        lock.release()
        raise
    return lock

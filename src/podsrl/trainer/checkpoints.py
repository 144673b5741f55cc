"""Checkpoints: trainable weights (full model or LoRA adapter), optimizer and scheduler,
the global RNG streams, the run's learned parts (:class:`podsrl.trainer.state.RunState`'s
``parts``, each process's: the prompt selector, the group-size policy, the engine, the
rules' RNG streams), the step counter and elapsed training time.

Writing is crash-safe: everything goes into ``step_XXXXXXX.tmp``, each file and the folder
are fsync'ed, the folder is renamed, and the parent directory is fsync'ed, so a crash or
power loss never leaves a folder that looks complete but is not; only the newest
``save_total_limit`` are kept.

When the run checkpoints (:class:`CheckpointOptions`, declared here only; the config composes
them) is :class:`CheckpointSchedule`'s.

Reading is all-or-nothing: every file is read (tensors and plain data only, never
arbitrary pickled objects) and checked against the model, optimizer, scheduler and RNG
streams it will go into before any of them is touched; if applying still fails, what was
already applied is rolled back. So a checkpoint that cannot be used leaves the run exactly
as it was, and the caller can try an older one or start from scratch.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import random
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError

from podsrl.options import NON_NEGATIVE, POSITIVE, Range, option
from podsrl.registry import error_line

STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "trainable.pt"
OPTIMIZER_FILE = "optimizer.pt"
PARTS_FILE = "parts.pt"  # the learned parts' states, one {name: state} per process, in rank order
# what writing weights raises on a full disk: OSError, torch.save's RuntimeError, safetensors' own error
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)
HELD_BACK_STATE = "held_back_step"  # trainer_state.json's key of a step waiting for its evaluation


@dataclass
class HeldBackStep:
    """A finished step whose evaluation a stop came before or cut short: its metrics record and
    rollout rows, not logged yet. Its checkpoint carries them (trainer_state.json); the resumed
    run evaluates the step first, then logs it, as an uninterrupted run had it."""

    record: dict
    rollouts: list[dict]

    def trainer_state(self) -> dict:
        return {HELD_BACK_STATE: {"record": self.record, "rollouts": self.rollouts}}

    @classmethod
    def saved_in(cls, saved: dict) -> HeldBackStep | None:
        """The held-back step of a loaded checkpoint (:func:`load_checkpoint`'s result), if any."""
        held = saved.get(HELD_BACK_STATE)
        return cls(held["record"], held["rollouts"]) if held else None


@dataclass(frozen=True)
class CheckpointOptions:
    """When the run checkpoints and how many it keeps (the config's fields of these names)."""

    save_steps: int = option(
        50, "Checkpoint every this many steps; 0 = off (TRL's field; a count, no fraction).", NON_NEGATIVE)
    checkpoint_minutes: float = option(
        0.0, "Also checkpoint after this many wall-clock minutes (0 = off).", Range(0, why="0 = off"))
    save_total_limit: int = option(
        2, "How many most recent checkpoints to keep (TRL's field; here >= 1).", POSITIVE)


@dataclass(frozen=True)
class Resume:
    """A resume: whether this run restores its newest usable checkpoint, how to name a learned
    part that does not fit (its component's label: prompt_selector "shuffled"), and the settings
    a resume may not change (the config's fields but run_dir.RESUME_SAFE_FIELDS)."""

    wanted: bool = False
    part_labels: dict[str, str] = field(default_factory=dict)
    keeps: frozenset[str] = frozenset()


class CheckpointSchedule:
    """When a checkpoint is due: every save_steps steps, and checkpoint_minutes of wall-clock
    time after the last one (on this process's clock: the processes agree before acting on it);
    and writing one, keeping the newest save_total_limit."""

    def __init__(self, options: CheckpointOptions) -> None:
        self.options = options
        self.last_time = time.time()

    def restart_clock(self) -> None:
        """A checkpoint was written (or the steps begin): the minutes count from now."""
        self.last_time = time.time()

    def due_by_steps(self, step: int) -> bool:
        return bool(self.options.save_steps and step % self.options.save_steps == 0)

    def due_by_time(self) -> bool:
        minutes = self.options.checkpoint_minutes
        return bool(minutes) and time.time() - self.last_time >= minutes * 60

    def save(self, directory: Path, **checkpoint) -> Path:
        """:func:`save_checkpoint` of ``checkpoint`` (its keyword arguments), keeping the newest
        save_total_limit."""
        return save_checkpoint(directory, save_total_limit=self.options.save_total_limit, **checkpoint)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


# --- the global RNG streams as tensors and plain numbers (loadable with weights_only=True) ----
def rng_state() -> dict:
    version, mt_state, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    return {"python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64),
                       "gauss": gauss},
            "numpy": {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                      "pos": int(numpy_state["state"]["pos"]), "has_gauss": int(numpy_state["has_gauss"]),
                      "gauss": float(numpy_state["gauss"])},
            "torch": torch.get_rng_state()}


def restore_rng(state: dict) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    numpy = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937",
                         "state": {"key": numpy["key"].numpy().astype(np.uint32), "pos": numpy["pos"]},
                         "has_gauss": numpy["has_gauss"], "gauss": numpy["gauss"]})
    torch.set_rng_state(state["torch"])


# --- writing ----------------------------------------------------------------------------------
def umask() -> int:
    """The process's umask (reading it means setting it: set back at once), for files written
    through a private staging file that must end with the permissions a plain write gives."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync(path: Path) -> None:
    """Flush a file or a folder (its entries, e.g. a rename) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: Path, *, step: int, weights: dict[str, torch.Tensor], optimizer_state: dict,
                    scheduler, trainer_state: dict, part_states: list[dict[str, dict]],
                    save_total_limit: int) -> Path:
    """Write one checkpoint, keeping the newest ``save_total_limit``. ``weights`` are the trainable
    parameters by name and ``optimizer_state`` the optimizer's state dict, both whole (not
    sharded); ``part_states`` every process's learned parts ({name: state}), in rank order;
    ``trainer_state`` plain data (the training time, a held-back step)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step:07d}"
    tmp = directory / f"step_{step:07d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        torch.save(weights, tmp / WEIGHTS_FILE)
        torch.save({"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rng_state()},
                   tmp / OPTIMIZER_FILE)
        torch.save(part_states, tmp / PARTS_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **trainer_state}, indent=2))
        for name in (WEIGHTS_FILE, OPTIMIZER_FILE, PARTS_FILE, STATE_FILE):
            fsync(tmp / name)
        fsync(tmp)
    except (OSError, RuntimeError) as err:  # a full disk: torch.save raises RuntimeError from its writer
        shutil.rmtree(tmp, ignore_errors=True)  # no partial folder left to fill the disk further
        needed = tensor_bytes([weights, optimizer_state, part_states])
        raise OSError(f"checkpoint: could not write {final} "
                      f"({error_line(err)}{write_cause(err, directory, needed)}); removed the partial "
                      "folder") from None
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    fsync(directory)  # the rename itself reaches the disk
    for old in list_checkpoints(directory)[:-save_total_limit]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def tensor_bytes(data) -> int:
    """Bytes of the tensors in ``data`` (nested dicts, lists and tuples): what writing it needs."""
    if isinstance(data, torch.Tensor):
        return data.nelement() * data.element_size()
    values = data.values() if isinstance(data, dict) else data if isinstance(data, (list, tuple)) else ()
    return sum(map(tensor_bytes, values))


def write_cause(err: BaseException, folder: Path, needed: int) -> str:
    """Why a write of ``needed`` bytes into ``folder`` failed, where ``err`` does not say it (torch.save
    reports a full disk as "unexpected pos"): ': no space left ...' or ': ... file size limit ...',
    else ''."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return ""  # its own message says it
    mib = 2 ** 20
    free = shutil.disk_usage(folder).free
    if free < needed:
        return (f": no space left on the device, {free / mib:.0f} MiB free, the checkpoint needs about "
                f"{needed / mib:.0f} MiB")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < needed:
        return (f": a file would pass this process's file size limit of {limit / mib:.1f} MiB (ulimit -f), "
                f"the checkpoint needs about {needed / mib:.0f} MiB")
    return ""


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")
             and (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


# --- reading ----------------------------------------------------------------------------------
def check_weights(path: Path, weights: dict, model) -> None:
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    wrong = sorted({name for name, value in weights.items()
                    if name not in params or not torch.is_tensor(value) or params[name].shape != value.shape}
                   | (set(params) - set(weights)))
    if wrong:
        raise ValueError(f"checkpoint {path}: its parameters do not match the model's trainable ones "
                         f"(e.g. {wrong[:3]}); was it written with another model or LoRA setting?")


def copy_weights(model, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` (checked by :func:`check_weights`) into the model's parameters."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)


def _check_optimizer(path: Path, state: dict, optimizer) -> None:
    groups = optimizer.param_groups
    saved_groups = state.get("param_groups", [])
    if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in groups]:
        raise ValueError(f"checkpoint {path}: optimizer state is for parameter groups of sizes "
                         f"{[len(g['params']) for g in saved_groups]}, this optimizer has "
                         f"{[len(g['params']) for g in groups]}")
    shapes = [p.shape for g in groups for p in g["params"]]
    for index, values in state.get("state", {}).items():
        for key, value in values.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != shapes[index]:
                raise ValueError(f"checkpoint {path}: optimizer state {key!r} of parameter {index} has shape "
                                 f"{tuple(value.shape)}, the parameter {tuple(shapes[index])}")


def _check_rest(path: Path, rest: dict, scheduler, trainer_state: dict) -> None:
    missing = [k for k in ("step", "train_seconds") if k not in trainer_state]
    missing += [f"rng.{k}" for k in ("python", "numpy", "torch") if k not in rest["rng"]]
    if missing:
        raise ValueError(f"checkpoint {path}: missing {missing}")
    if len(rest["scheduler"].get("base_lrs", [])) != len(scheduler.base_lrs):
        raise ValueError(f"checkpoint {path}: scheduler state is for another number of parameter groups")


def older_format(path: Path) -> bool:
    """A complete checkpoint without ``parts.pt``: an older podsrl's (before 2026-11-28, when the
    learned parts lived in ``trainer_state.json`` and ``optimizer.pt``; docs/limitations.md)."""
    return ((path / STATE_FILE).exists() and (path / WEIGHTS_FILE).exists()
            and not (path / PARTS_FILE).exists())


class OlderFormat(ValueError):
    """A checkpoint in an older podsrl's format (:func:`older_format`): no podsrl can resume it,
    since its learned parts are not where this one reads them; its weights still export."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"checkpoint {path} is in an older podsrl's format (no {PARTS_FILE}), which this "
                         "podsrl cannot resume")


class StateDoesNotFit(ValueError):
    """A checkpoint's state of the learned part ``part`` that this run's part refuses (another
    prompt selector's state, say) or lacks: the checkpoint does not fit this run, as another
    model's does not."""

    def __init__(self, path: Path, part: str, err: BaseException) -> None:
        self.part, self.reason = part, error_line(err)
        super().__init__(f"checkpoint {path}: its {part} state does not fit this run ({self.reason})")


def _saved_parts(path: Path, parts: dict, rank: int) -> tuple[dict[str, dict], list[str]]:
    """This process's saved state of each part (checked where the part can check), and the
    per-process parts the checkpoint has no state for (written by fewer processes). A part
    the checkpoint lacks, or whose check refuses its state, raises :class:`StateDoesNotFit`."""
    by_process = torch.load(path / PARTS_FILE, weights_only=True, map_location="cpu")
    if not (isinstance(by_process, list) and by_process and all(isinstance(s, dict) for s in by_process)):
        raise ValueError(f"checkpoint {path}: {PARTS_FILE} holds no states by process")
    own = by_process[rank] if rank < len(by_process) else None
    saved, fresh = {}, []
    for name, part in parts.items():
        if getattr(part, "per_process", False) and own is None:
            fresh.append(name)
            continue
        states = own if own is not None else by_process[0]  # a shared part is the same on every process
        try:
            if name not in states:
                raise KeyError(f"no {name} state")
            if hasattr(part, "check_state"):
                part.check_state(states[name])
        except Exception as err:
            raise StateDoesNotFit(path, name, err) from err
        saved[name] = states[name]
    return saved, fresh


def load_checkpoint(path: Path, *, model, optimizer, scheduler, parts: dict | None = None,
                    rank: int = 0) -> dict:
    """Restore everything in place; returns the trainer state (step, time) with ``fresh``:
    the per-process ``parts`` the checkpoint held no state of for ``rank`` (written by fewer
    processes), left as they were. ``parts``: name -> object with ``state_dict`` /
    ``load_state_dict`` (:class:`podsrl.trainer.state.RunState`'s); one that refuses its state
    raises :class:`StateDoesNotFit`.

    All-or-nothing: every part is read and checked before anything is changed, and if
    applying fails anyway, the model, optimizer, scheduler, RNG streams and parts are put
    back as they were before raising. ``weights_only=True`` throughout: a checkpoint can
    hold tensors and plain data, never code. One in an older format raises :class:`OlderFormat`."""
    if older_format(path):
        raise OlderFormat(path)
    weights = torch.load(path / WEIGHTS_FILE, weights_only=True, map_location="cpu")
    # state follows its parameter
    rest = torch.load(path / OPTIMIZER_FILE, weights_only=True, map_location="cpu")
    trainer_state = json.loads((path / STATE_FILE).read_text())
    if not (isinstance(weights, dict) and isinstance(rest, dict)
            and {"optimizer", "scheduler", "rng"} <= set(rest)):
        raise ValueError(f"checkpoint {path}: not a podsrl checkpoint")
    check_weights(path, weights, model)
    _check_optimizer(path, rest["optimizer"], optimizer)
    _check_rest(path, rest, scheduler, trainer_state)
    parts = parts or {}
    saved, fresh = _saved_parts(path, parts, rank)

    before = {"weights": trainable_state(model), "optimizer": copy.deepcopy(optimizer.state_dict()),
              "scheduler": scheduler.state_dict(), "rng": rng_state(),
              "parts": {name: part.state_dict() for name, part in parts.items()}}
    try:
        for name, state in saved.items():  # first: the likeliest to refuse (written by another selector)
            try:
                parts[name].load_state_dict(state)
            except Exception as err:
                raise StateDoesNotFit(path, name, err) from err
        copy_weights(model, weights)
        optimizer.load_state_dict(rest["optimizer"])
        scheduler.load_state_dict(rest["scheduler"])
        restore_rng(rest["rng"])
    except Exception:
        for name, part in parts.items():  # in the order applied
            part.load_state_dict(before["parts"][name])
        copy_weights(model, before["weights"])
        optimizer.load_state_dict(before["optimizer"])
        scheduler.load_state_dict(before["scheduler"])
        restore_rng(before["rng"])
        raise
    return {**trainer_state, "fresh": fresh}

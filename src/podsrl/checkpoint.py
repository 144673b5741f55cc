"""Checkpoints: trainable weights (full model or LoRA adapter), optimizer and scheduler,
every RNG stream, step counter, data position and elapsed training time.

A checkpoint is written into ``step_XXXXXXX.tmp`` and renamed when complete, so a crash
mid-write never leaves a folder that looks valid; only the newest ``keep`` are kept.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.json"


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "generators": {k: g.get_state() for k, g in generators.items()}}


def restore_rng(state: dict, generators: dict[str, torch.Generator]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    for key, g in generators.items():
        g.set_state(state["generators"][key])


def save_checkpoint(directory: Path, *, step: int, weights: dict[str, torch.Tensor], optimizer_state: dict,
                    scheduler, trainer_state: dict, generators: dict[str, torch.Generator], keep: int) -> Path:
    """Write one checkpoint; ``weights`` are the trainable parameters by name and
    ``optimizer_state`` the optimizer's state dict, both whole (not sharded)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step:07d}"
    tmp = directory / f"step_{step:07d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(weights, tmp / "trainable.pt")
    torch.save({"optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
                "rng": rng_state(generators)}, tmp / "optimizer.pt")
    (tmp / STATE_FILE).write_text(json.dumps({"step": step, **trainer_state}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")
             and (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def load_checkpoint(path: Path, *, model, optimizer, scheduler,
                    generators: dict[str, torch.Generator]) -> dict:
    """Restore everything in place; returns the trainer state (step, data position, time).

    Every file is read and checked before anything is changed, so a corrupt checkpoint
    raises and leaves model and optimizer untouched for the caller to try an older one.
    """
    weights = torch.load(path / "trainable.pt", weights_only=True, map_location="cpu")
    rest = torch.load(path / "optimizer.pt", weights_only=False, map_location="cpu")  # state follows its parameter
    state = json.loads((path / STATE_FILE).read_text())
    params = dict(model.named_parameters())
    wrong = [name for name, value in weights.items()
             if name not in params or params[name].shape != value.shape]
    if wrong or set(weights) != {n for n, p in params.items() if p.requires_grad}:
        raise ValueError(f"checkpoint {path}: its parameters do not match the model's trainable ones "
                         f"(e.g. {wrong[:3]}); was it written with another model or LoRA setting?")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    optimizer.load_state_dict(rest["optimizer"])
    scheduler.load_state_dict(rest["scheduler"])
    restore_rng(rest["rng"], generators)
    return state

"""The vllm engine's temporary config folders (the policy's architecture, which vLLM builds
from): each records which process made it, so the folders of runs killed with SIGKILL, which
cannot remove their own, are removed by the next engine, and only folders podsrl can prove it
wrote."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

CONFIG_FOLDER_PREFIX = "podsrl-vllm-"  # the engine's temporary config folder: tempdir/podsrl-vllm-XXXX
OWNER_FILE = "podsrl-owner.json"  # in that folder: which process made it (stale folders of killed runs go)


def write_owner(folder: Path) -> None:
    """Who made this config folder: the process and its start time (a pid alone is reused)."""
    (folder / OWNER_FILE).write_text(json.dumps({"made_by": "podsrl vllm engine", "pid": os.getpid(),
                                                 "process_start": _process_start(os.getpid())}))


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), '' when it is gone or unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def remove_stale_config_folders() -> list[Path]:
    """Remove the config folders of vllm engines whose process is gone (a run killed with SIGKILL
    cannot remove its own), and only those podsrl can prove it wrote: the folder holds its owner
    file naming a process that no longer runs, and nothing but that file and a model's
    config.json / generation_config.json. Anything else in a folder keeps it. Returns those removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{CONFIG_FOLDER_PREFIX}*"):
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
            # no start time recorded (not Linux): whether the process lives cannot be told, so it stays
            alive = not owner["process_start"] or _process_start(owner["pid"]) == owner["process_start"]
            names = {p.name for p in folder.iterdir()}
            if (owner.get("made_by") != "podsrl vllm engine" or alive or folder.is_symlink()
                    or not names <= {OWNER_FILE, "config.json", "generation_config.json"}
                    or "model_type" not in json.loads((folder / "config.json").read_text())):
                continue
            for name in names:
                (folder / name).unlink()
            folder.rmdir()
            removed.append(folder)
        except (OSError, ValueError, KeyError, TypeError):  # unreadable, foreign or in use: left as it is
            continue
    return removed

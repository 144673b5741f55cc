"""What ``podsrl compare`` and ``podsrl plot`` may overwrite in their output folder (#57): only
report files they can prove, by content, that they wrote there.

A report folder holds compare.md, compare.json, accuracy.png and step_time.png beside
REPORT_MARKER, which records the sha256 digest of each as podsrl wrote it (as
``podsrl export`` records its files: :mod:`podsrl.run_folder.ownership`). A report file is
podsrl's only while its content has a recorded digest: a user's own compare.md, a report
edited since, a link, or the reports of a podsrl before the marker existed are kept, and the
command refuses before any run starts, naming the file. Files are replaced atomically, and
while they are replaced the marker accepts both the old and the new digest, so a crash
between two files leaves a folder the next run still proves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from podsrl.run_folder.ownership import digest
from podsrl.trainer.checkpoints import umask

REPORT_MARKER = "podsrl_report.json"
REPORT_NAMES = ("compare.md", "compare.json", "accuracy.png", "step_time.png")
DIGEST = re.compile(r"[0-9a-f]{64}")


class ReportFolderError(ValueError):
    """The output folder holds a file podsrl would overwrite but cannot prove it wrote."""


def _recorded(folder: Path) -> dict[str, list[str]] | None:
    """The digests the folder's marker accepts per report name: {} without a marker, None when
    the marker is not podsrl's (not the shape podsrl writes: then it proves nothing and is itself
    the user's)."""
    marker = folder / REPORT_MARKER
    if not (marker.exists() or marker.is_symlink()):
        return {}
    try:
        saved = json.loads(marker.read_text()) if marker.is_file() and not marker.is_symlink() else None
    except (ValueError, OSError, UnicodeDecodeError):
        return None
    files = saved.get("files") if isinstance(saved, dict) and saved.keys() == {"files"} else None
    valid = isinstance(files, dict) and set(files) <= set(REPORT_NAMES) and all(
        isinstance(d, list) and all(isinstance(x, str) and DIGEST.fullmatch(x) for x in d)
        for d in files.values())
    return files if valid else None


def _proven(path: Path, accepted: list[str]) -> bool:
    return path.is_file() and not path.is_symlink() and digest(path) in accepted


def unproven_reports(folder: Path) -> list[str]:
    """The names in ``folder`` a report would overwrite that podsrl cannot prove it wrote there:
    the marker when it is not podsrl's, and each report file whose content has no recorded digest."""
    recorded = _recorded(folder)
    unproven = [REPORT_MARKER] if recorded is None else []
    for name in REPORT_NAMES:
        path = folder / name
        if (path.exists() or path.is_symlink()) and not _proven(path, (recorded or {}).get(name, [])):
            unproven.append(name)
    return unproven


def check_report_folder(folder: Path) -> None:
    """Refuse, in one line naming the first file, an output folder where writing the report would
    overwrite anything podsrl cannot prove it wrote; nothing is changed."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ReportFolderError(f"output_dir: {folder} is a file, not a folder; choose another --output_dir")
    unproven = unproven_reports(folder) if folder.is_dir() else []
    if not unproven:
        return
    first = folder / unproven[0]
    recorded = _recorded(folder)
    why = ("it is not the record podsrl writes" if unproven[0] == REPORT_MARKER else
           f"{REPORT_MARKER} records no such content: a file of yours, a report edited since, or one written "
           "by podsrl before #57" if recorded is not None else f"{REPORT_MARKER} is not podsrl's")
    more = f" (and {', '.join(unproven[1:])})" if unproven[1:] else ""
    raise ReportFolderError(f"output_dir: {first}{more} would be overwritten by the report, but podsrl "
                            f"cannot prove it wrote it ({why}); podsrl overwrites only its own reports: move "
                            f"it out of {folder}, or choose another --output_dir")


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, renamed over it."""
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as fh:
            fh.write(data)
        # mkstemp's file is private; a report gets what a plain write gives
        os.chmod(staging, 0o666 & ~umask())
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def _write_marker(folder: Path, files: dict[str, list[str]]) -> None:
    _replace(folder / REPORT_MARKER, (json.dumps({"files": files}, indent=2) + "\n").encode())


def write_reports(folder: Path, contents: dict[str, bytes]) -> None:
    """Write the report files ``contents`` (name -> bytes) into ``folder``, after proving again
    that every file they replace is podsrl's (the user may have edited one while the runs ran)."""
    check_report_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    earlier = _recorded(folder) or {}
    new = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
    # while the files are replaced, the marker accepts what each holds before (proven above) and after
    during = {name: sorted({new[name], *([digest(folder / name)] if (folder / name).is_file() else [])})
              for name in contents}
    _write_marker(folder, {**earlier, **during})
    for name, data in contents.items():
        _replace(folder / name, data)
    _write_marker(folder, {**{name: d for name, d in earlier.items() if name not in new},
                           **{name: [d] for name, d in new.items()}})

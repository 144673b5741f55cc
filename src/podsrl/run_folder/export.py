"""``podsrl export``: a finished run (or one of its checkpoints) as a standalone Hugging
Face model folder: weights that load with plain ``AutoModelForCausalLM.from_pretrained``
(a LoRA adapter is merged into its base, so peft is not needed), the tokenizer with its
chat template, and a model card (README.md).

The folder is written next to its destination under a temporary name and renamed into
place at the end, so a failed export (a full disk) leaves no half-written folder behind. It
carries EXPORT_MARKER with the sha256 digest of every file it wrote, and ``--overwrite``
replaces only a folder that does, and of it only the files whose content still has their
digest: whatever else is there (a user's results, an edited file) is kept, moved into the new
export, and listed (:mod:`podsrl.run_folder.ownership`). podsrl deletes nothing it did not write.

An ``OUTPUT_DIR`` that is a link to a folder is exported into that folder and stays a link:
users link an export folder to another disk (``hf -> /scratch/hf``) and expect the files
there, and replacing the link by a folder would strand whatever it pointed to. A link to
nothing (a disk not mounted) is refused: creating its target could fill the wrong disk. The
export gets the permissions the user's umask gives new files (an overwrite keeps the folder's
own), not the private ones of its staging folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import torch

from podsrl.models import ModelBundle, load_model
from podsrl.registry import error_line
from podsrl.run_folder.claim import MODEL_FILES, is_model_folder, is_run_folder
from podsrl.run_folder.model_card import model_card
from podsrl.run_folder.ownership import digests, unproven_exported
from podsrl.run_folder.run_info import RunInfo, Source, read_json, read_run_info
from podsrl.trainer.checkpoints import (
    STATE_FILE,
    WEIGHTS_FILE,
    WRITE_ERRORS,
    check_weights,
    copy_weights,
    fsync,
    list_checkpoints,
    umask,
)
from podsrl.trainer.config import split_list
from podsrl.trainer.logging import say

# what was exported, from where, each file's digest; --overwrite requires it
EXPORT_MARKER = "podsrl_export.json"
# names every export writes, whatever the model: a file podsrl cannot prove is its own under one
# of these (or a name the earlier export recorded) refuses an overwrite before the model loads
EXPORT_NAMES = frozenset({EXPORT_MARKER, "README.md", "config.json", "generation_config.json",
                          "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                          *MODEL_FILES})


def export_run(run_dir: Path, output_dir: Path, *, checkpoint: str | Path | None = None,
               overwrite: bool = False) -> Path:
    """Write ``output_dir`` from the run in ``run_dir``; returns ``output_dir``. Every
    refusal (not a run, no finished model, an occupied destination ...) raises before any
    model is loaded, naming the path."""
    info = read_run_info(Path(run_dir))
    source = _checkpoint_source(info, checkpoint) if checkpoint else _final_source(info)
    output = Path(output_dir)
    _check_output(info.run_dir, source.path, output, overwrite)
    bundle = (_load_checkpoint(info, source.path) if checkpoint
              else load_model(str(source.path), dtype=_dtype(info)))
    model = _merged(bundle.model)
    card = model_card(info, source, output, merged_lora=bundle.uses_lora)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        bundle.tokenizer.save_pretrained(folder)  # with its chat template
        (folder / "README.md").write_text(card)
        marker = {"run_dir": str(info.run_dir.resolve()), "source": source.label, "step": source.step,
                  # what a later --overwrite may remove: these files, as they are now
                  "files": digests(folder)}
        (folder / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n")

    _write_atomically(output, write)
    return output


# --- what to export --------------------------------------------------------------------------
def _final_source(info: RunInfo) -> Source:
    model_dir = info.run_dir / "model"
    summary = info.run_dir / "summary.json"
    weights = [*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")] if model_dir.is_dir() else []
    # finish() writes summary.json after model/: without it, model/ may be incomplete
    if not (weights and summary.is_file()):
        available = ", ".join(p.name for p in list_checkpoints(info.run_dir / "checkpoints")) or "none"
        raise FileNotFoundError(f"{model_dir}: no finished model (the run has not finished); export a "
                                f"checkpoint with --checkpoint instead (checkpoints: {available})")
    return Source(model_dir, "final model", *_step_and_seconds(read_json(summary), summary, "steps"))


def _checkpoint_source(info: RunInfo, checkpoint: str | Path) -> Source:
    """A checkpoint by path, or by name inside RUN_DIR/checkpoints."""
    path = Path(checkpoint)
    if not path.is_dir() and (info.run_dir / "checkpoints" / path).is_dir():
        path = info.run_dir / "checkpoints" / path
    if not ((path / WEIGHTS_FILE).is_file() and (path / STATE_FILE).is_file()):
        available = ", ".join(p.name for p in list_checkpoints(info.run_dir / "checkpoints")) or "none"
        raise FileNotFoundError(f"{path}: not a podsrl checkpoint (no {WEIGHTS_FILE} and {STATE_FILE}); "
                                f"checkpoints of {info.run_dir}: {available}")
    owner = path.resolve().parent.parent
    if (path.resolve().parent.name == "checkpoints" and is_run_folder(owner)
            and owner != info.run_dir.resolve()):
        # the model card would name RUN_DIR as its source, and RUN_DIR's config would load the weights
        raise ValueError(f"--checkpoint {checkpoint}: a checkpoint of run {owner}, not of {info.run_dir}; "
                         f"export it from its own run: podsrl export {owner} OUTPUT_DIR --checkpoint "
                         f"{path.name}")
    return Source(path, f"checkpoint {path.name}",
                  *_step_and_seconds(read_json(path / STATE_FILE), path / STATE_FILE))


def _step_and_seconds(saved: dict, path: Path, step: str = "step") -> tuple[int, float]:
    """What the model card says of the exported step: its number and the training time to it."""
    if not (isinstance(saved.get(step), int) and isinstance(saved.get("train_seconds"), (int, float))):
        raise ValueError(f"{path}: has no {step!r} and 'train_seconds' numbers; not podsrl's (or damaged)")
    return saved[step], saved["train_seconds"]


def _check_output(run_dir: Path, source: Path, output: Path, overwrite: bool) -> None:
    if output.is_symlink() and not output.exists():  # a link to nothing, or a loop of links
        raise FileNotFoundError(f"{output}: a link to {os.readlink(output)}, which does not exist; podsrl "
                                "exports into a link's folder but does not create it (a disk not mounted?): "
                                "create it, or choose another folder")
    out, run, src = output.resolve(), run_dir.resolve(), source.resolve()
    # replacing the run or a folder holding it would destroy it; writing into what is
    # exported would change it (a folder inside the run, e.g. RUN_DIR/hf, is fine)
    if out in (run, src) or out in run.parents or out in src.parents or src in out.parents:
        raise ValueError(f"{output}: would replace or hold {run} or {src}; choose another folder")
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"{output}: exists and is not a folder")
    if output.is_dir() and any(output.iterdir()):
        if not (output / EXPORT_MARKER).is_file():  # a run, a user's model or project: never replaced
            what = ("a podsrl run" if is_run_folder(output) else
                    "not a podsrl export (a model folder)" if is_model_folder(output)
                    else "not a podsrl export")
            raise FileExistsError(f"{output}: exists, is not empty and is {what} (no {EXPORT_MARKER}); "
                                  "podsrl replaces only folders it exported: choose a new or empty folder")
        if not overwrite:
            raise FileExistsError(f"{output}: holds an earlier podsrl export; pass --overwrite to replace it")
        _refuse_kept_files_in_the_way(output, _kept(output), EXPORT_NAMES | set(_recorded(output)))


def _recorded(output: Path) -> dict[str, str]:
    """The digests an earlier export's marker records, by file name; none from a marker without
    them (hand-made, or an older podsrl's): such a marker proves nothing."""
    try:
        files = json.loads((output / EXPORT_MARKER).read_text()).get("files")
    except (ValueError, OSError, AttributeError):
        return {}
    valid = isinstance(files, dict) and all(isinstance(v, str) for v in files.values())
    return files if valid else {}


def _kept(output: Path) -> list[str]:
    """What --overwrite keeps of an earlier export in ``output``: all but its provable files."""
    return unproven_exported(output, _recorded(output), EXPORT_MARKER)


def _refuse_kept_files_in_the_way(output: Path, kept: list[str], names: set[str] | frozenset[str]) -> None:
    """A file --overwrite would keep whose name the new export writes too (a user-edited
    README.md, a marker without digests) cannot be both kept and replaced: refuse, naming it."""
    in_the_way = [name for name in kept if name in names]
    if in_the_way:
        why = (f" ({EXPORT_MARKER} records no digests: hand-made or an older podsrl's, it proves nothing)"
               if EXPORT_MARKER in in_the_way else "")
        raise FileExistsError(f"{output}: holds files podsrl cannot prove it exported whose names the new "
                              f"export writes ({', '.join(in_the_way)}){why}; --overwrite keeps what is not "
                              f"podsrl's: move them out of {output}, or choose another folder")


# --- loading and merging ---------------------------------------------------------------------
def _dtype(info: RunInfo) -> str:
    return info.value("dtype", "float32")


def _load_checkpoint(info: RunInfo, path: Path) -> ModelBundle:
    """The run's model as training built it (base model, LoRA settings), then the
    checkpoint's trainable weights (all of them, or the adapter) copied in."""
    try:
        bundle = load_model(info.value("model"), lora_rank=info.value("lora_rank", 0),
                            lora_alpha=info.value("lora_alpha", 16.0),
                            lora_dropout=info.value("lora_dropout", 0.0),
                            lora_target_modules=tuple(split_list(info.value("lora_target_modules", ""))),
                            dtype=_dtype(info))
    except OSError as err:  # e.g. a local base folder that did not move with the run
        raise OSError(f"{info.run_dir / 'config.json'}: model {info.value('model')!r}: the checkpoint's base "
                      f"could not be loaded ({err})") from err
    try:
        weights = torch.load(path / WEIGHTS_FILE, weights_only=True, map_location="cpu")
    except Exception as err:  # a truncated or foreign file fails in many ways (unpickler errors of all kinds)
        raise ValueError(f"{path / WEIGHTS_FILE}: unreadable ({type(err).__name__}: {err})") from err
    if not isinstance(weights, dict):
        raise ValueError(f"{path / WEIGHTS_FILE}: not a podsrl checkpoint's weights")
    check_weights(path, weights, bundle.model)
    copy_weights(bundle.model, weights)
    return bundle


def _merged(model: torch.nn.Module) -> torch.nn.Module:
    """A LoRA model with its adapter folded into the base weights (a new, plain
    transformers model); any other model as it is."""
    if not hasattr(model, "peft_config"):
        return model
    return model.merge_and_unload()


# --- writing ---------------------------------------------------------------------------------
def _write_atomically(output: Path, write) -> None:
    """``write(folder)`` into a temporary sibling of ``output`` (of its folder, for a link), then
    rename it into place. An earlier export there is replaced: its provable files are removed,
    the rest is kept (moved into the new folder, listed). On any failure the temporary folder is
    removed and ``output`` is left as it was; a write error (a full disk) is one line saying so."""
    # the link stays, its folder changes
    folder = Path(os.path.realpath(output)) if output.is_symlink() else output
    folder.parent.mkdir(parents=True, exist_ok=True)
    mask = umask()
    mode = _folder_mode(folder, mask)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.export-", suffix=".tmp",
                                dir=folder.parent))  # a new name
    old = tmp.with_suffix(".old")
    try:
        try:
            write(tmp)
            for path in tmp.iterdir():  # on disk before the rename makes the folder visible as complete
                if path.is_file() and not path.is_symlink():  # some writers (safetensors) make theirs private
                    os.chmod(path, 0o666 & ~mask)
                fsync(path)
        except WRITE_ERRORS as err:
            left = "is as it was" if output.exists() else "was not created"
            raise OSError(f"{output}: could not write the export ({error_line(err)}); removed the staging "
                          f"folder {tmp.name}, {output} {left}; free space, then run the same command "
                          "again") from None
        kept = _kept(folder) if folder.exists() else []
        # checked before the model loaded too; the names this export wrote are known only now
        _refuse_kept_files_in_the_way(output, kept, {p.name for p in tmp.iterdir()})
        os.chmod(tmp, mode)
        _swap_in(tmp, folder, old, kept)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with contextlib.suppress(OSError):  # what is left of the earlier export: its own files, proven above
        for path in old.iterdir() if old.exists() else ():
            path.unlink()
        old.rmdir()
    fsync(folder.parent)
    if kept:
        shown = ", ".join(kept[:8]) + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
        entries = "entry" if len(kept) == 1 else "entries"
        say(f"{output}: kept {len(kept)} {entries} podsrl did not export ({shown}), moved into the new "
            "export")


def _folder_mode(folder: Path, mask: int) -> int:
    """The export folder's permissions: an earlier export's own (an overwrite keeps them), else
    what the umask gives a new folder (mkdtemp's staging folder is private, 0700)."""
    return stat.S_IMODE(folder.stat().st_mode) if folder.is_dir() else 0o777 & ~mask


def _swap_in(tmp: Path, output: Path, old: Path, kept: list[str]) -> None:
    """Rename ``output`` (if any) to ``old``, move ``kept`` from it into ``tmp``, rename ``tmp``
    to ``output``; on a failure every rename is undone (renames within one folder: no copies)."""
    moved: list[str] = []
    if output.exists():
        os.replace(output, old)
    try:
        for name in kept:
            os.replace(old / name, tmp / name)
            moved.append(name)
        os.replace(tmp, output)
    except BaseException:
        for name in moved:
            os.replace(tmp / name, old / name)
        if old.exists():
            os.replace(old, output)
        raise

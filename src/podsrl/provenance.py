"""Where and with what a measurement was taken: code commit, date, machine, library versions.

Every run writes this to ``environment.json`` in its run directory when it starts (a
resumed run appends its own entry), so reports built later from the runs (``podsrl
compare`` / ``plot``, the benchmark scripts) state the commit, dates and machine of the
runs themselves instead of relying on someone to copy them by hand.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).resolve().parent


def git_commit(path: Path = SOURCE_DIR) -> str:
    """Short commit of the checkout holding ``path``, with ``+dirty`` when tracked files
    differ from it; 'unknown' outside a git checkout (an installed wheel)."""
    try:
        run = dict(cwd=path, capture_output=True, text=True, timeout=10)
        commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], **run)
        if commit.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **run).stdout.strip()
        return commit.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_kind() -> str:
    """The CPU's widest instructions for matrix work, as torch detects them: 'AMX', 'AVX-512 BF16',
    'AVX-512', 'AVX2' or torch's own name for others. bfloat16's speed and its rounding differ
    between these kinds (vLLM's CPU backend repacks bfloat16 layers on the first two), so
    results and tests name the kind they ran on."""
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "AVX-512 BF16"
    capability = torch.backends.cpu.get_cpu_capability()  # 'AVX512', 'AVX2', 'DEFAULT', ...
    return {"AVX512": "AVX-512"}.get(capability, capability)


def machine_description() -> str:
    """One line: CPU model and kind, cores, GPU if any, OS and architecture."""
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return (f"{cpu_model()} ({cpu_kind()}), {os.cpu_count()} cores{gpu}, {platform.system()} "
            f"{platform.machine()}")


def installed(name: str) -> str:
    """A distribution's version from its metadata (nothing is imported), or 'not installed'."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    now = time.time()
    return {"date": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(timespec="seconds"),
            "unix_time": now,  # orders runs that started within the same second
            "commit": git_commit(), "machine": machine_description(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "transformers": installed("transformers"),
            "podsrl": installed("podsrl"), "argv": sys.argv}


def end_of_turn(tokenizer) -> dict:
    """The tokenizer's EOS, id and text: what ends a completion. Two conversions of one model can
    differ in it (podsrl's SmolLM2 under transformers 5.17 ended on <|im_start|>, id 1), and runs
    of both are not comparable (podsrl.experiments.conversions)."""
    return {"eos_token_id": tokenizer.eos_token_id, "eos_token": tokenizer.eos_token}


def record_environment(run_dir: Path, tokenizer=None) -> None:
    """Append this process's environment to ``run_dir/environment.json`` (a list: one
    entry per start of the run, so a resumed run keeps the history), with the ``tokenizer``'s
    EOS when given (a run's tokenizer: a resume may load another conversion than the start)."""
    path = Path(run_dir) / "environment.json"
    entries = json.loads(path.read_text()) if path.exists() else []
    entries.append({**environment(), **(end_of_turn(tokenizer) if tokenizer is not None else {})})
    path.write_text(json.dumps(entries, indent=2) + "\n")


def read_environment(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "environment.json"
    return json.loads(path.read_text()) if path.exists() else []


# what `podsrl env` reports besides torch: podsrl's dependencies and optional extras
REPORTED_PACKAGES = ("transformers", "accelerate", "peft", "trl", "datasets", "vllm", "deepspeed",
                     "tensorboard", "wandb", "trackio", "math-verify", "reasoning-gym")


def _torch_lines() -> list[str]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    lines = [f"- torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}, "
             f"CUDA available: {torch.cuda.is_available()}, cuDNN: {cudnn or 'not available'})"]
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(index)
        lines.append(f"- GPU {index}: {props.name}, {props.total_memory / 2**30:.0f} GiB")
    return lines


def environment_report() -> str:
    """``podsrl env``: versions and machine as Markdown lines to paste into a bug report.
    Versions come from package metadata, so no library but torch is imported."""
    lines = ["Copy and paste the lines below into your issue.", "",
             f"- podsrl: {installed('podsrl')} (commit {git_commit()}, from {SOURCE_DIR})",
             f"- Python: {platform.python_version()} ({sys.executable})",
             f"- Platform: {platform.platform()}",
             f"- Machine: {machine_description()}",
             *_torch_lines(),
             *[f"- {name}: {installed(name)}" for name in REPORTED_PACKAGES]]
    return "\n".join(lines)

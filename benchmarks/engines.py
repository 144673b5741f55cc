"""Generation speed of podsrl's engines side by side, in one run: the hf engine (transformers
generate) as a run configures it, the hf engine's generation copy with and without a static
cache, and the vllm engine (vLLM in the training process).

    python benchmarks/engines.py [--models tiny,smollm2] [--rows 128,512,2048] [--tokens 12,128]
        [--dtypes float32,bfloat16] [--engines hf,hf-copy,hf-static,vllm] [--lora_rank 16]
        [--repeats 2] [--cell_limit 600] [--random_init] [--vllm_compiled]
        [--step_regimes main,headroom] [--steps 6] [--step_set F=V] [--json out.json] [--record NAME]

Each cell (model, dtype, rows, tokens, engine) runs in its own subprocess, back to back: load the
model, one warm-up call (engine start-up and first-call costs excluded; reported apart), then
``--repeats`` timed calls, the best kept. Rows are P prompts x n = 16 samples (P = rows / 16);
prompts are level-3 arithmetic problems (in the chat template for SmolLM2), sampled at
temperature 1. Every row decodes exactly T tokens (``min_completion_length`` = T: no end of sequence
before), so a decode step is the same work on both.

The policy is the model with a LoRA adapter of rank ``--lora_rank`` on every linear layer
(0: the plain model), as the headroom regime trains it.

* hf: generation from the policy itself, as podsrl ran it before #39. float32: dtype float32;
  bfloat16: float32 weights under bf16 autocast, the only low-precision mode podsrl trains in
  (``bf16: true``).
* hf-copy: ``generation_dtype`` = the row's dtype: a plain copy in that dtype, LoRA merged.
* hf-static: hf-copy plus ``generation_static_cache`` (transformers compiles the decode step on
  a GPU, not on the CPU; the first call, which compiles, is the warm-up).
* vllm: podsrl's vllm engine computing in that dtype (on the CPU: vLLM's CPU backend).
* slots: podsrl's slots engine (micro groups, continuous refill), in ``--step_regimes`` only: it
  decodes a step's prompt groups, not a batch of rows (its cells are listed as n/a).

ms per decode step = the call's seconds / T (prefill included: both engines pay it once per
prompt); tokens/s = rows x T / seconds. A cell whose time, predicted from the same engine's
smaller cells (linear in rows and in tokens), exceeds ``--cell_limit`` seconds is skipped and
listed as such. ``--random_init``: a randomly initialised model of the named architecture
(timings only). For a lent GPU, where the weights are not installed, ``--save_shape DIR``
writes the model's folder without its weights (SmolLM2: config and tokenizer, 3.5 MB), and
``--shape_dir DIR`` there builds the random model from it (benchmarks/gpu_engines.sh).

``--step_regimes main,headroom,chain`` also runs a few training steps of each regime on each
engine (``podsrl train``, evaluation left out) and prints the mean seconds per stage: the main
job, #29's headroom shape (configs/smollm2-headroom.yaml on SmolLM2-135M-Instruct itself) and
#58's reasoning regime (configs/tiny-chain.yaml).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

SAMPLES = 16  # n per prompt, PODS' default
MODELS = {"tiny": "tiny", "smollm2": "smollm2-135m-instruct"}
# engine column -> (registered engine, uses the generation copy, static cache)
ENGINE_VARIANTS = {"hf": ("hf", False, False), "hf-copy": ("hf", True, False), "hf-static": ("hf", True, True),
                   "slots": ("slots", False, False), "vllm": ("vllm", False, False)}


def prompts(tokenizer, model: str, count: int) -> list[str]:
    from podsrl.tasks import prepare_split
    from podsrl.tasks.arithmetic import build_arithmetic

    task = build_arithmetic(level=3, num_train=count, num_test=10, seed=0)
    split = prepare_split(task.train[:count], tokenizer, system_prompt="", use_chat_template=model != "tiny",
                          max_prompt_tokens=512)
    return list(split.prompts)


def load(model: str, random_init: bool, lora_rank: int, shape_dir: str = ""):
    import torch

    from podsrl.models import load_model

    if shape_dir:  # config and tokenizer only: random weights, nothing to carry but a few MB
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from podsrl.models.loading import pad_left

        tokenizer = AutoTokenizer.from_pretrained(shape_dir)
        pad_left(tokenizer)  # as load_model sets it up
        torch.manual_seed(0)
        policy = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(shape_dir), dtype=torch.float32)
    else:
        bundle = load_model(MODELS[model])
        policy, tokenizer = bundle.model, bundle.tokenizer
        if random_init:
            from transformers import AutoModelForCausalLM

            torch.manual_seed(0)
            policy = AutoModelForCausalLM.from_config(policy.config, dtype=torch.float32)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear"))
    return policy.eval(), tokenizer


def save_shape(model: str, folder: Path) -> None:
    """The model's folder without its weights (config, tokenizer, chat template): --shape_dir's input."""
    import shutil

    from podsrl.models.loading import BUILTIN_MODELS

    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"--save_shape: {folder} exists and is not empty; name a new folder (nothing is overwritten)")
    source = Path(BUILTIN_MODELS[MODELS[model]]())  # converted into the cache on first use
    folder.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.suffix not in (".safetensors", ".bin", ".gguf"):
            shutil.copy2(file, folder / file.name)
    print(f"wrote {folder}: {sorted(f.name for f in folder.iterdir())}")


def worker(model: str, dtype: str, rows: int, tokens: int, engine_name: str, repeats: int,
           random_init: bool, compiled: bool, lora_rank: int, shape_dir: str) -> dict:
    import torch

    from podsrl.models.precision import autocast
    from podsrl.rollout import ENGINES, Sampling, options_class

    policy, tokenizer = load(model, random_init, lora_rank, shape_dir)
    if torch.cuda.is_available():
        policy = policy.cuda()
    batch = prompts(tokenizer, model, rows // SAMPLES)
    longest = max(len(ids) for ids in tokenizer(batch, add_special_tokens=False)["input_ids"])
    positions = policy.config.max_position_embeddings
    if longest + tokens > positions:  # vLLM stops there; transformers would run past the trained positions
        return {"model": model, "dtype": dtype, "rows": rows, "tokens": tokens, "engine": engine_name,
                "skipped": f"n/a: prompt + T > the model's {positions} positions"}
    registered, uses_copy, static_cache = ENGINE_VARIANTS[engine_name]
    kind = options_class(ENGINES[registered])  # each engine's own options, the ones it has
    values = dict(max_completion_length=tokens, copy_dtype=dtype if uses_copy else "", static_cache=static_cache,
                  compute_dtype=dtype, max_model_length=longest + tokens, enforce_eager=not compiled)
    engine = ENGINES[registered](kind(**{name: values[name] for name in kind.__dataclass_fields__ if name in values}))

    def call():  # the trainer's autocast: bf16 runs generate under it (the vllm engine turns it off)
        with autocast(policy.device, dtype if dtype == "bfloat16" else ""):
            return engine.generate(policy, tokenizer, batch, SAMPLES,
                                   Sampling(tokens, temperature=1.0, min_completion_length=tokens))

    torch.manual_seed(0)
    start = time.perf_counter()
    call()  # warm-up: the vllm engine starts here
    warmup = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        rollouts = call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    generated = int(rollouts.completion_mask.sum())
    assert generated == rows * tokens, f"{generated} tokens generated, expected {rows} x {tokens}"
    getattr(engine, "close", lambda: None)()
    return {"model": model, "dtype": dtype, "rows": rows, "tokens": tokens, "engine": engine_name,
            "seconds": best, "warmup_seconds": warmup, "ms_per_step": 1000 * best / tokens,
            "tokens_per_second": rows * tokens / best, "device": str(policy.device)}


def run_cell(args, model: str, dtype: str, rows: int, tokens: int, engine: str) -> dict:
    command = [sys.executable, __file__, "--worker", json.dumps([model, dtype, rows, tokens, engine, args.repeats,
                                                                 args.random_init, args.vllm_compiled,
                                                                 args.lora_rank, args.shape_dir])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=max(3 * args.cell_limit, 600))
    if done.returncode:
        return {"model": model, "dtype": dtype, "rows": rows, "tokens": tokens, "engine": engine,
                "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def predicted_seconds(done: list[dict], model: str, dtype: str, rows: int, tokens: int, engine: str) -> float:
    """Linear in rows and tokens from the largest finished cell of the same engine, model and dtype."""
    same = [r for r in done if (r["model"], r["dtype"], r["engine"]) == (model, dtype, engine) and "seconds" in r]
    if not same:
        return 0.0
    ref = max(same, key=lambda r: r["rows"] * r["tokens"])
    return ref["seconds"] * rows / ref["rows"] * tokens / ref["tokens"]


def table(results: list[dict], engines: list[str]) -> str:
    """One row per cell; each engine's ms per decode step and tokens/s, then each other engine's
    tokens/s over hf's (the speed-up on today's path)."""
    others = [e for e in engines if e != "hf"] if "hf" in engines else []
    header = ["model", "dtype", "rows", "T", *(f"{e} {unit}" for e in engines for unit in ("ms/step", "tok/s")),
              *(f"{e} / hf tok/s" for e in others)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    keys = sorted({(r["model"], r["dtype"], r["rows"], r["tokens"]) for r in results},
                  key=lambda k: (k[0], k[1], k[3], k[2]))
    for key in keys:
        cells, speeds = [], {}
        for engine in engines:
            found = next((r for r in results if (r["model"], r["dtype"], r["rows"], r["tokens"]) == key
                          and r["engine"] == engine), None)
            if found is None or "seconds" not in found:
                why = "not run" if found is None else found.get("skipped") or f"failed: {found.get('error')}"
                cells += [why, ""]
            else:
                speeds[engine] = found["tokens_per_second"]
                cells += [f"{found['ms_per_step']:.1f}", f"{found['tokens_per_second']:,.0f}"]
        ratios = [f"**{speeds[e] / speeds['hf']:.2f}x**" if {"hf", e} <= speeds.keys() else "-" for e in others]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


STEP_REGIMES = {
    # the main job: `podsrl train` with no arguments
    "main": [],
    # #29's headroom regime (configs/smollm2-headroom.yaml) on SmolLM2-135M-Instruct itself, not
    # the format-warmed copy: the step's shape (8 prompts x 16, LoRA r16, 12 tokens) is the same
    "headroom": ["--config", "configs/smollm2-headroom.yaml", "--model", "smollm2-135m-instruct"],
    # #58's reasoning regime (configs/tiny-chain.yaml): tiny-chain, worked chains of 20-240 tokens
    "chain": ["--config", "configs/tiny-chain.yaml"],
}


def engine_arguments(engine: str, extra: list[str]) -> list[str]:
    """``podsrl train`` arguments of an engine column; the copy is bfloat16 under bf16, else float32."""
    registered, uses_copy, static_cache = ENGINE_VARIANTS[engine]
    bf16 = any(a == "--bf16" and b == "true" for a, b in zip(extra, extra[1:]))
    copy = ("bfloat16" if bf16 else "float32") if uses_copy else ""  # hf: from the policy, as before #39
    words = ["--generation_engine", registered] + (["--generation_dtype", copy] if registered == "hf" else [])
    return words + (["--generation_static_cache", "true"] if static_cache else [])


def step_split(regime: str, engine: str, steps: int, extra: list[str], out: Path, compiled: bool) -> dict:
    """Mean seconds per stage over steps 2..steps of a short run (step 1 pays first-call costs)."""
    from podsrl.metrics import read_metrics

    run_dir = out / f"{regime}-{engine}"
    command = [sys.executable, "-c", "import sys; from podsrl.cli import main; raise SystemExit(main(sys.argv[1:]))",
               "train", *STEP_REGIMES[regime], *engine_arguments(engine, extra), "--max_steps", str(steps),
               "--vllm_enforce_eager", str(not compiled).lower(),
               "--eval_steps", "0", "--eval_prompts", "16", "--save_steps", "0", "--progress", "false",
               "--output_dir", str(run_dir), *extra]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        return {"regime": regime, "engine": engine, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] >= 2]
    stages = sorted({k for r in records for k in r if k.startswith("time_") and k != "time_eval"})  # training only
    mean = {k: sum(r.get(k, 0.0) for r in records) / len(records) for k in stages}
    return {"regime": regime, "engine": engine, "steps": len(records), **mean,
            "step_seconds": sum(mean.values()),
            "weight_sync_seconds": sum(r.get("weight_sync_seconds", 0.0) for r in records) / len(records)}


def split_table(rows: list[dict]) -> str:
    lines = ["| regime | engine | steps averaged | generate s | of which weights in s | reward s | update s | "
             "step s |", "|" + " --- |" * 8]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['regime']} | {r['engine']} | failed: {r['error']} |" + " |" * 5)
            continue
        lines.append(f"| {r['regime']} | {r['engine']} | {r['steps']} | {r['time_generate']:.3f} | "
                     f"{r['weight_sync_seconds']:.3f} | {r['time_reward']:.3f} | {r['time_update']:.3f} | "
                     f"{r['step_seconds']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--rows", default="128,512,2048")
    parser.add_argument("--tokens", default="12,128")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--engines", default="hf,hf-copy,hf-static,vllm", help=", ".join(ENGINE_VARIANTS))
    parser.add_argument("--lora_rank", type=int, default=16, help="the policy's LoRA rank (0: the plain model)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cell_limit", type=float, default=600.0, help="skip a cell predicted to take longer (s)")
    parser.add_argument("--random_init", action="store_true", help="random weights of the named architecture")
    parser.add_argument("--shape_dir", default="", help="random weights from this folder's config and tokenizer "
                                                        "(no weights needed: written by --save_shape)")
    parser.add_argument("--save_shape", default="", help="write the first of --models' folder without its weights "
                                                         "here, then exit")
    parser.add_argument("--vllm_compiled", action="store_true", help="vllm_enforce_eager false: compile at start-up")
    parser.add_argument("--step_regimes", default="", help="also time training steps: main,headroom,chain")
    parser.add_argument("--steps", type=int, default=6, help="training steps per regime and engine")
    parser.add_argument("--step_set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a config override for the step runs (e.g. bf16=true)")
    parser.add_argument("--json", default="", help="write every cell's numbers here")
    parser.add_argument("--record", default="", help="write the table into benchmarks/RESULTS.md as block NAME")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))))
        return 0
    if args.save_shape:
        save_shape(args.models.split(",")[0], Path(args.save_shape))
        return 0
    engines = args.engines.split(",")
    results: list[dict] = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            for tokens in sorted(int(t) for t in args.tokens.split(",")):
                for rows in sorted(int(r) for r in args.rows.split(",") if r):  # --rows "": no cells
                    for engine in engines:
                        if engine == "slots":
                            results.append({"model": model, "dtype": dtype, "rows": rows, "tokens": tokens,
                                            "engine": engine, "skipped": "n/a: step regimes only"})
                            continue
                        guess = predicted_seconds(results, model, dtype, rows, tokens, engine)
                        if guess * (1 + args.repeats) > args.cell_limit:
                            results.append({"model": model, "dtype": dtype, "rows": rows, "tokens": tokens,
                                            "engine": engine, "skipped": f"skipped (~{guess:.0f} s per call)"})
                        else:
                            results.append(run_cell(args, model, dtype, rows, tokens, engine))
                        print(json.dumps(results[-1]), flush=True)
    body = table(results, engines) if results else ""
    starts = [f"{r['engine']} {r['model']} {r['dtype']}: {r['warmup_seconds']:.1f} s" for r in results
              if "warmup_seconds" in r and r["rows"] == min(int(x) for x in args.rows.split(",") if x)
              and r["tokens"] == min(int(t) for t in args.tokens.split(","))]
    if starts:
        body += "\n\nFirst call (vLLM's engine start-up included), smallest cell: " + "; ".join(starts) + "."
    if args.step_regimes:
        extra = [word for pair in args.step_set for word in (f"--{pair.split('=', 1)[0]}", pair.split("=", 1)[1])]
        with tempfile.TemporaryDirectory() as out:
            splits = [step_split(regime, engine, args.steps, extra, Path(out), args.vllm_compiled)
                      for regime in args.step_regimes.split(",") for engine in engines]
        for row in splits:
            print(json.dumps(row), flush=True)
        results += splits
        overrides = f" (overrides: {' '.join(args.step_set)})" if args.step_set else ""
        body += (f"\n\nTraining steps, seconds per stage (mean of steps 2-{args.steps}){overrides}; weights in = "
                 f"vllm's weight push or the generation copy's refresh:\n\n" + split_table(splits))
    print(body)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

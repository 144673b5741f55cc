"""Peak memory, tokens per second and decode steps of each way to generate n samples per prompt.

Modes, on the same prompts and seeds:
  full          transformers generate on the whole batch (P x n rows; the `hf` engine)
  micro         slots engine, naive micro-groups of g (refill="group")
  continuous    slots engine, g slots refilled as soon as a sample ends
  length-aware  continuous + Infinite Sampling's plan: a probe of the first tokens of every
                sample, token-conditioned length prediction, lanes balanced by predicted
                length, shortest-first refill within lanes (generation_schedule length_aware)
  shortest-first continuous + shortest-predicted-first from a prompt-level predictor
  longest-first continuous + longest-predicted-first (for comparison)
Modes with a predictor train it first on --train-batches earlier batches (other prompts).

Every measurement runs in a fresh subprocess: load the model, warm up, reset the peak
resident memory (Linux /proc/self/clear_refs), generate, read the peak (VmHWM) minus the
resident memory just before generating. Prints one table per model with ratios to full-group
generation (memory, tokens/s) and to naive micro-groups (decode steps).

    python benchmarks/generation_memory.py [--workloads tiny,smollm2-chat,smollm2-gsm8k] [--n 16,64,256]
        [--slots 64] [--seeds 0,1,2] [--train-batches 2] [--probe-tokens 4] [--threads 2] [--json out.json]
        [--record NAME]

Workloads (model, prompts, prompts per batch, max new tokens):
  tiny           the tiny model, arithmetic level 3, 4 prompts, 8 tokens (lengths ~6, nearly equal)
  smollm2-chat   SmolLM2-135M-Instruct, arithmetic level 1 in its chat template without a
                 format instruction, 2 prompts, 96 tokens: it chats, lengths 3 to 96
  smollm2-gsm8k  SmolLM2-135M-Instruct, GSM8K test questions (../shared/data; arithmetic if
                 absent) with the think/answer system prompt, 2 prompts, 48 tokens (most hit the cap)
  chain          the reasoning regime (#58): tiny-chain on the chain task, level 3, 4 prompts,
                 256 tokens (worked chains of 1-16 steps, about 20-240 tokens)
  smollm2-gsm8k-256  smollm2-gsm8k with the reasoning regime's 256-token budget
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

SHARED_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
# name -> (model, prompts, prompts per batch, max new tokens)
WORKLOADS = {"tiny": ("tiny", "arithmetic", 4, 8),
             "smollm2-chat": ("smollm2-135m-instruct", "arithmetic-chat", 2, 96),
             "smollm2-gsm8k": ("smollm2-135m-instruct", "gsm8k", 2, 48),
             # the reasoning regime (#58): worked chains of 1-16 steps, about 20-240 tokens
             "chain": ("tiny-chain", "chain", 4, 256),
             "smollm2-gsm8k-256": ("smollm2-135m-instruct", "gsm8k", 2, 256)}
MODES = {
    "full": dict(engine="hf"),
    "micro": dict(engine="slots", refill="group", schedule="fifo"),
    "continuous": dict(engine="slots", refill="continuous", schedule="fifo"),
    "length-aware": dict(engine="slots", refill="continuous", schedule="length_aware"),
    "shortest-first": dict(engine="slots", refill="continuous", schedule="shortest_first"),
    "longest-first": dict(engine="slots", refill="continuous", schedule="longest_first"),
}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _prompts(source: str, tokenizer, count: int, offset: int) -> list[str]:
    from podsrl.tasks import TaskOptions, build_task, render_prompt

    if source == "gsm8k" and SHARED_GSM8K.is_dir():
        test_file = next(p for p in sorted(SHARED_GSM8K.rglob("*test*")) if p.is_file())
        task = build_task(TaskOptions(task="gsm8k", train_data=str(test_file), test_data=str(test_file)))
        system = task.system_prompt
    elif source == "chain":
        task, system = build_task(TaskOptions(task="chain", task_level=3)), ""
    else:
        task, system = build_task(TaskOptions(task_level=1 if source == "arithmetic-chat" else 3)), ""
    return [render_prompt(tokenizer, ex, system) for ex in task.train[offset:offset + count]]


def worker(workload: str, mode: str, n: int, slots: int, seed: int, train_batches: int, probe_tokens: int,
           threads: int) -> dict:
    import torch

    from podsrl.models import load_model
    from podsrl.rollout import (
        LengthPredictor,
        Sampling,
        SlotsOptions,
        generate,
        generate_in_slots,
        generation_memory_bytes,
    )
    from podsrl.rollout.schedule import PrefixLengthPredictor

    torch.set_num_threads(threads)
    model_name, source, prompts_per_batch, max_new_tokens = WORKLOADS[workload]
    bundle = load_model(model_name)
    model, tokenizer = bundle.model, bundle.tokenizer
    prompts = _prompts(source, tokenizer, prompts_per_batch, offset=0)
    options = MODES[mode]
    schedule = options.get("schedule", "fifo")
    predictor = (PrefixLengthPredictor() if schedule == "length_aware" else
                 LengthPredictor() if schedule in ("shortest_first", "longest_first") else None)

    def run(batch: list[str], samples: int):
        if options["engine"] == "hf":
            return generate(model, tokenizer, batch, samples, Sampling(max_new_tokens, temperature=1.0))
        return generate_in_slots(model, tokenizer, batch, samples,
                                 SlotsOptions(max_completion_length=max_new_tokens, temperature=1.0, micro_group=slots,
                                              refill=options["refill"], schedule=options["schedule"],
                                              probe_tokens=probe_tokens), predictor=predictor)

    torch.manual_seed(seed + 1)
    run(_prompts(source, tokenizer, prompts_per_batch, offset=prompts_per_batch), min(n, 16))  # warm-up
    for batch in range(train_batches if predictor is not None else 0):  # the predictor learns, as across steps
        run(_prompts(source, tokenizer, prompts_per_batch, offset=prompts_per_batch * (2 + batch)), 32)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM)
    before = _status_kb("VmRSS")
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = run(prompts, n)
    seconds = time.perf_counter() - start
    longest = int(out.prompt_mask.sum(-1).max())
    rows = len(prompts) * n if options["engine"] == "hf" else min(slots, len(prompts) * n)
    stored = (len(prompts), longest) if options["engine"] == "slots" else (0, 0)
    probe = len(prompts) * n * (probe_tokens - 1) if schedule == "length_aware" else 0  # parked prefixes
    estimate = generation_memory_bytes(model.config, rows, longest + max_new_tokens, *stored, probe) / 2**20
    return {"estimated_mb": estimate, "workload": workload, "mode": mode, "n": n, "prompts": len(prompts),
            "slots": slots, "seconds": seconds, "tokens": out.stats["generated_tokens"],
            "decode_steps": out.stats["decode_steps"], "tokens_per_second": out.stats["generated_tokens"] / seconds,
            "peak_mb": (_status_kb("VmHWM") - before) / 1024, "seed": seed,
            "probe_steps": out.stats.get("probe_steps"), "length_mae": out.stats.get("length_mae"),
            "mean_length": float(out.completion_mask.sum(-1).float().mean())}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _mean_sd(values: list[float]) -> str:
    mean = _mean(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return f"{mean:.2f} +- {sd:.2f}"


def table(rows: list[dict]) -> str:
    """One row per (n, mode), every column the mean over seeds."""
    ratio = lambda a, b: f"{a / b:.2f}" if b else "n/a"  # noqa: E731
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        first = next(r for r in rows if r["workload"] == workload)
        seeds = sorted({r["seed"] for r in rows if r["workload"] == workload})
        lines += [f"\n{workload}: {first['prompts']} prompts x n, g = {first['slots']} slots, T = 1.0, "
                  f"seeds {seeds} (means)", "",
                  "| n | mode | peak MB (estimate) | vs full | tokens/s | vs full | decode steps | vs micro "
                  "| mean length |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for n in dict.fromkeys(r["n"] for r in rows if r["workload"] == workload):
            group = {}
            for mode in dict.fromkeys(r["mode"] for r in rows if r["workload"] == workload and r["n"] == n):
                runs = [r for r in rows if (r["workload"], r["n"], r["mode"]) == (workload, n, mode)]
                group[mode] = {key: _mean([r[key] for r in runs]) for key in
                               ("peak_mb", "estimated_mb", "tokens_per_second", "decode_steps", "mean_length")}
            full, micro = group.get("full", {}), group.get("micro", {})
            for mode, r in group.items():
                lines.append(f"| {n} | {mode} | {r['peak_mb']:.1f} ({r['estimated_mb']:.1f}) | "
                             f"{ratio(r['peak_mb'], full.get('peak_mb'))} | {r['tokens_per_second']:.0f} | "
                             f"{ratio(r['tokens_per_second'], full.get('tokens_per_second'))} | "
                             f"{r['decode_steps']:.0f} | {ratio(r['decode_steps'], micro.get('decode_steps'))} | "
                             f"{r['mean_length']:.1f} |")
    return "\n".join(lines)


def schedule_table(rows: list[dict]) -> str:
    """Each scheduled mode against plain continuous refill, paired by seed: ratios' mean +- sd."""
    lines = ["\n| workload | n | mode | decode steps vs continuous | tokens/s vs continuous | probe steps "
             "| length MAE (tokens) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    keys = dict.fromkeys((r["workload"], r["n"], r["mode"]) for r in rows
                         if r["mode"] in ("length-aware", "shortest-first", "longest-first"))
    for workload, n, mode in keys:
        pairs = [(r, base) for r in rows if (r["workload"], r["n"], r["mode"]) == (workload, n, mode)
                 for base in rows if (base["workload"], base["n"], base["mode"], base["seed"])
                 == (workload, n, "continuous", r["seed"])]
        if not pairs:
            continue
        probe = [r["probe_steps"] for r, _ in pairs if r["probe_steps"] is not None]
        mae = [r["length_mae"] for r, _ in pairs if r["length_mae"] is not None]
        steps = _mean_sd([r["decode_steps"] / b["decode_steps"] for r, b in pairs])
        speed = _mean_sd([r["tokens_per_second"] / b["tokens_per_second"] for r, b in pairs])
        lines.append(f"| {workload} | {n} | {mode} | {steps} | {speed} "
                     f"| {f'{_mean(probe):.0f}' if probe else '-'} | {f'{_mean(mae):.1f}' if mae else '-'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--n", default="16,64,256")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--train-batches", type=int, default=2)
    parser.add_argument("--probe-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--record", default="", help="write the tables into benchmarks/RESULTS.md as block NAME")
    parser.add_argument("--worker", nargs=4, metavar=("WORKLOAD", "MODE", "N", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        workload, mode, n, seed = args.worker
        print(json.dumps(worker(workload, mode, int(n), args.slots, int(seed), args.train_batches, args.probe_tokens,
                                args.threads)))
        return 0
    rows = []
    for workload in args.workloads.split(","):
        for n in [int(v) for v in args.n.split(",")]:
            for seed in [int(v) for v in args.seeds.split(",")]:
                for mode in args.modes.split(","):  # modes interleaved within a seed: drift hits all alike
                    done = subprocess.run([sys.executable, __file__, "--worker", workload, mode, str(n), str(seed),
                                           "--slots", str(args.slots), "--train-batches", str(args.train_batches),
                                           "--probe-tokens", str(args.probe_tokens), "--threads", str(args.threads)],
                                          capture_output=True, text=True)
                    if done.returncode:
                        print(f"{workload} {mode} n={n} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                        return done.returncode
                    rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                    r = rows[-1]
                    print(f"{workload} n={n} seed {seed} {mode}: {r['seconds']:.2f} s, {r['tokens_per_second']:.0f} "
                          f"tok/s, {r['decode_steps']} decode steps, peak +{r['peak_mb']:.1f} MB", flush=True)
                    if args.json:
                        args.json.write_text(json.dumps(rows, indent=1))
    tables = f"torch threads {args.threads}\n{table(rows)}\n{schedule_table(rows)}"
    print(tables)
    if args.record:
        record(args.record, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())

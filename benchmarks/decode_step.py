"""How far a decode step is from the machine's limit (#70): ms per decode step of podsrl's own
step (podsrl.rollout.decode_step), of the model's forward over a transformers DynamicCache (the
slots engine's other path, as every step before #70), and of transformers' ``generate``, beside
the step's two bounds computed in the same run:

* compute bound: the step's FLOPs (its linear layers and its attention over the KV length) at the
  matrix-multiply throughput measured here on the step's own linear shapes and rows;
* memory bound: the bytes a step must read (every weight once, every row's keys and values) at
  the read bandwidth measured here (a sum over a 256 MiB buffer).

Rows 16, 64, 256 (and 512 on a GPU), KV lengths 64 and 256, for tiny-chain, tiny and SmolLM2-135M.
Then the regime's own call: the slots engine on 16 chain prompts x 16 samples, tiny-chain,
256-token budget (configs/tiny-chain.yaml's generation), tokens per second on both paths, the
same seeds, interleaved. vLLM's CPU backend lives in its own environment (.venv-vllm): run
benchmarks/vllm_plain.py there for the peer's figure.

    python benchmarks/decode_step.py [--models tiny-chain,tiny,smollm2-135m-instruct] [--record NAME]

Targets (#70, this CPU): a step within 2x of the larger bound at 64 and 256 rows for tiny-chain and
SmolLM2-135M; the regime's tokens/s at least 3x the slots engine's at 3353d05 (that revision's
figure is measured with `--baseline-src` pointing at its src/, in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

from podsrl.models import load_model  # noqa: E402
from podsrl.rollout.decode_step import DecodeModel  # noqa: E402

ROWS, KV_LENGTHS = (16, 64, 256), (64, 256)
BOUND_TARGET = 2.0  # a step within 2x of the larger bound (#70)
REGIME_TARGET = 3.0  # the regime's tokens/s against the slots engine at 3353d05 (#70)


def timed(call, repeats: int, steps: int) -> float:
    """Median ms of one call over ``repeats`` runs of ``steps`` calls (one warm-up call first)."""
    call()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            call()
        runs.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(runs)


def read_bandwidth() -> float:
    """Bytes per second a sum over 256 MiB reads (the best of 5)."""
    buffer = torch.ones(64 * 2**20)
    buffer.sum()
    best = min(timed(buffer.sum, 1, 1) for _ in range(5))
    return buffer.numel() * 4 / (best / 1e3)


def shapes(config) -> tuple[list[tuple[int, int]], int, int]:
    """The step's linear shapes (in, out) per layer as the step runs them (q|k|v and gate|up
    fused), the vocabulary head's, and the layer count."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    layer = [(hidden, (heads + 2 * kv_heads) * d), (heads * d, hidden), (hidden, 2 * config.intermediate_size),
             (config.intermediate_size, hidden)]
    return layer, config.vocab_size, config.num_hidden_layers


def bounds(model, rows: int, kv: int, bandwidth: float) -> dict:
    """The step's compute and memory bounds (ms) at ``rows`` rows attending to ``kv`` columns."""
    config = model.config
    layer, vocab, layers = shapes(config)
    linear = [*layer * layers, (config.hidden_size, vocab)]
    seconds = 0.0
    for fan_in, fan_out in set(linear):  # the multiply rate on the step's own shapes
        x, w = torch.randn(rows, fan_in), torch.randn(fan_out, fan_in)
        seconds += timed(lambda: F.linear(x, w), 5, 5) / 1e3 * linear.count((fan_in, fan_out))
    linear_flops = sum(2 * rows * a * b for a, b in linear)
    rate = linear_flops / seconds
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention_flops = layers * rows * config.num_attention_heads * 2 * 2 * d * kv
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = layers * 2 * rows * config.num_key_value_heads * kv * d * 4
    return {"compute_ms": (linear_flops + attention_flops) / rate * 1e3, "memory_ms": (weight_bytes + kv_bytes)
            / bandwidth * 1e3, "gflops": rate / 1e9}


@torch.no_grad()
def podsrl_step(model, rows: int, kv: int, steps: int) -> float:
    step_model = DecodeModel(model)
    cache = step_model.new_cache(rows, kv + 2 * steps + 2)
    for tensor in cache.keys + cache.values:
        tensor.normal_()
    tokens = torch.randint(0, model.config.vocab_size, (rows,))
    position = torch.full((rows,), kv)
    return timed(lambda: step_model.step(cache, tokens, position), 3, steps)


@torch.no_grad()
def model_step(model, rows: int, kv: int, steps: int) -> float:
    """The model's forward over a DynamicCache of ``kv`` columns growing a column a step, as the
    slots engine's model path decodes (the cache is cut back after each timed run)."""
    config = model.config
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for index in range(config.num_hidden_layers):
        shape = (rows, config.num_key_value_heads, kv, d)
        cache.update(torch.randn(shape), torch.randn(shape), index)
    state = {"mask": torch.ones(rows, kv, dtype=torch.long)}
    tokens = torch.randint(0, config.vocab_size, (rows, 1))
    position = torch.full((rows, 1), kv)

    def call():
        state["mask"] = torch.cat([state["mask"], state["mask"].new_ones(rows, 1)], dim=1)
        model(input_ids=tokens, attention_mask=state["mask"], position_ids=position, past_key_values=cache,
              use_cache=True, logits_to_keep=1)
    return timed(call, 2, steps)


@torch.no_grad()
def generate_step(model, rows: int, kv: int, steps: int) -> float:
    """transformers' generate: (median time for 1 + 2 x steps new tokens - median time for 1) / (2 x steps):
    the prefill's time cancels out."""
    ids = torch.randint(1, model.config.vocab_size, (rows, kv))
    options = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def run(new: int) -> float:
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, **options)
        return time.perf_counter() - start
    run(2)
    longer, prefill = zip(*((run(1 + 2 * steps), run(1)) for _ in range(3)))
    return (statistics.median(longer) - statistics.median(prefill)) / (2 * steps) * 1e3


def step_table(models: list[str], steps: int, row_counts: tuple[int, ...] = ROWS,
               kv_lengths: tuple[int, ...] = KV_LENGTHS) -> tuple[str, list[dict]]:
    bandwidth = read_bandwidth()
    lines = [f"Read bandwidth measured: {bandwidth / 1e9:.1f} GB/s; threads: {torch.get_num_threads()} "
             "(the podsrl step at 1 thread in its own column).", "",
             "| model | rows | KV | podsrl ms | 1 thread | model forward ms | generate ms | compute bound | "
             "memory bound | podsrl / larger bound | forward / podsrl | generate / podsrl |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows_out = []
    for name in models:
        model = load_model(name).model.eval()
        positions = getattr(model.config, "max_position_embeddings", 10**6)
        for rows in row_counts:
            for kv in kv_lengths:
                bound = bounds(model, rows, kv, bandwidth)
                ours = podsrl_step(model, rows, kv, steps)
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                one = podsrl_step(model, rows, kv, steps)
                torch.set_num_threads(threads)
                forward = model_step(model, rows, kv, steps)
                generate = generate_step(model, rows, kv, steps)
                larger = max(bound["compute_ms"], bound["memory_ms"])
                past = " (past its positions)" if kv + steps > positions else ""
                rows_out.append(dict(model=name, rows=rows, kv=kv, ours=ours, larger=larger, forward=forward))
                lines.append(f"| {name}{past} | {rows} | {kv} | {ours:.2f} | {one:.2f} | {forward:.2f} | "
                             f"{generate:.2f} | {bound['compute_ms']:.2f} ({bound['gflops']:.0f} GFLOP/s) | "
                             f"{bound['memory_ms']:.2f} | {ours / larger:.2f}x | {forward / ours:.2f}x | "
                             f"{generate / ours:.2f}x |")
                print(lines[-1], flush=True)
        del model
    return "\n".join(lines), rows_out


REGIME = """
import json, sys, time, torch
from podsrl.models import load_model
from podsrl.tasks import prepare_split
from podsrl.tasks.chain import build_chain
from podsrl.rollout.slots import generate_in_slots
bundle = load_model("tiny-chain")
task = build_chain(level=3, num_test=10, seed=0)
split = prepare_split(task.train[:16], bundle.tokenizer, system_prompt="", use_chat_template=False,
                      max_prompt_tokens=512)
options = json.loads(sys.argv[1])
generate_in_slots(bundle.model, bundle.tokenizer, list(split.prompts)[:2], 4, max_new_tokens=256, **options)
for seed in range(int(sys.argv[2])):
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = generate_in_slots(bundle.model, bundle.tokenizer, list(split.prompts), 16, max_new_tokens=256, **options)
    print(json.dumps({"seconds": time.perf_counter() - start, "tokens": int(out.completion_mask.sum())}), flush=True)
"""


def regime(repeats: int, baseline_src: str) -> str:
    """tokens/s of the slots engine's call on the regime's settings, per arm (a fresh process each,
    arms interleaved round by round)."""
    arms = {"podsrl step": ({"decode_path": "podsrl"}, None), "model forward": ({"decode_path": "model"}, None)}
    if baseline_src:
        arms["slots engine at 3353d05"] = ({}, baseline_src)
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm, (options, src) in arms.items():
            env = {**os.environ, **({"PYTHONPATH": src} if src else {})}
            out = subprocess.run([sys.executable, "-c", REGIME, json.dumps(options), "2"], capture_output=True,
                                 text=True, env=env, check=True).stdout
            rates[arm] += [r["tokens"] / r["seconds"] for r in map(json.loads, out.splitlines())]
    reference = statistics.median(rates.get("slots engine at 3353d05") or rates["model forward"])
    lines = ["| slots engine, 16 chain prompts x 16, tiny-chain, 256-token budget | tokens/s (median) | range | "
             "against the reference |", "|---|---|---|---|"]
    for arm, values in rates.items():
        lines.append(f"| {arm} | {statistics.median(values):.0f} | {min(values):.0f}-{max(values):.0f} | "
                     f"{statistics.median(values) / reference:.2f}x |")
    name = "3353d05" if baseline_src else "the model forward (no --baseline-src given)"
    lines.append(f"\nReference: {name}; target {REGIME_TARGET:g}x.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-chain,tiny,smollm2-135m-instruct",
                        help="'' = only the regime's call (SmolLM2's 256 x 256 cell alone takes ~20 min on 2 cores)")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per timed run")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts (a GPU adds 512)")
    parser.add_argument("--kv", default=",".join(map(str, KV_LENGTHS)), help="KV lengths")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the regime's call per arm")
    parser.add_argument("--baseline-src", default="", help="src/ of a checkout of 3353d05, for its slots engine")
    parser.add_argument("--skip-regime", action="store_true")
    parser.add_argument("--record", default="", help="write the tables into benchmarks/RESULTS.md under this name")
    args = parser.parse_args(argv)
    body = ""
    if args.models:
        body = steps_block(args)
    if not args.skip_regime:
        body += "\n\n" + regime(args.repeats, args.baseline_src)
    print(body)
    if args.record:
        record(args.record, f"`python benchmarks/decode_step.py {' '.join(argv or sys.argv[1:])}`\n\n{body}")
    return 0


def steps_block(args) -> str:
    """The step table and its verdict on #70's bound target."""
    table, rows = step_table(args.models.split(","), args.steps, tuple(map(int, args.rows.split(","))),
                             tuple(map(int, args.kv.split(","))))
    checked = [r for r in rows if r["model"] in ("tiny-chain", "smollm2-135m-instruct") and r["rows"] in (64, 256)]
    misses = [f"{r['model']} {r['rows']} rows x {r['kv']} KV at {r['ours'] / r['larger']:.1f}x" for r in checked
              if r["ours"] > BOUND_TARGET * r["larger"]]
    verdict = (f"Target: within {BOUND_TARGET:g}x of the larger bound at 64 and 256 rows (tiny-chain, SmolLM2): "
               f"{len(checked) - len(misses)} of {len(checked)} cells met"
               + (f"; missed: {'; '.join(misses)}." if misses else "."))
    return f"{table}\n\n{verdict}"


if __name__ == "__main__":
    sys.exit(main())

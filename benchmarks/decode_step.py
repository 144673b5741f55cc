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
same seeds, interleaved; with ``--vllm-python .venv-vllm/bin/python`` also on vLLM's CPU backend
(podsrl's vllm engine, eager and compiled: the peer at its best), a fresh process each.

    python benchmarks/decode_step.py [--models tiny-chain,tiny,smollm2-135m-instruct] [--device cuda]
        [--vllm-python .venv-vllm/bin/python] [--baseline-src SRC] [--record NAME]

Targets (#70, this CPU): a step within 2x of the larger bound at 64 and 256 rows for tiny-chain and
SmolLM2-135M; the regime's tokens/s at least 3x the slots engine's at 3353d05 (that revision's
figure is measured with `--baseline-src` pointing at its src/, in the same run); at least 1.5x vLLM's
CPU backend's tokens/s on the same call. On a GPU (benchmarks/gpu_kit.py decode): tiny-chain at 256
rows at most 0.5 ms a step, SmolLM2-135M at 512 rows at most 5 ms.
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
from podsrl.rollout.decode_step import DecodeModel, GraphedStep  # noqa: E402

ROWS, KV_LENGTHS = (16, 64, 256), (64, 256)
BOUND_TARGET = 2.0  # a step within 2x of the larger bound (#70)
GPU_TARGETS = {("tiny-chain", 256): 0.5, ("smollm2-135m-instruct", 512): 5.0}  # (model, rows): most ms a step (#70)
REGIME_TARGET = 3.0  # the regime's tokens/s against the slots engine at 3353d05 (#70)
PEER_TARGET = 1.5  # the regime's tokens/s against vLLM's CPU backend at its best (#70)


DEVICE = torch.device("cpu")  # --device: where every arm and bound runs


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def timed(call, repeats: int, steps: int) -> float:
    """Median ms of one call over ``repeats`` runs of ``steps`` calls (one warm-up call first;
    on a GPU, each run waits for its kernels)."""
    call()
    runs = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            call()
        sync()
        runs.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(runs)


def read_bandwidth() -> float:
    """Bytes per second a sum over 256 MiB reads (the best of 5)."""
    buffer = torch.ones(64 * 2**20, device=DEVICE)
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
    config, dtype = model.config, model.dtype
    layer, vocab, layers = shapes(config)
    linear = [*layer * layers, (config.hidden_size, vocab)]
    seconds = 0.0
    for fan_in, fan_out in set(linear):  # the multiply rate on the step's own shapes
        x, w = torch.randn(rows, fan_in, device=DEVICE, dtype=dtype), torch.randn(fan_out, fan_in, device=DEVICE,
                                                                                   dtype=dtype)
        seconds += timed(lambda: F.linear(x, w), 5, 5) / 1e3 * linear.count((fan_in, fan_out))
    linear_flops = sum(2 * rows * a * b for a, b in linear)
    rate = linear_flops / seconds
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention_flops = layers * rows * config.num_attention_heads * 2 * 2 * d * kv
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = layers * 2 * rows * config.num_key_value_heads * kv * d * dtype.itemsize
    return {"compute_ms": (linear_flops + attention_flops) / rate * 1e3, "memory_ms": (weight_bytes + kv_bytes)
            / bandwidth * 1e3, "gflops": rate / 1e9}


@torch.no_grad()
def podsrl_step(model, rows: int, kv: int, steps: int, graphed: bool = False, compiled: bool = False) -> float:
    """podsrl's step at ``rows`` rows attending to ``kv`` columns; ``graphed``: replayed as a CUDA
    graph (:class:`GraphedStep`, over the cache's whole width); ``compiled``: under torch.compile
    (the decode path 'compiled'). Capture and compile happen in the untimed warm-up."""
    step_model = DecodeModel(model)
    cache = step_model.new_cache(rows, kv + 2)
    for tensor in cache.keys + cache.values:
        tensor.normal_()
    tokens = torch.randint(0, model.config.vocab_size, (rows,), device=DEVICE)
    position = torch.full((rows,), kv, device=DEVICE)
    if graphed:
        step = GraphedStep(step_model, cache)
        return timed(lambda: step(tokens, position), 3, steps)
    return timed(lambda: step_model.step(cache, tokens, position, compiled=compiled), 3, steps)


@torch.no_grad()
def model_step(model, rows: int, kv: int, steps: int) -> float:
    """The model's forward over a DynamicCache of ``kv`` columns growing a column a step, as the
    slots engine's model path decodes (the cache is cut back after each timed run)."""
    config = model.config
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for index in range(config.num_hidden_layers):
        shape = (rows, config.num_key_value_heads, kv, d)
        cache.update(*(torch.randn(shape, device=DEVICE, dtype=model.dtype) for _ in range(2)), index)
    state = {"mask": torch.ones(rows, kv, dtype=torch.long, device=DEVICE)}
    tokens = torch.randint(0, config.vocab_size, (rows, 1), device=DEVICE)
    position = torch.full((rows, 1), kv, device=DEVICE)

    def call():
        state["mask"] = torch.cat([state["mask"], state["mask"].new_ones(rows, 1)], dim=1)
        model(input_ids=tokens, attention_mask=state["mask"], position_ids=position, past_key_values=cache,
              use_cache=True, logits_to_keep=1)
    return timed(call, 2, steps)


@torch.no_grad()
def generate_step(model, rows: int, kv: int, steps: int) -> float:
    """transformers' generate: (median time for 1 + 2 x steps new tokens - median time for 1) / (2 x steps):
    the prefill's time cancels out."""
    ids = torch.randint(1, model.config.vocab_size, (rows, kv), device=DEVICE)
    options = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def run(new: int) -> float:
        sync()
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, **options)
        sync()
        return time.perf_counter() - start
    run(2)
    longer, prefill = zip(*((run(1 + 2 * steps), run(1)) for _ in range(3)))
    return (statistics.median(longer) - statistics.median(prefill)) / (2 * steps) * 1e3


def other_arms(compiled: bool) -> dict:
    """The podsrl step's other columns, by name: replayed as a CUDA graph on a GPU; at 1 thread
    and (``compiled``) under torch.compile on a CPU. Each is a function of (model, rows, kv, steps)."""
    if DEVICE.type == "cuda":
        return {"CUDA graph": lambda *cell: podsrl_step(*cell, graphed=True)}
    arms = {"1 thread": one_thread}
    if compiled:
        arms["compiled"] = lambda *cell: podsrl_step(*cell, compiled=True)
    return arms


def one_thread(model, rows: int, kv: int, steps: int) -> float:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return podsrl_step(model, rows, kv, steps)
    finally:
        torch.set_num_threads(threads)


def step_table(models: list[str], steps: int, row_counts: tuple[int, ...] = ROWS,
               kv_lengths: tuple[int, ...] = KV_LENGTHS, dtype: torch.dtype = torch.float32,
               compiled: bool = True) -> tuple[str, list[dict]]:
    """The table of ms per step, and its cells. ``podsrl`` in the ratios is the fastest of the
    podsrl step's paths a run can choose (eager, compiled, CUDA graph), not the 1-thread column
    (threads are podsrl's own choice, shown to check a step is not slower with more)."""
    bandwidth = read_bandwidth()
    gpu = DEVICE.type == "cuda"
    others = other_arms(compiled)
    chosen = [name for name in others if name != "1 thread"]
    where = torch.cuda.get_device_name(DEVICE) if gpu else f"threads: {torch.get_num_threads()}"
    lines = [f"Read bandwidth measured: {bandwidth / 1e9:.1f} GB/s; {where}; weights and cache in {dtype} "
             f"(the podsrl step's other paths in their own columns: {', '.join(others)}; the ratios take the "
             f"podsrl step at its fastest of eager{''.join(', ' + name for name in chosen)}"
             f"{', compile time excluded' if 'compiled' in others else ''}).", "",
             f"| model | rows | KV | podsrl ms | {' | '.join(others)} | model forward ms | generate ms | "
             "compute bound | memory bound | podsrl / larger bound | forward / podsrl | generate / podsrl |",
             "|---|---|---|---|" + "---|" * len(others) + "---|---|---|---|---|---|---|"]
    rows_out = []
    for name in models:
        model = load_model(name).model.eval().to(DEVICE, dtype)
        positions = getattr(model.config, "max_position_embeddings", 10**6)
        for rows in row_counts:
            for kv in kv_lengths:
                bound = bounds(model, rows, kv, bandwidth)
                eager = podsrl_step(model, rows, kv, steps)
                times = {name: arm(model, rows, kv, steps) for name, arm in others.items()}
                ours = min([eager, *(times[name] for name in chosen)])
                forward = model_step(model, rows, kv, steps)
                generate = generate_step(model, rows, kv, steps)
                larger = max(bound["compute_ms"], bound["memory_ms"])
                past = " (past its positions)" if kv + steps > positions else ""
                rows_out.append(dict(model=name, rows=rows, kv=kv, ours=ours, larger=larger, forward=forward))
                columns = "".join(f" {value:.2f} |" for value in times.values())
                lines.append(f"| {name}{past} | {rows} | {kv} | {eager:.2f} |{columns} {forward:.2f} | "
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
from podsrl.rollout.slots import SlotsOptions, generate_in_slots
bundle = load_model("tiny-chain")
task = build_chain(level=3, num_test=10, seed=0)
split = prepare_split(task.train[:16], bundle.tokenizer, system_prompt="", use_chat_template=False,
                      max_prompt_tokens=512)
options = json.loads(sys.argv[1])
if options.pop("engine", "") == "vllm":  # the peer: vLLM's CPU backend through podsrl's vllm engine
    from podsrl.rollout import Sampling
    from podsrl.rollout.vllm import VLLMEngine, VLLMOptions
    engine = VLLMEngine(VLLMOptions(max_completion_length=256, max_prompt_tokens=512, **options))
    def generate(prompts, n):
        return engine.generate(bundle.model, bundle.tokenizer, prompts, n, Sampling(256))
elif "max_completion_length" in SlotsOptions.__dataclass_fields__:  # the call's options as one object (#71)
    def generate(prompts, n):
        return generate_in_slots(bundle.model, bundle.tokenizer, prompts, n,
                                 SlotsOptions(max_completion_length=256, **options))
else:  # 3353d05, the reference: the options as keywords
    def generate(prompts, n):
        return generate_in_slots(bundle.model, bundle.tokenizer, prompts, n, max_new_tokens=256, **options)
generate(list(split.prompts)[:2], 4)
for seed in range(int(sys.argv[2])):
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = generate(list(split.prompts), 16)
    print(json.dumps({"seconds": time.perf_counter() - start, "tokens": int(out.completion_mask.sum())}), flush=True)
"""


def regime(repeats: int, baseline_src: str, vllm_python: str = "", vllm_compiled: bool = False) -> str:
    """tokens/s of the slots engine's call on the regime's settings, per arm (a fresh process each,
    arms interleaved round by round); with ``vllm_python`` (an interpreter with vLLM, e.g.
    .venv-vllm/bin/python) the same call on vLLM's CPU backend, eager (its best on this project's
    CPUs: compilation cost 200 s at start-up for no measured speed, docs/generation.md) and, with
    ``vllm_compiled``, compiled too."""
    here = str(Path(__file__).resolve().parents[1] / "src")
    arms = {"podsrl step": ({"decode_path": "podsrl"}, None, sys.executable),
            "podsrl step, compiled (compile paid in the untimed warm-up)": ({"decode_path": "compiled"}, None,
                                                                            sys.executable),
            "model forward": ({"decode_path": "model"}, None, sys.executable)}
    if baseline_src:
        arms["slots engine at 3353d05"] = ({}, baseline_src, sys.executable)
    if vllm_python:
        for eager in (True, False)[:2 if vllm_compiled else 1]:
            arms[f"vLLM CPU backend ({'eager' if eager else 'compiled'})"] = (
                {"engine": "vllm", "enforce_eager": eager}, here, vllm_python)
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm, (options, src, python) in arms.items():
            env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", **({"PYTHONPATH": src} if src else {})}
            out = subprocess.run([python, "-c", REGIME, json.dumps(options), "2"], capture_output=True,
                                 text=True, env=env, check=True).stdout
            rates[arm] += [r["tokens"] / r["seconds"] for r in map(json.loads, out.splitlines())]
    reference = statistics.median(rates.get("slots engine at 3353d05") or rates["model forward"])
    lines = ["| the regime's call, 16 chain prompts x 16, tiny-chain, 256-token budget | tokens/s (median) | range | "
             "against the reference |", "|---|---|---|---|"]
    for arm, values in rates.items():
        lines.append(f"| {arm} | {statistics.median(values):.0f} | {min(values):.0f}-{max(values):.0f} | "
                     f"{statistics.median(values) / reference:.2f}x |")
    name = "3353d05" if baseline_src else "the model forward (no --baseline-src given)"
    lines.append(f"\nReference: {name}; target {REGIME_TARGET:g}x.")
    peers = {arm: statistics.median(values) for arm, values in rates.items() if arm.startswith("vLLM")}
    if peers:
        best = max(peers, key=peers.get)
        ours = max((a for a in rates if a.startswith("podsrl step")), key=lambda a: statistics.median(rates[a]))
        ratio = statistics.median(rates[ours]) / peers[best]
        lines.append(f"Against the peer at its best ({best}): {ours} {ratio:.2f}x its tokens/s; target "
                     f"{PEER_TARGET:g}x: {'met' if ratio >= PEER_TARGET else 'MISSED'}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-chain,tiny,smollm2-135m-instruct",
                        help="'' = only the regime's call (SmolLM2's 256 x 256 cell alone takes ~20 min on 2 cores)")
    parser.add_argument("--steps", type=int, default=8, help="decode steps per timed run")
    parser.add_argument("--rows", default="", help="row counts (default 16,64,256, and 512 on a GPU)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the regime's call runs on the CPU only)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--kv", default=",".join(map(str, KV_LENGTHS)), help="KV lengths")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the regime's call per arm")
    parser.add_argument("--baseline-src", default="", help="src/ of a checkout of 3353d05, for its slots engine")
    parser.add_argument("--vllm-python", default="", help="an interpreter with vLLM (.venv-vllm/bin/python): the "
                        "regime's call on vLLM's CPU backend too, the peer")
    parser.add_argument("--vllm-compiled", action="store_true", help="vLLM compiled as well as eager")
    parser.add_argument("--skip-regime", action="store_true")
    parser.add_argument("--no-compiled", action="store_true", help="leave out the step table's compiled column "
                        "(on a CPU it costs one compile per model, ~25 s for tiny-chain)")
    parser.add_argument("--record", default="", help="write the tables into benchmarks/RESULTS.md under this name")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU here (torch.cuda.is_available() is False)")
    args.rows = args.rows or ",".join(map(str, ROWS + ((512,) if DEVICE.type == "cuda" else ())))
    body = ""
    if args.models:
        body = steps_block(args)
    if not args.skip_regime:
        body += "\n\n" + regime(args.repeats, args.baseline_src, args.vllm_python, args.vllm_compiled)
    print(body)
    if args.record:
        record(args.record, f"`python benchmarks/decode_step.py {' '.join(argv or sys.argv[1:])}`\n\n{body}")
    return 0


def steps_block(args) -> str:
    """The step table and its verdict on #70's bound target."""
    table, rows = step_table(args.models.split(","), args.steps, tuple(map(int, args.rows.split(","))),
                             tuple(map(int, args.kv.split(","))), getattr(torch, args.dtype),
                             compiled=not args.no_compiled)
    checked = [r for r in rows if r["model"] in ("tiny-chain", "smollm2-135m-instruct") and r["rows"] in (64, 256)]
    misses = [f"{r['model']} {r['rows']} rows x {r['kv']} KV at {r['ours'] / r['larger']:.1f}x" for r in checked
              if r["ours"] > BOUND_TARGET * r["larger"]]
    verdict = (f"Target: within {BOUND_TARGET:g}x of the larger bound at 64 and 256 rows (tiny-chain, SmolLM2): "
               f"{len(checked) - len(misses)} of {len(checked)} cells met"
               + (f"; missed: {'; '.join(misses)}." if misses else "."))
    if DEVICE.type == "cuda":
        verdict += "\n\n" + gpu_verdict(rows)
    return f"{table}\n\n{verdict}"


def gpu_verdict(rows: list[dict]) -> str:
    """#70's GPU targets: ms a decode step at the rows named, at every KV length measured."""
    lines = []
    for (model, count), most in GPU_TARGETS.items():
        cells = [r for r in rows if r["model"] == model and r["rows"] == count]
        if not cells:
            lines.append(f"- {model} at {count} rows (at most {most:g} ms a step): not measured in this run")
            continue
        times = ", ".join(f"{r['ours']:.2f} ms at KV {r['kv']}" for r in cells)
        met = all(r["ours"] <= most for r in cells)
        lines.append(f"- {model} at {count} rows, at most {most:g} ms a step: {'met' if met else 'MISSED'} ({times})")
    return "GPU targets:\n" + "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

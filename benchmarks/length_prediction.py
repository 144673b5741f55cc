"""How much could the length-aware schedule save, and how much does its length prediction allow?

Collects the completions of a generation_memory.py workload (--workload; the default,
smollm2-chat: SmolLM2-135M-Instruct chat completions of level-1 arithmetic prompts, lengths 3
to 96 tokens; chain: tiny-chain's worked chains, 20-240 tokens; smollm2-gsm8k-256: SmolLM2
on real GSM8K questions with 256-token budgets), --batches batches of the workload's prompts x
--n samples, then replays them offline for each probe length k:

* prediction: the PrefixLengthPredictor (generation_schedule length_aware) trained on the
  batches before each test batch, as in a run; its mean absolute error on the remaining
  length against predicting the training mean, and its R^2 against that mean
  (1 - squared error / the mean's squared error: 0 = no skill, 1 = exact);
* decode steps of the batch on --slots slots: fifo continuous refill (the samples in their
  order), and the plan (probe, then lanes balanced by predicted length, shortest first)
  with the predictor's lengths and with the true ones (the ceiling a perfect predictor
  would reach). A deterministic simulation of the engine's scheduling: each busy slot
  decodes one token per step, a sample's first token comes from its prompt's prefill.

    python benchmarks/length_prediction.py [--workload smollm2-chat] [--batches 8] [--n 32] [--slots 16]
        [--probes 2,4,8,16] [--max_new_tokens N] [--record NAME]
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
from pathlib import Path

import torch

from podsrl.models import load_model
from podsrl.rollout import SlotsOptions, generate_in_slots
from podsrl.rollout.lanes import balance_lanes
from podsrl.rollout.schedule import LaneQueue, PrefixLengthPredictor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation_memory import WORKLOADS, _prompts  # noqa: E402 (benchmarks/ is not a package)
from results_md import record  # noqa: E402


def collect(workload: str, batches: int, n: int, max_new_tokens: int) -> list[list[tuple[list[int], list[int]]]]:
    """Per batch, (prompt tokens, completion tokens) of every sample."""
    model_name, source, prompts_per_batch, _ = WORKLOADS[workload]
    bundle = load_model(model_name)
    out = []
    for batch in range(batches):
        prompts = _prompts(source, bundle.tokenizer, prompts_per_batch, offset=prompts_per_batch * batch)
        torch.manual_seed(batch)
        options = SlotsOptions(max_completion_length=max_new_tokens, temperature=1.0, micro_group=64)
        rollouts = generate_in_slots(bundle.model, bundle.tokenizer, prompts, n, options)
        samples = []
        for p in range(len(prompts)):
            prompt = rollouts.prompt_ids[p][rollouts.prompt_mask[p].bool()].tolist()
            samples += [(prompt, rollouts.completion_ids[p, j][rollouts.completion_mask[p, j].bool()].tolist())
                        for j in range(n)]
        out.append(samples)
        print(f"batch {batch}: mean length {statistics.fmean(len(c) for _, c in samples):.1f}", flush=True)
    return out


def probe_features(predictor: PrefixLengthPredictor, samples, k: int):
    """The paused samples' features [N, F] (grouped by prompt, in order) and remaining lengths [N]."""
    rows, remaining = [], []
    for prompt in dict.fromkeys(tuple(p) for p, _ in samples):
        own = [c for p, c in samples if tuple(p) == prompt]
        paused = [c for c in own if len(c) > k]
        if paused:
            share = 1 - len(paused) / len(own)
            rows.append(predictor.features(list(prompt), [c[:k] for c in paused], [share] * len(paused)))
            remaining += [len(c) - k for c in paused]
    return torch.cat(rows), torch.tensor(remaining, dtype=torch.float64)


def fifo_steps(lengths: list[int], slots: int) -> int:
    """Continuous refill in the given order: each sample takes the slot that frees first."""
    free = [0] * slots
    for length in lengths:
        heapq.heappush(free, heapq.heappop(free) + max(length - 1, 0))
    return max(free)


def lane_steps(remaining: list[int], predicted: list[float], slots: int) -> int:
    """Stage 2 of the plan: lanes balanced by ``predicted``, each run shortest first, through
    the engine's own LaneQueue (a freed slot reports its sample and takes the next)."""
    samples = [(0, i) for i in range(len(remaining))]
    lanes = max(1, min(slots, len(samples)))
    queue = LaneQueue(samples, predicted, balance_lanes(predicted, lanes), lanes)
    rows, steps = [], 0
    while len(queue) and len(rows) < lanes:
        sample = queue.pop()
        rows.append([sample, remaining[sample[1]]])
    while rows:
        steps += 1
        for row in rows:
            row[1] -= 1
        for row in [r for r in rows if r[1] <= 0]:
            queue.record(*row[0], 0)
            if len(queue):
                row[0] = queue.pop()
                row[1] = remaining[row[0][1]]
        rows = [r for r in rows if r[1] > 0]
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--probes", default="2,4,8,16")
    parser.add_argument("--max_new_tokens", type=int, default=0, help="0 = the workload's")
    parser.add_argument("--workload", default="smollm2-chat", choices=sorted(WORKLOADS))
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    model_name, _, prompts_per_batch, workload_tokens = WORKLOADS[args.workload]
    max_new_tokens = args.max_new_tokens or workload_tokens
    data = collect(args.workload, args.batches, args.n, max_new_tokens)
    lengths = sorted(len(c) for batch in data for _, c in batch)
    quantile = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
    lines = [f"{args.workload} ({model_name}), {args.batches} batches x {prompts_per_batch} prompts x n = {args.n}, "
             f"up to {max_new_tokens} tokens, {args.slots} slots; lengths median {quantile(0.5)}, p90 "
             f"{quantile(0.9)}, p99 {quantile(0.99)}, max {lengths[-1]}; each batch from the 3rd on predicted by a "
             f"predictor trained on the batches before it (means over those batches)", "",
             "| probe k | MAE of remaining length (tokens) | MAE of the training mean | R^2 vs the mean "
             "| decode steps: fifo | plan, predicted lengths | plan, true lengths | predicted vs fifo | true vs fifo |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in [int(v) for v in args.probes.split(",")]:
        mae, baseline, r2, fifo, planned, ceiling = [], [], [], [], [], []
        for test in range(2, len(data)):
            predictor = PrefixLengthPredictor()
            for batch in data[:test]:
                predictor.update(*probe_features(predictor, batch, k))
            train_mean = float(torch.cat([probe_features(predictor, b, k)[1] for b in data[:test]]).mean())
            features, remaining = probe_features(predictor, data[test], k)
            predicted = predictor.predict(features).clamp(0, max_new_tokens - k)
            mae.append(float((predicted - remaining).abs().mean()))
            baseline.append(float((remaining - train_mean).abs().mean()))
            r2.append(1 - float(((predicted - remaining) ** 2).mean() / ((remaining - train_mean) ** 2).mean()))
            lengths = [len(c) for _, c in data[test]]
            probe = fifo_steps([min(length, k) for length in lengths], args.slots)
            fifo.append(fifo_steps(lengths, args.slots))
            true = [int(r) for r in remaining]
            planned.append(probe + lane_steps(true, predicted.tolist(), args.slots))
            ceiling.append(probe + lane_steps(true, [float(r) for r in true], args.slots))
        mean = statistics.fmean
        lines.append(f"| {k} | {mean(mae):.1f} | {mean(baseline):.1f} | {mean(r2):.2f} | {mean(fifo):.0f} | "
                     f"{mean(planned):.0f} | "
                     f"{mean(ceiling):.0f} | {mean(planned) / mean(fifo):.2f} | {mean(ceiling) / mean(fifo):.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.record:
        record(args.record, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

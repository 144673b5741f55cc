"""Can a quality head tell, from a running sample's hidden states, how it will end, early enough
to prune it? Generation only (#72 item 3): the head's skill against length on a workload, and
what quota-aware pruning would have saved and cost on the same samples.

Each batch's prompts are sampled n times on the slots engine and scored by the task's
correctness (the label: 1 = correct). The policy's last hidden state (the one the logits come
from) at every completion position is recomputed by one teacher-forced forward of prompt and
completion: the states the decoder had when the sample held k tokens are those of its inputs,
the prompt's last token and completion tokens 0..k-2. Pooled two ways, the mean over those k
states and the last one, at absolute lengths and at fractions of the expected length (the mean
completion length of the batches before).

Prequential, as a run would learn: batch b is scored by a head (podsrl.algorithms.quality_head)
that learned from batches < b only; then it learns batch b. Skill is reported over batches from
--warmup on, on the samples still running at each point: AUC, calibration error, the share the
head is sure of (calibrated probability >= --threshold either way) and how often it is wrong then.

Pruning, simulated on the same samples. In lockstep (prune_running at each relative point in
turn, a group's samples taken to start together, so at length k a sample of length <= k has
finished). Then on the slots engine's schedule replayed with the samples' true lengths and
classes (--slots slots, round_robin, continuous refill), arm by arm: all n; lossless early stop;
early stop with prune_running (a class's places filled by finished samples, #72 as specified)
and with prune_trusting_sure (places filled by sure running samples too; a settled group starts
no more samples), each by the head and by a head always right and sure (the rule's ceiling).
Per arm: tokens decoded, decode steps, samples generated whole, and the kept set as the trainer
selects it (max_variance over the generated samples): its mean length and reward variance,
paired by group against early stop alone.

    python benchmarks/quality_head_skill.py [--workload chain|smollm2-gsm8k-256] [--batches 8]
        [--n 16] [--m 4] [--points 0.25,0.5] [--threshold 0.8] [--record NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from podsrl.algorithms.pruning import prune_running, prune_trusting_sure
from podsrl.algorithms.quality_head import QualityHead, auc, calibration_error
from podsrl.algorithms.quality_head import statistics as head_statistics
from podsrl.algorithms.select import Groups, max_variance, select
from podsrl.experiments.stats import mean_ci
from podsrl.models import load_model
from podsrl.rollout import SlotsOptions, generate_in_slots
from podsrl.scoring import Scorer, ScoringOptions
from podsrl.tasks import TaskOptions, build_task, prepare_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

SHARED_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"
# workload -> (model, prompts per batch, completion budget)
WORKLOADS = {"chain": ("tiny-chain", 8, 256), "smollm2-gsm8k-256": ("smollm2-135m-instruct", 4, 256)}
ABSOLUTE = (8, 16, 32, 64, 128)


def task_of(workload: str):
    if workload == "chain":
        return build_task(TaskOptions(task="chain", task_level=3))
    if not SHARED_GSM8K.is_file():
        raise SystemExit(f"{workload}: needs the GSM8K file {SHARED_GSM8K} (../shared/data)")
    return build_task(TaskOptions(task="gsm8k", train_data=str(SHARED_GSM8K), test_data=str(SHARED_GSM8K)))


def batch_samples(bundle, task, scorer, workload: str, batch: int, args) -> dict:
    """One batch: completions, labels [P, n], lengths [P, n] and the last hidden state of every
    completion input position, per sample [k_max, d]."""
    _, prompts, budget = WORKLOADS[workload]
    examples = task.train[batch * prompts:(batch + 1) * prompts]
    split = prepare_split(examples, bundle.tokenizer, system_prompt=task.system_prompt, use_chat_template=True,
                          max_prompt_tokens=512)
    torch.manual_seed(1000 + batch)
    options = SlotsOptions(max_completion_length=budget, micro_group=args.slots, schedule="round_robin")
    start = time.perf_counter()
    rollouts = generate_in_slots(bundle.model, bundle.tokenizer, split.prompts, args.n, options)
    seconds = time.perf_counter() - start
    labels = scorer(split, rollouts).correct.nan_to_num(0.0).round().long()  # [P, n]
    lengths = rollouts.completion_mask.sum(-1)  # [P, n]
    states = []  # [P][n]: [length, d]
    with torch.no_grad():
        for p in range(len(examples)):
            prompt = rollouts.prompt_ids[p][rollouts.prompt_mask[p].bool()]  # [Lp]
            row = []
            for s in range(args.n):
                completion = rollouts.completion_ids[p, s, :int(lengths[p, s])]
                ids = torch.cat([prompt, completion])[None]  # [1, Lp + L]
                hidden = bundle.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]  # [Lp + L, d]
                row.append(hidden[len(prompt) - 1:len(prompt) - 1 + len(completion)].double())  # [L, d]
            states.append(row)
    return {"labels": labels, "lengths": lengths, "states": states, "seconds": seconds}


def pooled(states, k: int, pooling: str) -> torch.Tensor:
    """What the decoder holds of a sample at k tokens: its first k input states, pooled -> [d]."""
    return states[:k].mean(0) if pooling == "mean" else states[k - 1]


def running_at(batch: dict, k: int, pooling: str):
    """The samples still running at length k: (prompt, sample) pairs, features [S, d], labels [S]."""
    pairs = [(p, s) for p in range(batch["lengths"].shape[0]) for s in range(batch["lengths"].shape[1])
             if int(batch["lengths"][p, s]) > k]
    if not pairs:
        return pairs, None, None
    features = torch.stack([pooled(batch["states"][p][s], k, pooling) for p, s in pairs])
    labels = torch.tensor([int(batch["labels"][p, s]) for p, s in pairs])
    return pairs, features, labels


def skill_table(batches: list[dict], points: list[tuple[str, callable]], pooling: str, args) -> tuple[list, dict]:
    """Prequential skill at each point; returns the table rows and, per batch, the calibrated
    probabilities of the relative points (for the pruning simulation)."""
    dim = batches[0]["states"][0][0].shape[1]
    head = QualityHead(dim, len(points), decay=args.decay, ridge=args.ridge)
    measured = {name: {"scores": [], "probability": [], "labels": []} for name, _ in points}
    probabilities = []  # per batch: {point name: {(p, s): probability}}
    for index, batch in enumerate(batches):
        added, here = [], {}
        for j, (name, length_of) in enumerate(points):
            k = length_of(index)
            pairs, features, labels = running_at(batch, k, pooling)
            if features is None:
                added.append(head_statistics(torch.zeros(0, dim, dtype=torch.float64), torch.zeros(0),
                                             torch.zeros(0), head.bins))
                here[name] = {}
                continue
            scores = head.scores(j, features)
            probability = head.calibrated(j, scores)
            here[name] = dict(zip(pairs, probability.tolist()))
            if index >= args.warmup:
                for key, value in (("scores", scores), ("probability", probability), ("labels", labels)):
                    measured[name][key].append(value)
            added.append(head_statistics(features, scores, labels, head.bins))
        head.absorb(added)
        probabilities.append(here)
    rows = []
    for name, _ in points:
        if not measured[name]["labels"]:
            rows.append((name, 0, float("nan"), float("nan"), float("nan"), float("nan"), float("nan")))
            continue
        scores, probability, labels = (torch.cat(measured[name][key]) for key in ("scores", "probability", "labels"))
        sure = (probability >= args.threshold) | (probability <= 1 - args.threshold)
        wrong = ((probability >= 0.5).long() != labels) & sure
        rows.append((name, len(labels), float(labels.double().mean()), auc(scores, labels),
                     calibration_error(probability, labels), float(sure.double().mean()),
                     float(wrong.sum()) / max(1, int(sure.sum()))))
    return rows, probabilities


def simulate_pruning(batch: dict, probabilities: dict, lengths_at: list[int], args) -> dict:
    """Quota-aware pruning at each relative point in turn on one batch (the head's calibrated
    probabilities per point), against the same samples unpruned."""
    labels, lengths = batch["labels"], batch["lengths"]  # [P, n]
    pruned = torch.zeros_like(labels, dtype=torch.bool)
    saved, wrong = 0, 0
    for name, k in lengths_at:
        running = [(p, s) for (p, s) in probabilities.get(name, {}) if not pruned[p, s]]
        if not running:
            continue
        finished = torch.zeros(labels.shape[0], 2, dtype=torch.long)
        done = (lengths <= k) & ~pruned  # [P, n]
        finished[:, 1] = (done & (labels == 1)).sum(1)
        finished[:, 0] = (done & (labels == 0)).sum(1)
        group = torch.tensor([p for p, _ in running])
        probability = torch.tensor([probabilities[name][pair] for pair in running], dtype=torch.float64)
        flags = prune_running(finished, group, probability, args.m, args.threshold).tolist()
        for (p, s), flag, q in zip(running, flags, probability.tolist()):
            if flag:
                pruned[p, s] = True
                saved += int(lengths[p, s]) - k
                wrong += int((q >= 0.5) != bool(labels[p, s]))
    rewards = labels.double()
    full = max_variance(rewards, args.m)  # [P, m]
    kept = select("max_variance", Groups(rewards.masked_fill(pruned, float("nan")), ~pruned), args.m)  # the trainer's
    variance = {arm: rewards.gather(1, keep).var(dim=1, correction=0) for arm, keep in (("full", full), ("kept", kept))}
    length = {arm: lengths.gather(1, keep).double().mean(1) for arm, keep in (("full", full), ("kept", kept))}
    return {"pruned": int(pruned.sum()), "wrong": wrong, "saved": saved, "tokens": int(lengths.sum()),
            "samples": labels.numel(), "variance": variance, "length": length}


def schedule(batch: dict, probabilities: dict, lengths_at: list[tuple[str, int]], args, early_stop: bool,
             prune: str) -> dict:
    """The slots engine's schedule replayed on one batch's samples (their lengths and classes
    known): ``args.slots`` slots, one sample of each prompt in turn (round_robin), a freed slot
    refilled at once; with ``early_stop``, a group whose finished samples hold the subset's
    largest variance has its unstarted samples cancelled (the trainer's lossless early stop);
    with ``prune`` ('finished': prune_running; 'sure': prune_trusting_sure, whose settled groups
    start no more samples; '': none), whenever a running sample reaches a detection point
    (``lengths_at``) its group's running samples are put to the rule with the group's finished
    samples and each runner's latest probability, and those it names stop. -> which samples
    were generated whole, tokens and decode steps."""
    labels, lengths = batch["labels"], batch["lengths"]  # [P, n]
    prompts, n = labels.shape
    order = [(p, s) for s in range(n) for p in range(prompts)]  # round_robin
    pending = list(reversed(order))
    running: dict[tuple[int, int], int] = {}  # sample -> tokens so far
    finished = torch.zeros(prompts, 2, dtype=torch.long)  # [P, 2] low, high
    done = torch.zeros(prompts, n, dtype=torch.bool)
    pruned = torch.zeros(prompts, n, dtype=torch.bool)
    cancelled: set[int] = set()
    latest: dict[tuple[int, int], float] = {}
    tokens = steps = 0
    points = {k: name for name, k in lengths_at}
    while pending or running:
        while pending and len(running) < args.slots:
            sample = pending.pop()
            if sample[0] not in cancelled:
                running[sample] = 0
        if not running:
            break
        steps += 1
        for sample in list(running):
            if sample not in running:  # pruned at another sample's detection point this step
                continue
            running[sample] += 1
            tokens += 1
            p, s = sample
            if running[sample] >= int(lengths[p, s]):
                del running[sample]
                done[p, s] = True
                finished[p, int(labels[p, s])] += 1
                if early_stop and bool(saturated_counts(finished[p], args.m)):
                    cancelled.add(p)
            elif prune and running[sample] in points and sample in probabilities.get(points[running[sample]], {}):
                latest[sample] = probabilities[points[running[sample]]][sample]
                others = [other for other in running if other[0] == p]
                probability = torch.tensor([latest.get(other, 0.5) for other in others], dtype=torch.float64)
                group = torch.zeros(len(others), dtype=torch.long)
                if prune == "sure":
                    flags, settled = prune_trusting_sure(finished[p:p + 1], group, probability, args.m,
                                                         args.threshold)
                    if bool(settled[0]):
                        cancelled.add(p)
                else:
                    flags = prune_running(finished[p:p + 1], group, probability, args.m, args.threshold)
                for other, flag in zip(others, flags.tolist()):
                    if flag:
                        del running[other]
                        pruned[other] = True
    return {"generated": done, "pruned": pruned, "tokens": tokens, "steps": steps}


def saturated_counts(counts: torch.Tensor, m: int) -> bool:
    """Finished [low, high] counts hold floor(m/2) of one bound and ceil(m/2) of the other."""
    low, high = int(counts[0]), int(counts[1])
    return (low >= m // 2 and high >= m - m // 2) or (high >= m // 2 and low >= m - m // 2)


def kept_of(batch: dict, generated: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Max-variance selection over the generated samples, as the trainer selects (it refuses to
    keep one never generated): kept lengths [P, m] and rewards [P, m]."""
    rewards = batch["labels"].double()
    keep = select("max_variance", Groups(rewards.masked_fill(~generated, float("nan")), generated), m)
    return batch["lengths"].gather(1, keep).double(), rewards.gather(1, keep)


def schedule_lines(batches: list[dict], probabilities: list[dict], relative: list, pooling: str, args) -> list[str]:
    """The arms replayed on the same samples: no early stop, early stop, early stop + each
    pruning rule (by the head, and by a head that is always right and sure: the rule's ceiling)."""
    arms = {"all n": (False, "", False), "early stop": (True, "", False),
            "early stop + pruning": (True, "finished", False),
            "early stop + pruning, a perfect head": (True, "finished", True),
            "early stop + bolder pruning (sure samples fill places)": (True, "sure", False),
            "early stop + bolder pruning, a perfect head": (True, "sure", True)}
    totals = {arm: {"tokens": 0, "steps": 0, "samples": 0, "pruned": 0, "lengths": [], "variance": []} for arm in arms}
    for index in range(args.warmup, len(batches)):
        at = [(name, length_of(index)) for name, length_of in relative]
        labels, lengths = batches[index]["labels"], batches[index]["lengths"]
        perfect = {name: {(p, s): float(labels[p, s]) for p in range(labels.shape[0]) for s in range(labels.shape[1])
                          if int(lengths[p, s]) > k} for name, k in at}  # the ceiling of the rule
        for arm, (early, prune, oracle) in arms.items():
            result = schedule(batches[index], perfect if oracle else probabilities[index], at, args, early, prune)
            lengths, rewards = kept_of(batches[index], result["generated"], args.m)
            total = totals[arm]
            total["tokens"] += result["tokens"]
            total["steps"] += result["steps"]
            total["samples"] += int(result["generated"].sum())
            total["pruned"] += int(result["pruned"].sum())
            total["lengths"].append(lengths.mean(1))
            total["variance"].append(rewards.var(dim=1, correction=0))
    lines = ["", f"Replayed on the slots engine's schedule ({args.slots} slots, round_robin, {pooling} pooling, "
             f"pruning at {args.points} x expected), batches {args.warmup}..{len(batches) - 1}:", "",
             "| arm | tokens decoded | decode steps | samples generated whole | pruned | kept mean length | "
             "kept reward variance | kept length vs early stop, paired by group |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = torch.cat(totals["early stop"]["lengths"])
    for arm, total in totals.items():
        lengths = torch.cat(total["lengths"])
        difference, half = mean_ci((lengths - base).tolist())
        lines.append(f"| {arm} | {total['tokens']} ({total['tokens'] / totals['early stop']['tokens']:.3f}x) | "
                     f"{total['steps']} | {total['samples']} | {total['pruned']} | {float(lengths.mean()):.1f} | "
                     f"{float(torch.cat(total['variance']).mean()):.4f} | {difference:+.1f} +- {half:.1f} "
                     f"({float(lengths.mean() / base.mean()) - 1:+.1%}) |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="chain", choices=sorted(WORKLOADS))
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--m", type=int, default=4)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--points", default="0.25,0.5", help="detection points, fractions of the expected length")
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--warmup", type=int, default=2, help="batches learned from before skill is counted")
    parser.add_argument("--decay", type=float, default=0.9)
    parser.add_argument("--ridge", type=float, default=1.0)
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    model_name, prompts, budget = WORKLOADS[args.workload]
    bundle = load_model(model_name)
    bundle.model.eval()
    task = task_of(args.workload)
    scorer = Scorer.build(task, ScoringOptions(correct_weight=1.0, format_weight=0.0))
    start = time.perf_counter()
    batches = [batch_samples(bundle, task, scorer, args.workload, b, args) for b in range(args.batches)]
    collect_seconds = time.perf_counter() - start
    fractions = [float(f) for f in args.points.split(",")]

    def expected(index: int) -> float:  # the mean completion length of the batches before (half the budget first)
        before = [float(b["lengths"].double().mean()) for b in batches[:index]]
        return statistics.fmean(before) if before else budget / 2

    relative = [(f"{f:g} x expected", lambda i, f=f: max(1, round(f * expected(i)))) for f in fractions]
    absolute = [(f"{k} tokens", lambda i, k=k: k) for k in ABSOLUTE if k < budget]
    all_lengths = torch.cat([b["lengths"].flatten() for b in batches]).double()
    all_labels = torch.cat([b["labels"].flatten() for b in batches]).double()
    lines = [f"{args.workload} ({model_name}), {args.batches} batches x {prompts} prompts x n = {args.n}, "
             f"m = {args.m}, up to {budget} tokens, {args.slots} slots; completions: mean length "
             f"{float(all_lengths.mean()):.1f} tokens (median {float(all_lengths.median()):.0f}, "
             f"{float((all_lengths >= budget).double().mean()):.0%} at the budget), correct "
             f"{float(all_labels.mean()):.1%}; generation {collect_seconds:.0f} s with the forwards; head: ridge "
             f"{args.ridge:g}, decay {args.decay:g}, skill over batches {args.warmup}..{args.batches - 1}, sure = "
             f"calibrated probability >= {args.threshold:g} either way", "",
             "| pooling | point | running samples | correct among them | AUC | calibration error | sure | "
             "wrong when sure |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    probabilities = {}
    for pooling in ("mean", "last"):
        rows, probabilities[pooling] = skill_table(batches, relative + absolute, pooling, args)
        lines += [f"| {pooling} | {name} | {count} | {share:.1%} | {area:.3f} | {error:.3f} | {sure:.1%} | "
                  f"{wrong:.1%} |" for name, count, share, area, error, sure, wrong in rows]
    for pooling in ("mean", "last"):
        results = []
        for index in range(args.warmup, args.batches):
            at = [(name, length_of(index)) for name, length_of in relative]
            results.append(simulate_pruning(batches[index], probabilities[pooling][index], at, args))
        pruned, wrong = sum(r["pruned"] for r in results), sum(r["wrong"] for r in results)
        saved, tokens = sum(r["saved"] for r in results), sum(r["tokens"] for r in results)
        full_len = torch.cat([r["length"]["full"] for r in results])
        kept_len = torch.cat([r["length"]["kept"] for r in results])
        full_var = torch.cat([r["variance"]["full"] for r in results])
        kept_var = torch.cat([r["variance"]["kept"] for r in results])
        difference, half = mean_ci((kept_len - full_len).tolist())
        lines += ["", f"Pruning at {args.points} x expected ({pooling} pooling), batches {args.warmup}.."
                  f"{args.batches - 1}: {pruned} of {sum(r['samples'] for r in results)} samples pruned "
                  f"({wrong} of them in the class the head did not give), {saved} of {tokens} generated tokens "
                  f"saved ({saved / max(1, tokens):.1%}); kept mean length {float(kept_len.mean()):.1f} vs "
                  f"{float(full_len.mean()):.1f} unpruned ({float(kept_len.mean() / full_len.mean()) - 1:+.1%}; "
                  f"paired by group {difference:+.1f} +- {half:.1f} tokens, 95% t); kept reward variance "
                  f"{float(kept_var.mean()):.4f} vs {float(full_var.mean()):.4f} unpruned"]
    for pooling in ("mean", "last"):
        lines += schedule_lines(batches, probabilities[pooling], relative, pooling, args)
    table = "\n".join(lines)
    print(table)
    if args.record:
        record(args.record, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

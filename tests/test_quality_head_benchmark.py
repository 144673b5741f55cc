"""benchmarks/quality_head_skill.py's replay of the slots engine's schedule, on synthetic batches:
what it counts is what the schedule does, and a right head loses no kept variance."""

from __future__ import annotations

import random
import sys
from argparse import Namespace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from quality_head_skill import kept_of, schedule  # noqa: E402 (benchmarks/ is not a package)


def synthetic(rng: random.Random, prompts: int = 4, n: int = 8) -> dict:
    labels = torch.tensor([[int(rng.random() < rng.random()) for _ in range(n)] for _ in range(prompts)])
    lengths = torch.tensor([[rng.randint(2, 40) for _ in range(n)] for _ in range(prompts)])
    return {"labels": labels, "lengths": lengths}


def perfect(batch: dict, points: list[tuple[str, int]]) -> dict:
    labels, lengths = batch["labels"], batch["lengths"]
    return {name: {(p, s): float(labels[p, s]) for p in range(labels.shape[0]) for s in range(labels.shape[1])
                   if int(lengths[p, s]) > k} for name, k in points}


def test_without_stops_the_replay_decodes_every_token_in_its_slots():
    rng = random.Random(0)
    for slots in (1, 5, 32):
        batch = synthetic(rng)
        result = schedule(batch, {}, [], Namespace(slots=slots, m=2, threshold=0.8), early_stop=False, prune="")
        total = int(batch["lengths"].sum())
        assert result["tokens"] == total and bool(result["generated"].all())
        assert result["steps"] >= max(int(batch["lengths"].max()), -(-total // slots))
        assert slots > 1 or result["steps"] == total  # one slot: one sample after another


def test_a_perfect_head_prunes_by_either_rule_without_losing_kept_variance_and_saves_tokens():
    rng = random.Random(1)
    saved = {"finished": 0, "sure": 0}
    for _ in range(20):
        batch = synthetic(rng)
        args = Namespace(slots=rng.choice([4, 8, 16]), m=rng.choice([2, 3, 4]), threshold=0.8)
        points = [("a", 4), ("b", 8), ("c", 16)]
        early = schedule(batch, {}, points, args, early_stop=True, prune="")
        for rule in ("finished", "sure"):
            pruned = schedule(batch, perfect(batch, points), points, args, early_stop=True, prune=rule)
            for result in (early, pruned):  # every group keeps m samples generated whole
                assert bool((result["generated"].sum(1) >= args.m).all())
            variance = [kept_of(batch, result["generated"], args.m)[1].var(dim=1, correction=0)
                        for result in (early, pruned)]
            assert torch.allclose(variance[0], variance[1])
            assert not bool((pruned["generated"] & pruned["pruned"]).any())
            saved[rule] += early["tokens"] - pruned["tokens"]
    assert saved["sure"] > saved["finished"] > 0

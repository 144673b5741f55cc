"""Quota-aware pruning of running samples (podsrl.algorithms.pruning), against brute force over
every m-subset of the completed group."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from podsrl.algorithms.pruning import needed, prune_running, prune_trusting_sure


def best_variance(classes: list[int], m: int) -> float:
    """The largest population variance of m rewards chosen from ``classes`` (0 / 1: the mean of
    squares is the mean), by brute force over every m-subset."""
    return max(sum(subset) / m - (sum(subset) / m) ** 2 for subset in itertools.combinations(classes, m))


def split_variance(high: int, m: int) -> float:
    return high * (m - high) / m**2


def scenario(rng: random.Random, right: bool):
    """One group: true classes, each sample finished / running / pending, the head's
    probabilities for the running ones (right: never confident in the wrong class); returns
    m, threshold, truth, running, probabilities, finished counts [low, high], pending."""
    m = rng.randint(1, 5)
    n = rng.randint(m, 8)
    threshold = rng.choice([0.6, 0.8, 0.95])
    share_high = rng.random()
    truth = [int(rng.random() < share_high) for _ in range(n)]
    state = [rng.choice("frp") for _ in range(n)]
    running = [i for i in range(n) if state[i] == "r"]
    probabilities = []
    for i in running:
        if not right:
            probabilities.append(rng.random())
        elif rng.random() < 0.6:  # confident, in the true class
            probabilities.append(rng.uniform(threshold, 1.0) if truth[i] else rng.uniform(0.0, 1 - threshold))
        else:  # unsure
            probabilities.append(rng.uniform(1 - threshold + 1e-6, threshold - 1e-6))
    finished = [sum(1 for i in range(n) if state[i] == "f" and truth[i] == c) for c in (0, 1)]
    pending = [i for i in range(n) if state[i] == "p"]
    return m, threshold, truth, running, probabilities, finished, pending


def pruned_of(groups: list) -> list[set[int]]:
    """The pruning decision for many groups in one call (the group axis), per group."""
    finished = torch.tensor([g[5] for g in groups])
    group = torch.tensor([k for k, g in enumerate(groups) for _ in g[3]], dtype=torch.long)
    probability = torch.tensor([p for g in groups for p in g[4]], dtype=torch.float64)
    out, start = [], 0
    by_m = {}
    for k, g in enumerate(groups):
        by_m.setdefault((g[0], g[1]), []).append(k)
    decided = torch.zeros(len(group), dtype=torch.bool)
    for (m, threshold), members in by_m.items():  # one call per (m, threshold): groups of one run share them
        rows = torch.isin(group, torch.tensor(members))
        decided[rows] = prune_running(finished, group[rows], probability[rows], m, threshold)
    for g in groups:
        flags = decided[start:start + len(g[3])].tolist()
        out.append({i for i, flag in zip(g[3], flags) if flag})
        start += len(g[3])
    return out


def test_a_right_head_never_prunes_what_the_max_variance_subset_needs():
    """Whatever the finished, running and pending samples and their true classes, a head that is
    never confident in the wrong class prunes nothing the completed group's best m-subset needs:
    the pruned group keeps at least m samples and the same largest kept variance."""
    rng = random.Random(0)
    groups = [scenario(rng, right=True) for _ in range(3000)]
    decisions = pruned_of(groups)
    pruning = 0
    for (m, _, truth, *_), pruned in zip(groups, decisions):
        kept = [c for i, c in enumerate(truth) if i not in pruned]
        assert len(kept) >= m
        assert best_variance(kept, m) == pytest.approx(best_variance(truth, m), abs=1e-12)
        pruning += bool(pruned)
    assert pruning > 300  # the rule does prune: the property is not met by pruning nothing


def test_a_wrong_head_costs_at_most_its_confident_errors():
    """With any probabilities, the group keeps m samples, and the kept variance is at least that
    of the completed group's best split moved by e samples, e being the head's confident errors
    on the group's running samples (the bound computed here, against brute force)."""
    rng = random.Random(1)
    groups = [scenario(rng, right=False) for _ in range(3000)]
    costly = 0
    for (m, threshold, truth, running, probabilities, *_), pruned in zip(groups, pruned_of(groups)):
        kept = [c for i, c in enumerate(truth) if i not in pruned]
        assert len(kept) >= m
        errors = sum((p >= threshold and not truth[i]) or (1 - p >= threshold and truth[i])
                     for i, p in zip(running, probabilities))
        high, low = sum(truth), len(truth) - sum(truth)
        best_high = max((a for a in range(m + 1) if a <= high and m - a <= low), key=lambda a: split_variance(a, m))
        bound = min(split_variance(a, m) for a in range(max(0, best_high - errors), min(m, best_high + errors) + 1))
        assert best_variance(kept, m) >= bound - 1e-12
        costly += best_variance(kept, m) < best_variance(truth, m) - 1e-12
    assert costly > 0  # wrong heads do cost: the bound is exercised


def test_pruning_over_a_generation_keeps_what_is_needed():
    """Samples finish one by one and the rule runs after each (several detection points): with a
    right head the pruned group still has the completed group's best variance."""
    rng = random.Random(2)
    pruning = 0
    for _ in range(400):
        m, threshold = rng.randint(2, 4), 0.8
        n = rng.randint(m, 8)
        truth = [int(rng.random() < 0.5) for _ in range(n)]
        order = rng.sample(range(n), n)  # the order samples finish in
        sure = {i: rng.random() < 0.7 for i in range(n)}  # a right head, confident on some samples
        pruned: set[int] = set()
        for done in range(n):
            finished = set(order[:done]) - pruned  # a pruned sample never finishes
            running = [i for i in order[done:] if i not in pruned]
            if not running:
                break
            counts = torch.tensor([[sum(1 for i in finished if truth[i] == c) for c in (0, 1)]])
            probability = torch.tensor([(0.9 if truth[i] else 0.1) if sure[i] else 0.5 for i in running],
                                       dtype=torch.float64)
            flags = prune_running(counts, torch.zeros(len(running), dtype=torch.long), probability, m, threshold)
            pruned |= {i for i, flag in zip(running, flags.tolist()) if flag}
        kept = [c for i, c in enumerate(truth) if i not in pruned]
        assert len(kept) >= m
        assert best_variance(kept, m) == pytest.approx(best_variance(truth, m), abs=1e-12)
        pruning += bool(pruned)
    assert pruning > 40


def test_the_scarce_class_is_never_pruned():
    """A class whose finished samples are fewer than floor(m/2) is never pruned, however sure the
    head: the subset needs every sample of it the group will have."""
    m = 4
    finished = torch.tensor([[1, 3], [3, 1]])  # [low, high] per group
    group = torch.tensor([0, 0, 1, 1])
    high_probability = torch.tensor([0.01, 0.99, 0.01, 0.99], dtype=torch.float64)
    assert prune_running(finished, group, high_probability, m, 0.9).tolist() == [False, True, True, False]
    assert needed(4, torch.tensor([0, 1, 2, 3])).tolist() == [4, 3, 2, 2]


def test_the_threshold_must_make_one_class_the_confident_one():
    with pytest.raises(ValueError, match="threshold: must be in"):
        prune_running(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                      torch.zeros(1), 2, 0.5)


def dropped_of(running: list[int], flags: torch.Tensor, pending: list[int], settled: bool) -> set[int]:
    """The samples a group never generates whole: its pruned runners and, once settled, its pending ones."""
    return {i for i, flag in zip(running, flags.tolist()) if flag} | (set(pending) if settled else set())


def test_trusting_sure_samples_loses_nothing_when_the_head_is_right():
    """The bolder rule (places filled by sure running samples too; a settled group's pending
    samples never start): with a right head the group keeps m samples and its best variance,
    and it prunes more than the finished-only rule."""
    rng = random.Random(3)
    bolder = plain = settled_groups = 0
    for m, threshold, truth, running, probabilities, finished, pending in (scenario(rng, right=True)
                                                                           for _ in range(1500)):
        group = torch.zeros(len(running), dtype=torch.long)
        probability = torch.tensor(probabilities, dtype=torch.float64)
        flags, settled = prune_trusting_sure(torch.tensor([finished]), group, probability, m, threshold)
        dropped = dropped_of(running, flags, pending, bool(settled[0]))
        kept = [c for i, c in enumerate(truth) if i not in dropped]
        assert len(kept) >= m
        assert best_variance(kept, m) == pytest.approx(best_variance(truth, m), abs=1e-12)
        bolder += int(flags.sum())
        plain += int(prune_running(torch.tensor([finished]), group, probability, m, threshold).sum())
        settled_groups += bool(settled[0])
    assert bolder > plain > 0 and settled_groups > 50


def test_trusting_sure_samples_never_prunes_the_scarce_class_and_keeps_m():
    """With any probabilities (a wrong head), the group keeps at least m samples generated, and a
    class with fewer than floor(m/2) reliable samples loses none of its sure runners."""
    rng = random.Random(4)
    for m, threshold, truth, running, probabilities, finished, pending in (scenario(rng, right=False)
                                                                           for _ in range(1500)):
        probability = torch.tensor(probabilities, dtype=torch.float64)
        flags, settled = prune_trusting_sure(torch.tensor([finished]), torch.zeros(len(running), dtype=torch.long),
                                             probability, m, threshold)
        dropped = dropped_of(running, flags, pending, bool(settled[0]))
        assert len(truth) - len(dropped) >= m
        for c, sure in ((0, probability <= 1 - threshold), (1, probability >= threshold)):
            if finished[c] + int(sure.sum()) < m // 2:
                assert not bool((flags & sure).any())

"""Down-sampling rules against brute force and their documented properties."""

import itertools

import pytest
import torch

from podsrl.algorithms.select import RULES, max_reward, max_variance, random_subset, select


def population_variance(values):
    values = torch.as_tensor(values, dtype=torch.float64)
    return float(((values - values.mean()) ** 2).mean())


def best_variance_brute_force(row, m):
    return max(population_variance([row[i] for i in subset]) for subset in itertools.combinations(range(len(row)), m))


def reward_rows(n, generator):
    """Random, tied, binary, constant and mixed-scale reward rows of length n."""
    return [
        torch.rand(n, generator=generator),
        torch.randint(0, 3, (n,), generator=generator).double(),  # many ties
        torch.randint(0, 2, (n,), generator=generator).double(),  # binary
        torch.full((n,), 0.7, dtype=torch.float64),  # constant
        torch.randn(n, generator=generator, dtype=torch.float64) * 1000 + 5000,  # far from zero
        (torch.randint(0, 2, (n,), generator=generator) * 0.8
         + torch.randint(0, 2, (n,), generator=generator) * 0.2).double(),  # the 0.8/0.2 reward
    ]


@pytest.mark.parametrize("n", range(1, 11))
def test_max_variance_matches_exhaustive_search(n):
    generator = torch.Generator().manual_seed(n)
    rows = reward_rows(n, generator)
    rewards = torch.stack(rows)  # [P, n]: all kinds in one batch, exercising the vectorisation
    for m in range(1, n + 1):
        keep = max_variance(rewards, m)
        assert keep.shape == (len(rows), m) and keep.dtype == torch.long
        assert torch.all(keep[:, 1:] > keep[:, :-1]), "indices must be distinct and sorted ascending"
        for row, kept in zip(rows, keep):
            achieved = population_variance(row[kept])
            expected = best_variance_brute_force(row.tolist(), m)
            assert achieved == pytest.approx(expected, rel=1e-9, abs=1e-9), (row, m)


def test_max_variance_is_permutation_invariant_in_value():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 4, (64, 12), generator=generator).float()
    for m in (1, 3, 6, 12):
        base = [population_variance(r[k]) for r, k in zip(rewards, max_variance(rewards, m))]
        perm = torch.randperm(12, generator=generator)
        shuffled = rewards[:, perm]
        again = [population_variance(r[k]) for r, k in zip(shuffled, max_variance(shuffled, m))]
        assert again == pytest.approx(base, abs=1e-12)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_m_equal_n_keeps_everything_in_order(rule):
    rewards = torch.rand(5, 7, generator=torch.Generator().manual_seed(1))
    keep = select(rule, rewards, 7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(keep, torch.arange(7).expand(5, 7))


def test_max_variance_binary_keeps_balanced_split():
    # c correct of n: the best subset holds min(c, m // 2)-ish of each outcome
    for c in range(0, 11):
        row = torch.tensor([1.0] * c + [0.0] * (10 - c))
        kept = row[max_variance(row.unsqueeze(0), 4)[0]]
        ones, zeros = int(kept.sum()), 4 - int(kept.sum())
        assert (ones, zeros) == ((min(c, 2), 4 - min(c, 2)) if c <= 5 else (4 - min(10 - c, 2), min(10 - c, 2)))


def documented_choice(row, m):
    """The documented tie rule, spelled out: stable ascending order; for k = 0..m the subset
    is the m-k lowest plus the k highest; the smallest k whose variance is the best (within
    1e-9 of the squared reward range) wins; indices returned sorted."""
    values = row.tolist()
    order = sorted(range(len(values)), key=lambda i: values[i])  # Python's sort is stable
    mean = sum(values) / len(values)
    scale = max(abs(v - mean) for v in values) ** 2
    candidates = [order[:m - k] + order[len(values) - k:] for k in range(m + 1)]
    variances = [population_variance([values[i] for i in subset]) for subset in candidates]
    best = max(variances)
    k = next(k for k, v in enumerate(variances) if v >= best - 1e-9 * max(scale, 1e-300))
    return sorted(candidates[k])


@pytest.mark.parametrize("n", [1, 2, 5, 8, 16])
def test_max_variance_follows_the_documented_tie_rule_exactly(n):
    generator = torch.Generator().manual_seed(100 + n)
    rows = reward_rows(n, generator) + [torch.randint(0, 2, (n,), generator=generator).double() for _ in range(20)]
    rewards = torch.stack(rows)
    for m in range(1, n + 1):
        keep = max_variance(rewards, m)
        for row, kept in zip(rows, keep):
            assert kept.tolist() == documented_choice(row, m), (row.tolist(), m)


def test_max_variance_tie_breaking_examples():
    # constant group: every k has variance 0 -> smallest k (0 highest) -> the m lowest by
    # stable sort -> the first m indices.
    rewards = torch.zeros(3, 6)
    assert torch.equal(max_variance(rewards, 4), torch.arange(4).expand(3, 4))
    # binary 0/1: k=1 (one 1, one 0); the highest 1 is the last-indexed one, the lowest 0 the first
    rewards = torch.tensor([[1.0, 0, 1, 0, 1, 0]])
    assert torch.equal(max_variance(rewards, 2), torch.tensor([[1, 4]]))


def test_max_reward_keeps_the_highest():
    generator = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 5, (100, 9), generator=generator).float()
    for m in range(1, 10):
        keep = max_reward(rewards, m)
        assert torch.all(keep[:, 1:] > keep[:, :-1]), "sorted, distinct"
        kept = rewards.gather(1, keep)
        dropped_mask = torch.ones_like(rewards, dtype=torch.bool).scatter(1, keep, False)
        for row, k, d in zip(rewards, kept, dropped_mask):
            if d.any():
                assert k.min() >= row[d].max()
        # ties go to the lower index: among equal values the kept ones precede dropped ones
        for row, keep_row in zip(rewards, keep):
            threshold = row[keep_row].min()
            tied = (row == threshold).nonzero().flatten().tolist()
            kept_tied = [i for i in keep_row.tolist() if row[i] == threshold]
            assert kept_tied == tied[:len(kept_tied)]


def test_random_subset_is_uniform_and_seeded():
    rewards = torch.zeros(20000, 6)
    keep = random_subset(rewards, 2, generator=torch.Generator().manual_seed(0))
    assert torch.all(keep[:, 1] > keep[:, 0])  # distinct and sorted
    counts = torch.bincount(keep.flatten(), minlength=6).double()
    expected = 20000 * 2 / 6
    # chi-square with 5 dof; 20.5 is the 0.999 quantile
    assert float(((counts - expected) ** 2 / expected).sum()) < 20.5
    again = random_subset(rewards, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(keep, again)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="m must satisfy"):
        max_variance(torch.zeros(2, 3), 4)
    with pytest.raises(ValueError, match=r"\[P, n\]"):
        max_variance(torch.zeros(3), 1)
    with pytest.raises(ValueError, match="rule: unknown rule"):
        select("best", torch.zeros(2, 3), 1)


def test_selection_keeps_generated_samples_whatever_was_not_generated():
    """Groups with samples never generated (early stop's skipped, pruning's stopped), rewards at
    two values and at least m generated: max-variance selection keeps only generated samples,
    with the best variance among them (brute force), and the same indices as the rule on the
    filled rewards wherever those were all generated (#72: a pruned sample of a group whose
    generated rewards are equal used to tie with them and be kept)."""
    import random

    from podsrl.algorithms.early_stop import fill_skipped
    from podsrl.algorithms.select import Groups

    rng = random.Random(0)
    for _ in range(800):
        m = rng.randint(1, 4)
        n = rng.randint(m, 7)
        rewards = torch.tensor([[float(rng.random() < 0.5) for _ in range(n)]], dtype=torch.float64)
        generated = torch.zeros(1, n, dtype=torch.bool)
        generated[0, rng.sample(range(n), rng.randint(m, n))] = True
        keep = select("max_variance", Groups(rewards.masked_fill(~generated, float("nan")), generated), m)
        assert bool(generated.gather(1, keep).all())
        values = rewards[0][generated[0]].tolist()
        best = max(sum(c) / m - (sum(c) / m) ** 2 for c in itertools.combinations(values, m))  # 0 / 1 values
        assert rewards.gather(1, keep).var(dim=1, unbiased=False).item() == pytest.approx(best, abs=1e-12)
        before = max_variance(fill_skipped(rewards.masked_fill(~generated, float("nan")), generated), m)
        if bool(generated.gather(1, before).all()):
            assert torch.equal(keep, before)

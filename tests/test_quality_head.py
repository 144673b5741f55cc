"""The quality head (podsrl.algorithms.quality_head): learned online, calibrated out of sample,
the same on every process, and its skill measures against brute-force oracles."""

from __future__ import annotations

import itertools

import pytest
import torch

from podsrl.algorithms.pruning import prune_running
from podsrl.algorithms.quality_head import QualityHead, auc, calibration_error, statistics


def samples(generator: torch.Generator, count: int, dim: int = 6, noise: float = 0.3):
    """Features whose class is the sign of one direction, blurred by ``noise``."""
    features = torch.randn(count, dim, generator=generator, dtype=torch.float64)
    labels = (features[:, 0] + noise * torch.randn(count, generator=generator, dtype=torch.float64) > 0).long()
    return features, labels


def learn(head: QualityHead, generator: torch.Generator, steps: int, per_step: int = 64) -> None:
    """Prequential steps: score the step's samples with the head as it is, then learn from them."""
    for _ in range(steps):
        added = []
        for point in range(head.points):
            features, labels = samples(generator, per_step, dim=head.dim)
            added.append(statistics(features, head.scores(point, features), labels, head.bins))
        head.absorb(added)


def test_the_head_learns_a_class_it_can_see_and_is_calibrated_out_of_sample():
    generator = torch.Generator().manual_seed(0)
    head = QualityHead(6, 2, decay=0.9)
    learn(head, generator, steps=12)
    features, labels = samples(generator, 2000)
    for point in range(2):
        scores = head.scores(point, features)
        probability = head.calibrated(point, scores)
        assert auc(scores, labels) > 0.9
        assert calibration_error(probability, labels) < 0.08
        confident = (probability >= 0.9) | (probability <= 0.1)
        assert confident.float().mean() > 0.3  # it is sure of a good share of samples
        predicted_high = probability >= 0.5
        assert (predicted_high[confident] == labels[confident].bool()).float().mean() > 0.95


def test_a_head_without_evidence_is_unsure_and_prunes_nothing():
    head = QualityHead(4, 1)
    features = torch.randn(5, 4, dtype=torch.float64)
    probability = head.calibrated(0, head.scores(0, features))
    assert torch.equal(probability, torch.full((5,), 0.5, dtype=torch.float64))
    finished = torch.tensor([[4, 4]])  # even a saturated group keeps its running samples
    assert not prune_running(finished, torch.zeros(5, dtype=torch.long), probability, 4, 0.6).any()


def test_processes_that_add_their_statistics_hold_the_same_head_as_one_process():
    """Two processes' statistics, summed (what the all-reduce does), give the head one process
    gets from all the samples: bit for bit in the regression sums, and the same predictions."""
    generator = torch.Generator().manual_seed(1)
    one, two = QualityHead(3, 1), QualityHead(3, 1)
    for _ in range(4):
        features, labels = samples(generator, 40, dim=3)
        scores = one.scores(0, features)
        whole = statistics(features, scores, labels, one.bins)
        halves = [statistics(features[part], scores[part], labels[part], one.bins)
                  for part in (slice(0, 20), slice(20, 40))]
        summed = {name: halves[0][name] + halves[1][name] for name in whole}
        one.absorb([whole])
        two.absorb([summed])
        for name in ("bin_count", "bin_high"):
            assert torch.equal(getattr(one, name), getattr(two, name))
        assert torch.allclose(one.xtx, two.xtx, rtol=1e-12) and torch.allclose(one.xty, two.xty, rtol=1e-12)
    probe = torch.randn(8, 3, dtype=torch.float64)
    assert torch.allclose(one.scores(0, probe), two.scores(0, probe), rtol=1e-9)


def test_the_head_is_saved_and_restored_whole():
    generator = torch.Generator().manual_seed(2)
    head = QualityHead(5, 2)
    learn(head, generator, steps=3)
    restored = QualityHead(5, 2)
    restored.load_state_dict(head.state_dict())
    probe = torch.randn(7, 5, dtype=torch.float64)
    for point in range(2):
        assert torch.equal(head.scores(point, probe), restored.scores(point, probe))
    assert restored.steps == 3
    with pytest.raises(ValueError, match="does not fit a head of 4 features"):
        QualityHead(4, 2).load_state_dict(head.state_dict())


def test_decay_forgets_an_older_policy():
    """After the classes flip (the policy changed), a decaying head follows within a few steps."""
    generator = torch.Generator().manual_seed(3)
    head = QualityHead(6, 1, decay=0.5)
    learn(head, generator, steps=6)
    for _ in range(6):  # the same features now mean the other class
        features, labels = samples(generator, 64)
        head.absorb([statistics(features, head.scores(0, features), 1 - labels, head.bins)])
    features, labels = samples(generator, 1000)
    assert auc(head.scores(0, features), 1 - labels) > 0.9


@pytest.mark.parametrize("seed", range(5))
def test_auc_is_the_share_of_ordered_pairs(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (12,), generator=generator).double()  # ties on purpose
    labels = torch.randint(0, 2, (12,), generator=generator)
    pairs = [(h, low) for h, low in itertools.product(scores[labels == 1].tolist(), scores[labels == 0].tolist())]
    if not pairs:
        assert auc(scores, labels) != auc(scores, labels)  # NaN
        return
    expected = sum(1.0 if h > low else 0.5 if h == low else 0.0 for h, low in pairs) / len(pairs)
    assert auc(scores, labels) == pytest.approx(expected)


def test_calibration_error_against_a_direct_count():
    probability = torch.tensor([0.05, 0.15, 0.12, 0.95, 0.91, 0.55], dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    # bins of width 0.1: {0.05: 0 of 1}, {0.15, 0.12: 1 of 2}, {0.55: 0 of 1}, {0.95, 0.91: 2 of 2}
    expected = (abs(0.05 - 0) + abs(0.27 - 1) + abs(0.55 - 0) + abs(1.86 - 2)) / 6
    assert calibration_error(probability, labels) == pytest.approx(expected)
    assert calibration_error(torch.tensor([0.3, 0.7]), torch.tensor([0, 1]), bins=2) == pytest.approx(0.3)

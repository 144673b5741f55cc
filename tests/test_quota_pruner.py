"""The trainer's quota-aware pruner (podsrl.generation.pruning.QuotaPruner), a prune_running
watcher: what it names, what it learns from, and the skill it reports."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from podsrl.algorithms.quality_head import QualityHead, statistics
from podsrl.generation.pruning import QuotaPruner, detection_lengths


def skilled_head() -> QualityHead:
    """A head that learned that feature 0's sign is the class (one detection point)."""
    generator = torch.Generator().manual_seed(0)
    head = QualityHead(3, 1)
    for _ in range(4):
        features = torch.randn(200, 3, generator=generator, dtype=torch.float64)
        labels = (features[:, 0] > 0).long()
        head.absorb([statistics(features, head.scores(0, features), labels, head.bins)])
    return head


def feature(sign: float) -> torch.Tensor:
    return torch.tensor([3.0 * sign, 0.0, 0.0])


def test_it_prunes_the_runners_of_a_filled_class_and_keeps_the_scarce_one():
    # group 0: two finished high (m = 2: the high class's one place is filled once a low is sure)
    stopper = SimpleNamespace(bounds=(0.0, 1.0), rewards=[[1.0, 1.0], [], [0.0]])
    pruner = QuotaPruner(skilled_head(), stopper, (4,), m=2, threshold=0.8)
    running = [(0, 2), (0, 3), (1, 0), (2, 1)]
    shown = [(0, 2), (0, 3), (1, 0), (2, 1)]
    features = torch.stack([feature(1), feature(-1), feature(1), feature(-1)])
    named = pruner(shown, [4, 4, 4, 4], features, running)
    # (0, 2) is sure high, high is filled, (0, 3) is a sure low: prune (0, 2); group 1 has nothing
    # finished; group 2's low class is filled only with a sure high, and (2, 1) is predicted low
    assert named == [(0, 2)]
    assert pruner.pruned == [(0, 2)]
    assert pruner.latest[(0, 2)] > 0.8 > pruner.latest[(0, 3)]


def test_while_it_warms_up_it_watches_and_prunes_nothing():
    stopper = SimpleNamespace(bounds=(0.0, 1.0), rewards=[[1.0, 1.0]])
    pruner = QuotaPruner(skilled_head(), stopper, (4,), m=2, threshold=0.8, active=False)
    assert pruner([(0, 2), (0, 3)], [4, 4], torch.stack([feature(1), feature(-1)]), [(0, 2), (0, 3)]) == []
    assert len(pruner.observed[0]) == 2


def test_the_bolder_rule_keeps_only_the_sure_samples_it_needs():
    stopper = SimpleNamespace(bounds=(0.0, 1.0), rewards=[[]])
    pruner = QuotaPruner(skilled_head(), stopper, (4,), m=2, threshold=0.8, rule="sure")
    running = [(0, s) for s in range(4)]
    named = pruner(running, [4] * 4, torch.stack([feature(1), feature(1), feature(-1), feature(-1)]), running)
    assert len(named) == 2 and {s for _, s in named} & {0, 1} and {s for _, s in named} & {2, 3}


def test_the_bolder_rule_names_a_settled_groups_other_samples_so_the_unstarted_never_start():
    # group 0: one finished high, runners 1 (sure low) and 2 (unsure) of 5; m = 2 is settled by
    # the finished high and the sure low: the samples not running (0, 3, 4) are named, (0, 2) runs on
    stopper = SimpleNamespace(bounds=(0.0, 1.0), rewards=[[1.0], []])
    pruner = QuotaPruner(skilled_head(), stopper, (4,), m=2, threshold=0.8, rule="sure", samples=5)
    running = [(0, 1), (0, 2), (1, 0)]
    features = torch.stack([feature(-1), feature(0), feature(1)])
    named = pruner(running, [4, 4, 4], features, running)
    assert sorted(named) == [(0, 0), (0, 3), (0, 4)] and pruner.pruned == []
    finished_rule = QuotaPruner(skilled_head(), stopper, (4,), m=2, threshold=0.8, samples=5)
    assert finished_rule(running, [4, 4, 4], features, running) == []  # it settles nothing


def test_it_learns_from_and_scores_only_the_samples_whose_class_is_known():
    stopper = SimpleNamespace(bounds=(0.0, 1.0), rewards=[[], []])
    head = skilled_head()
    pruner = QuotaPruner(head, stopper, (4,), m=2, threshold=0.8)
    shown = [(0, 0), (0, 1), (1, 0), (1, 1)]
    pruner(shown, [4] * 4, torch.stack([feature(1), feature(-1), feature(1), feature(-1)]), shown)
    high = {(0, 0): True, (0, 1): False, (1, 0): False}  # (1, 1) was pruned or cut off: unknown
    learned = pruner.learned(high)
    assert len(learned) == 1 and float(learned[0]["bin_count"].sum()) == 3
    skill = pruner.skill(high)
    assert skill["pruned_samples"] == 0
    assert skill["prune_auc_0"] == pytest.approx(0.75)  # above one low, tied with the other (same features)
    assert skill["prune_sure_wrong_0"] == pytest.approx(1 / 3)  # (1, 0): sure high, ended low


def test_detection_lengths_are_one_per_point_and_at_least_two():
    assert detection_lengths((0.25, 0.5), 40.0) == (10, 20)
    assert detection_lengths((0.01, 0.02, 0.5), 10.0) == (2, 2, 5)
    with pytest.raises(ValueError, match="1 detection points, 2 lengths"):
        QuotaPruner(QualityHead(3, 1), SimpleNamespace(bounds=(0.0, 1.0), rewards=[]), (4, 8), 2, 0.8)

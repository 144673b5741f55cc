"""Quota-aware pruning of running rollouts (#72): the trainer's watcher of kind ``prune_running``.

At each detection point (a fraction of the expected completion length) a running sample is
shown with its pooled hidden state; the run's :class:`~podsrl.algorithms.quality_head.QualityHead`
scores it, and the group's running samples are put to the pruning rule
(:mod:`podsrl.algorithms.pruning`) with the group's finished samples, which early stop's
:class:`~podsrl.trainer.saturation.SaturationStopper` has already scored as they finished. What
the pruner saw is kept for the head to learn from once the step's samples are scored (a pruned
sample is never scored: it teaches nothing). Two-valued rewards (the reward's bounds) are what
the rule's guarantee is about: a finished reward strictly inside the bounds fills no place.
"""

from __future__ import annotations

import torch

from podsrl.algorithms.pruning import prune_running, prune_trusting_sure
from podsrl.algorithms.quality_head import QualityHead, auc, calibration_error, statistics
from podsrl.rollout.base import PRUNE_RUNNING

RULES = ("finished", "sure")  # prune_running's places filled by finished samples, or by sure ones too


def detection_lengths(points: tuple[float, ...], expected_length: float) -> tuple[int, ...]:
    """The completion lengths of ``points`` (fractions of ``expected_length``): ascending, distinct, >= 2."""
    return tuple(sorted({max(2, round(point * expected_length)) for point in points}))


class QuotaPruner:
    """One generation call's pruning: shown running samples (:data:`PRUNE_RUNNING`), it scores
    them with ``head`` and names those the rule prunes; ``stopper`` holds the call's finished
    rewards per prompt; ``active`` False: it only watches (the head's warm-up)."""

    kind = PRUNE_RUNNING

    def __init__(self, head: QualityHead, stopper, lengths: tuple[int, ...], m: int, threshold: float,
                 rule: str = "finished", active: bool = True) -> None:
        if len(lengths) != head.points:
            raise ValueError(f"quality head: {head.points} detection points, {len(lengths)} lengths")
        self.head, self.stopper, self.at, self.m, self.threshold = head, stopper, lengths, m, threshold
        self.rule, self.active = rule, active
        self.latest: dict[tuple[int, int], float] = {}  # the calibrated probability at a sample's last point
        # per point: the samples shown there, their features [D], the head's raw score and calibrated probability then
        self.observed: list[list[tuple[tuple[int, int], torch.Tensor, float, float]]] = [[] for _ in lengths]
        self.pruned: list[tuple[int, int]] = []

    def lengths(self, prompt: int) -> tuple[int, ...]:
        return self.at

    def __call__(self, samples: list[tuple[int, int]], lengths: list[int], features: torch.Tensor,
                 running: list[tuple[int, int]]) -> list[tuple[int, int]]:
        for point, length in enumerate(self.at):
            mine = [i for i, at in enumerate(lengths) if at == length]
            if not mine:
                continue
            shown = features[mine].double()  # [S, D]
            scores = self.head.scores(point, shown)
            for i, feature, score, probability in zip(mine, shown, scores.tolist(),
                                                      self.head.calibrated(point, scores).tolist()):
                self.observed[point].append((samples[i], feature, score, probability))
                self.latest[samples[i]] = probability
        if not self.active:
            return []
        named = []
        for group in sorted({prompt for prompt, _ in samples}):
            runners = [sample for sample in running if sample[0] == group]
            probability = torch.tensor([self.latest.get(sample, 0.5) for sample in runners], dtype=torch.float64)
            at_group = torch.zeros(len(runners), dtype=torch.long)
            finished = self.finished(group)[None]  # [1, 2]
            if self.rule == "sure":
                flags, _ = prune_trusting_sure(finished, at_group, probability, self.m, self.threshold)
            else:
                flags = prune_running(finished, at_group, probability, self.m, self.threshold)
            named += [sample for sample, flag in zip(runners, flags.tolist()) if flag]
        self.pruned += named
        return named

    def finished(self, prompt: int) -> torch.Tensor:
        """[2]: the prompt's finished samples at the reward's low and high bound (early stop's scores)."""
        low, high = self.stopper.bounds
        slack = 1e-6 * (high - low)  # as early stop counts a reward at a bound
        rewards = torch.tensor(self.stopper.rewards[prompt], dtype=torch.float64)
        return torch.stack([(rewards <= low + slack).sum(), (rewards >= high - slack).sum()])

    def learned(self, high: dict[tuple[int, int], bool]) -> list[dict]:
        """What the head learns from this call (:func:`statistics` per point), from the shown
        samples whose class the scores now tell (``high``: sample -> ended at the high bound)."""
        out = []
        for observed in self.observed:
            known = [(feature, score, high[sample]) for sample, feature, score, _ in observed if sample in high]
            if not known:
                out.append(statistics(torch.zeros(0, self.head.dim, dtype=torch.float64), torch.zeros(0),
                                      torch.zeros(0), self.head.bins))
                continue
            features, scores, labels = zip(*known)
            out.append(statistics(torch.stack(features), torch.tensor(scores), torch.tensor(labels).long(),
                                  self.head.bins))
        return out

    def skill(self, high: dict[tuple[int, int], bool]) -> dict[str, float]:
        """The head's skill at each point on the shown samples that finished (its scores then,
        before it learned them): AUC, calibration error, and how often a sure prediction was wrong,
        the estimate of the error rate among the samples it pruned (whose class is never known)."""
        record = {"pruned_samples": float(len(self.pruned))}
        for point, observed in enumerate(self.observed):
            known = [(score, probability, high[sample]) for sample, _, score, probability in observed
                     if sample in high]
            if not known:
                continue
            scores, probability, labels = (torch.tensor(column, dtype=torch.float64) for column in zip(*known))
            labels = labels.long()
            sure = (probability >= self.threshold) | (probability <= 1 - self.threshold)
            wrong = ((probability >= 0.5).long() != labels) & sure
            record |= {f"prune_auc_{point}": auc(scores, labels),
                       f"prune_calibration_error_{point}": calibration_error(probability, labels),
                       f"prune_sure_wrong_{point}": float(wrong.sum()) / max(1, int(sure.sum()))}
        return record

"""A quality head: the chance that a running sample ends at the high reward bound, from the
policy's hidden states, learned online (#72; ARRoL, arXiv 2603.24840, trains such a head on
the policy's hidden states and calibrates it by bins).

**What it reads.** At each detection point (a fraction of the sample's expected length), the
mean over the sample's generated tokens so far of the policy's last hidden state, the one
the logits are computed from (``features`` [S, d], detached: the head never moves the
policy). The last layer costs nothing extra (the decoder has it for the logits); the mean
over the completion so far is steadier than the last token's state, which is one position's.

**The model.** Per detection point, ridge regression of the class (0 / 1) on [1, features],
refit in closed form from sums (X^T X, X^T y) that decay by ``decay`` per step (the policy
moves, and older samples describe an older policy). Its score is then calibrated by bins:
each bin of the score's range holds how many samples scored there and how many ended high,
counted *before* those samples were learned from (each step's predictions are scored against
the step's labels, then learned: prequential), so the calibration is out of sample; a bin's
probability is (high + 1) / (count + 2), 0.5 where nothing is known, so a head with no
evidence prunes nothing.

**Across processes.** Learning is in two halves: :func:`statistics` (what one process's
finished samples add, as tensors a collective can sum) and :meth:`QualityHead.absorb` (decay,
then add the sum), so every process holds the same head.

Pure tensors, float64; no model, no config.
"""

from __future__ import annotations

import torch

STATE_KEYS = ("xtx", "xty", "bin_count", "bin_high", "steps")


def with_bias(features: torch.Tensor) -> torch.Tensor:
    """[S, d] -> [S, 1 + d] float64, a leading 1 (the regression's intercept)."""
    ones = torch.ones(features.shape[0], 1, dtype=torch.float64)
    return torch.cat([ones, features.to(torch.float64)], dim=1)


def score_bins(scores: torch.Tensor, bins: int) -> torch.Tensor:
    """scores [S] (a linear probability: about [0, 1]) -> bin index [S], clamped into range."""
    return (scores.clamp(0.0, 1.0) * bins).long().clamp(max=bins - 1)


def statistics(features: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, bins: int) -> dict:
    """What one process's finished samples at one detection point add to the head: features
    [S, d] (the pooled hidden states), scores [S] (the head's raw scores when they were taken),
    labels [S] (1: ended at the high bound). Sums a collective may add across processes."""
    x, y = with_bias(features), labels.to(torch.float64)
    which = score_bins(scores.to(torch.float64), bins)
    return {"xtx": x.T @ x, "xty": x.T @ y,
            "bin_count": torch.zeros(bins, dtype=torch.float64).index_add_(0, which, torch.ones_like(y)),
            "bin_high": torch.zeros(bins, dtype=torch.float64).index_add_(0, which, y)}


class QualityHead:
    """One ridge regression and one calibration for each of ``points`` detection points (where
    they fall in a sample is the caller's: fractions of its expected length, for pruning)."""

    def __init__(self, dim: int, points: int, *, ridge: float = 1.0, decay: float = 0.9,
                 bins: int = 10) -> None:
        if points < 1:
            raise ValueError(f"detection points: need at least one, got {points}")
        if not 0 < decay <= 1:
            raise ValueError(f"decay: must be in (0, 1], got {decay}")
        self.dim, self.points, self.ridge, self.decay, self.bins = dim, points, ridge, decay, bins
        size = dim + 1
        self.xtx = torch.zeros(points, size, size, dtype=torch.float64)  # [K, F, F]
        self.xty = torch.zeros(points, size, dtype=torch.float64)  # [K, F]
        self.bin_count = torch.zeros(points, bins, dtype=torch.float64)  # [K, B]
        self.bin_high = torch.zeros(points, bins, dtype=torch.float64)  # [K, B]
        self.steps = 0  # steps absorbed
        # per point, the regression's weights [F] solved from the sums (None: not yet since they
        # changed): a running sample is scored nearly every decode step, the sums change once a step
        self.solved: list[torch.Tensor | None] = [None] * points

    def scores(self, point: int, features: torch.Tensor) -> torch.Tensor:
        """features [S, d] at detection point ``point`` -> raw scores [S] (0.5 before any sample)."""
        if not self.xtx[point, 0, 0]:
            return torch.full((features.shape[0],), 0.5, dtype=torch.float64)
        if self.solved[point] is None:
            penalty = self.ridge * torch.eye(self.dim + 1, dtype=torch.float64)
            penalty[0, 0] = 0.0  # the intercept is not shrunk
            self.solved[point] = torch.linalg.solve(self.xtx[point] + penalty, self.xty[point])  # [F]
        return with_bias(features) @ self.solved[point]

    def calibrated(self, point: int, scores: torch.Tensor) -> torch.Tensor:
        """raw scores [S] -> the probability [S] of ending high, from the point's bins."""
        which = score_bins(scores, self.bins)
        return (self.bin_high[point, which] + 1) / (self.bin_count[point, which] + 2)

    def absorb(self, added: list[dict]) -> None:
        """One step's learning: every sum decays by ``decay``, then each point's ``added``
        (:func:`statistics`, summed over processes; one dict per point) is added."""
        if len(added) != self.points:
            raise ValueError(f"quality head: {len(added)} sets of statistics for {self.points} points")
        for name in ("xtx", "xty", "bin_count", "bin_high"):
            total = getattr(self, name)
            total *= self.decay
            total += torch.stack([part[name] for part in added])
        self.steps += 1
        self.solved = [None] * self.points

    def state_dict(self) -> dict:
        return {"xtx": self.xtx.clone(), "xty": self.xty.clone(), "bin_count": self.bin_count.clone(),
                "bin_high": self.bin_high.clone(), "steps": self.steps}

    def check_state(self, state: dict) -> None:
        if set(state) != set(STATE_KEYS) or any(tuple(state[k].shape) != tuple(getattr(self, k).shape)
                                                for k in STATE_KEYS[:-1]):
            raise ValueError(f"quality head state does not fit a head of {self.dim} features and "
                             f"{self.points} detection points, {self.bins} bins")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.xtx, self.xty = state["xtx"].clone(), state["xty"].clone()
        self.bin_count, self.bin_high = state["bin_count"].clone(), state["bin_high"].clone()
        self.steps = int(state["steps"])
        self.solved = [None] * self.points


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The chance a random high sample scores above a random low one (ties count half): the
    head's skill at ranking, NaN without both classes."""
    high, low = scores[labels.bool()], scores[~labels.bool()]
    if not len(high) or not len(low):
        return float("nan")
    above = ((high[:, None] > low[None, :]).double().mean()
             + 0.5 * (high[:, None] == low[None, :]).double().mean())
    return float(above)


def calibration_error(probabilities: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> float:
    """Expected calibration error: over equal-width bins of the predicted probability, the
    share-weighted gap between the mean prediction and the share that ended high (NaN when empty)."""
    if not len(probabilities):
        return float("nan")
    which = score_bins(probabilities.to(torch.float64), bins)
    y = labels.to(torch.float64)
    predicted = torch.zeros(bins, dtype=torch.float64).index_add_(0, which, probabilities.to(torch.float64))
    ended = torch.zeros(bins, dtype=torch.float64).index_add_(0, which, y)
    return float((predicted - ended).abs().sum() / len(y))

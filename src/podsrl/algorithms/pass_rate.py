"""Which prompts are worth generating for: a per-prompt pass-rate posterior and the chance
that a group of n rollouts is informative under it. Pure functions and one small estimator
on tensors of the train split's size [N]; no model, no config.

A group of n rollouts teaches GRPO and PODS nothing when every rollout gets the same reward
(its advantages are all 0). With pass/fail correctness at pass rate p, that happens with
probability p^n + (1 - p)^n. With p unknown and a Beta(a, b) belief about it,

    P(not constant) = 1 - E[p^n] - E[(1 - p)^n],   E[p^n] = prod_{j<n} (a + j) / (a + b + j)

(the Beta moment: B(a + n, b) / B(a, b)). The selector samples prompts in proportion to it
(DAPO, Yu et al. 2025, drops constant groups after generating them; predicting them
before generation is the idea of dynamics-predictive and difficulty-targeted selection).

The belief of prompt i is Beta(kappa * pool + s_i, kappa * (1 - pool) + f_i): its own
discounted passes s_i and fails f_i (evidence from t steps ago weighs 0.5^(t / half_life):
the policy moves, so old outcomes say less), shrunk toward the pool's pass rate with the
weight of kappa pseudo-observations, so a prompt seen rarely, or never, is judged mostly by
the pool.
"""

from __future__ import annotations

import torch


def beta_power_mean(alpha: torch.Tensor, beta: torch.Tensor, n: int) -> torch.Tensor:
    """E[p^n] for p ~ Beta(alpha, beta), elementwise (float64): B(alpha + n, beta) / B(alpha, beta)."""
    alpha, beta = alpha.double(), beta.double()
    return torch.exp(torch.lgamma(alpha + n) + torch.lgamma(alpha + beta) - torch.lgamma(alpha)
                     - torch.lgamma(alpha + beta + n))


def nonconstant_probability(alpha: torch.Tensor, beta: torch.Tensor, n: int) -> torch.Tensor:
    """P(a group of n pass/fail rollouts is not all-pass or all-fail) under Beta(alpha, beta) [N]."""
    return (1.0 - beta_power_mean(alpha, beta, n) - beta_power_mean(beta, alpha, n)).clamp(0.0, 1.0)


def draw_probabilities(informativeness: torch.Tensor, exploration: float) -> torch.Tensor:
    """Per-prompt draw probabilities [N]: (1 - exploration) in proportion to informativeness,
    exploration spread evenly, so every prompt keeps at least exploration / N (none starves,
    whatever its estimate); all even when nothing looks informative."""
    total = informativeness.sum()
    size = informativeness.numel()
    if not total > 0:
        return torch.full((size,), 1.0 / size, dtype=torch.float64)
    return (1.0 - exploration) * informativeness.double() / total + exploration / size


class PassRatePosterior:
    """Discounted pass / fail counts per prompt [N] and for the pool, updated with each
    step's outcomes. Counts are kept discounted to ``as_of`` (the last step observed)."""

    def __init__(self, size: int, half_life: float, prior_strength: float) -> None:
        self.size, self.half_life, self.prior_strength = size, half_life, prior_strength
        self.passes = torch.zeros(size, dtype=torch.float64)  # [N] s_i as of `as_of`
        self.fails = torch.zeros(size, dtype=torch.float64)  # [N] f_i
        self.seen = torch.zeros(size, dtype=torch.bool)  # [N] observed at least once
        self.pool = torch.zeros(2, dtype=torch.float64)  # discounted passes, fails of every prompt
        self.as_of = 0

    def _decay_to(self, step: int) -> None:
        factor = 0.5 ** ((step - self.as_of) / self.half_life)
        self.passes *= factor
        self.fails *= factor
        self.pool *= factor
        self.as_of = step

    def observe(self, step: int, indices: torch.Tensor, passes: torch.Tensor, trials: torch.Tensor) -> None:
        """Outcomes of ``step``: prompt ``indices`` [K] had ``passes`` [K] of ``trials`` [K]
        rollouts pass (unverifiable rollouts left out of both; a prompt may repeat)."""
        self._decay_to(step)
        passes, fails = passes.double(), (trials - passes).double()
        self.passes.index_add_(0, indices, passes)
        self.fails.index_add_(0, indices, fails)
        self.seen[indices[trials > 0]] = True
        self.pool += torch.stack([passes.sum(), fails.sum()])

    def pool_rate(self) -> float:
        """The pool's pass rate, with one pseudo-pass and one pseudo-fail (0.5 before any evidence)."""
        passes, fails = self.pool.tolist()
        return (passes + 1.0) / (passes + fails + 2.0)

    def beta(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each prompt's Beta(alpha, beta) at ``step`` [N] each (evidence discounted to it)."""
        factor = 0.5 ** ((step - self.as_of) / self.half_life)
        pool = self.pool_rate()
        return (self.prior_strength * pool + factor * self.passes,
                self.prior_strength * (1.0 - pool) + factor * self.fails)

    def state_dict(self) -> dict:
        """Plain lists and numbers (a checkpoint's JSON); only prompts seen so far."""
        seen = self.seen.nonzero().flatten()
        return {"as_of": self.as_of, "pool": self.pool.tolist(), "seen": seen.tolist(),
                "passes": self.passes[seen].tolist(), "fails": self.fails[seen].tolist()}

    def load_state_dict(self, state: dict) -> None:
        seen = torch.tensor(state["seen"], dtype=torch.long)
        self.passes.zero_()
        self.fails.zero_()
        self.seen.zero_()
        self.passes[seen] = torch.tensor(state["passes"], dtype=torch.float64)
        self.fails[seen] = torch.tensor(state["fails"], dtype=torch.float64)
        self.seen[seen] = True
        self.pool = torch.tensor(state["pool"], dtype=torch.float64)
        self.as_of = state["as_of"]

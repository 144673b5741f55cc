"""Adaptive n (``adaptive_n``): how many rollouts per prompt to generate this step.

PODS trains on m rollouts per prompt whatever n is; n only buys a better-informed kept set.
A kept group teaches nothing when all its rewards are equal (its advantages are 0), and with
max-variance selection the kept group is constant exactly when all n rollouts are. So the
learning signal of a step is, to first order, the number of its groups that are not
constant, and with ``scale_rewards`` (the default) every such group contributes advantages
of unit scale whatever its variance. The controller picks the n that maximises

    expected non-constant groups per step / expected seconds per step

from the run's own measurements:

* how often groups of a given size are constant: each recent group's reward values give a
  Dirichlet posterior over the prompt's reward distribution (the observed values plus one
  "unseen value" category, Jeffreys prior 1/2 each); the chance that s fresh samples all
  land on one value has a closed form (Dirichlet moments). This extrapolates beyond the n
  observed: a group seen all-correct 16 times still has a chance to show a wrong answer in
  64 samples. Averaged over the recent groups (the step's next prompts are new ones drawn
  from the same data), it is the expected fraction of informative groups at each size;
* what a rollout costs: generation + reward seconds regressed on rollouts generated
  (a fixed part per step and a part per rollout), over a window of recent steps; the rest
  of the step (selection, update) does not depend on n. Every ``explore_every`` steps the
  controller tries about twice or half its choice so that the regression sees more than one n.

Decisions use only numbers every process has (gathered rewards, the slowest process's
timers), so all processes choose the same n.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import torch

PRIOR = 0.5  # Jeffreys: pseudo-count of each observed value and of the unseen-value category
GRID = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # candidate n as multiples of m


def candidate_sizes(m: int, n_max: int) -> list[int]:
    """The sizes the controller chooses from: m times GRID, up to n_max (n_max included)."""
    sizes = sorted({int(round(m * k)) for k in GRID if m * k <= n_max} | {n_max})
    return [s for s in sizes if s >= m]


def value_counts(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [G, k] (NaN = no sample) -> counts [G, V] of each group's distinct values
    (0-padded; V = the most distinct values in any group)."""
    rows = []
    for group in rewards.tolist():
        values = [v for v in group if not math.isnan(v)]
        rows.append([values.count(v) for v in sorted(set(values))])
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.float64)


def constant_probability(counts: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """counts [G, V] (0 = no such value), sizes [S] -> [G, S]: the posterior probability that
    s fresh samples of the group's prompt all have the same reward.

    Dirichlet(counts + PRIOR, PRIOR) over the observed values and one unseen category; the
    probability that all s samples fall in category j is E[q_j^s] =
    Gamma(a_j + s) Gamma(A) / (Gamma(a_j) Gamma(A + s)) with A the sum of the parameters.
    (Counting the unseen category as one value slightly overstates constancy when it hides
    several values; it matters only while a group has few samples.)"""
    observed = counts > 0  # [G, V]
    alphas = torch.cat([torch.where(observed, counts + PRIOR, torch.zeros_like(counts)),
                        torch.full_like(counts[:, :1], PRIOR)], dim=1)  # [G, V+1]
    present = torch.cat([observed, torch.ones_like(observed[:, :1])], dim=1)
    total = alphas.sum(dim=1, keepdim=True)  # [G, 1]
    s = sizes.double().view(1, 1, -1)  # [1, 1, S]
    a = alphas.unsqueeze(-1)  # [G, V+1, 1]
    log_moment = (torch.lgamma(a + s) - torch.lgamma(a.clamp_min(1e-300)) + torch.lgamma(total).unsqueeze(-1)
                  - torch.lgamma(total.unsqueeze(-1) + s))  # [G, V+1, S]
    moment = torch.where(present.unsqueeze(-1), log_moment.exp(), torch.zeros_like(log_moment))
    return moment.sum(dim=1).clamp(0.0, 1.0)  # [G, S]


def generation_cost(rollouts: list[float], seconds: list[float]) -> tuple[float, float]:
    """(fixed seconds per step, seconds per rollout) of generation + reward: least squares
    over the recent steps when they generated different numbers of rollouts; otherwise (or
    when the fit is not positive) all of it is put per rollout, which overstates what one
    more rollout costs and so errs toward smaller n."""
    mean_x, mean_y = sum(rollouts) / len(rollouts), sum(seconds) / len(seconds)
    spread = sum((x - mean_x) ** 2 for x in rollouts)
    if spread > 0:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(rollouts, seconds)) / spread
        fixed = mean_y - slope * mean_x
        if slope > 0 and fixed >= 0:
            return fixed, slope
    return 0.0, mean_y / max(mean_x, 1e-12)


class GroupSizePolicy(Protocol):
    """How many rollouts per prompt each step generates: :class:`FixedGroupSize` or
    :class:`RolloutBudget` (adaptive n). Checkpointed through ``state_dict``."""

    decision: dict  # what the last ``choose`` decided and why (merged into the step's metrics record)

    def choose(self, step: int) -> int: ...

    def observe(self, rewards: torch.Tensor, generation_seconds: float, rest_seconds: float) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class FixedGroupSize:
    """n every step (``num_generations``); learns nothing, so it has no state."""

    def __init__(self, n: int) -> None:
        self.n, self.decision = n, {}

    def choose(self, step: int) -> int:
        return self.n

    def observe(self, rewards: torch.Tensor, generation_seconds: float, rest_seconds: float) -> None:
        pass  # nothing to learn: the size is fixed

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"a fixed group size keeps no state, the checkpoint has {sorted(state)}")


class RolloutBudget:
    """Chooses n each step (``choose``) and learns from what the step measured (``observe``).

    ``prompts``: prompt groups per step over all processes (P); ``n_start``: the size of the
    first steps, before anything is measured."""

    def __init__(self, m: int, n_start: int, n_max: int, prompts: int, *, window: int = 24,
                 signal_steps: int = 4, explore_every: int = 8) -> None:
        self.sizes = candidate_sizes(m, n_max)
        self.prompts, self.explore_every = prompts, explore_every
        self.n_start = min(self.sizes, key=lambda s: abs(s - n_start))
        self.costs: deque = deque(maxlen=window)  # (rollouts, generation s, rest s) per step
        self.groups: deque = deque(maxlen=signal_steps)  # per step: value counts [G, V]
        self.decision: dict = {}

    def choose(self, step: int) -> int:
        """n for ``step`` (1-based); ``decision`` says why."""
        if not self.costs:
            return self._decide(self.n_start, None, None, explore=False)
        informative = self.informative()  # [S]
        fixed, per_rollout = generation_cost([c[0] for c in self.costs], [c[1] for c in self.costs])
        rest = sum(c[2] for c in self.costs) / len(self.costs)
        seconds = torch.tensor([fixed + per_rollout * self.prompts * s + rest for s in self.sizes])
        rate = informative * self.prompts / seconds  # informative groups per second
        best = int(rate.argmax())
        seen = {c[0] / self.prompts for c in self.costs}  # the sizes the cost fit has seen
        explore = len(self.sizes) > 1 and (len(seen) < 2 or step % self.explore_every == 0)
        if explore:
            best = self.explored(best, up=(step // self.explore_every) % 2 == 0,
                                 avoid=seen if len(seen) < 2 else set())
        return self._decide(self.sizes[best], float(informative[best]), (fixed, per_rollout, rest), explore)

    def explored(self, best: int, up: bool, avoid: set) -> int:
        """The size tried instead of ``best`` (an index into ``sizes``): about twice or half as
        many rollouts (two grid steps), alternately, so that the cost regression sees sizes far
        enough apart for its slope to rise above the timing noise. While the fit has seen one
        size, that size is in ``avoid``: the other direction, or else ``best`` itself, is taken
        if it would repeat it (else the controller would keep exploring the one size it has)."""
        last = len(self.sizes) - 1
        larger, smaller = min(best + 2, last), max(best - 2, 0)
        order = (larger, smaller) if (up or best == 0) and best < last else (smaller, larger)
        candidates = [index for index in order if index != best] + ([best] if avoid else [])
        return next((index for index in candidates if self.sizes[index] not in avoid), order[0])

    def informative(self) -> torch.Tensor:
        """[S] the expected fraction of non-constant groups at each candidate size."""
        counts = [c for c in self.groups]
        width = max(c.shape[1] for c in counts)
        stacked = torch.cat([torch.nn.functional.pad(c, (0, width - c.shape[1])) for c in counts])  # [G, V]
        return 1.0 - constant_probability(stacked, torch.tensor(self.sizes)).mean(dim=0)

    def _decide(self, n: int, informative: float | None, costs: tuple | None, explore: bool) -> int:
        self.decision = {"n": n, "n_explore": int(explore)}
        if informative is not None:
            fixed, per_rollout, rest = costs
            self.decision.update(n_informative=informative, n_generation_fixed_s=fixed,
                                 n_generation_per_rollout_s=per_rollout, n_rest_s=rest)
        return n

    def observe(self, rewards: torch.Tensor, generation_seconds: float, rest_seconds: float) -> None:
        """rewards [P, n] of the step's groups over all processes (NaN: skipped by early
        stop); generation_seconds: generate + reward; rest_seconds: the rest of the step."""
        self.groups.append(value_counts(rewards))
        self.costs.append((float(rewards.numel()), generation_seconds, rest_seconds))

    def state_dict(self) -> dict:
        """Plain lists (stored in the checkpoint's JSON trainer state)."""
        return {"costs": [list(c) for c in self.costs], "groups": [c.tolist() for c in self.groups]}

    def load_state_dict(self, state: dict) -> None:
        self.costs.clear()
        self.costs.extend(tuple(c) for c in state["costs"])
        self.groups.clear()
        self.groups.extend(torch.tensor(c, dtype=torch.float64) for c in state["groups"])

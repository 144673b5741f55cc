"""Down-sampling rules: which m of the n rollouts of each prompt go into the update.

The selection input is a :class:`Groups`: rewards ``[P, n]`` (one row per prompt group; never
flattened across prompts), which samples were generated (early stop skips some) and their
completion lengths. A rule returns the kept indices ``[P, m]`` (long), **sorted ascending
within each row**, so that with m == n every rule returns ``arange(n)`` and PODS performs
exactly the computation of GRPO. Two forms, one registry:

* ``rule(rewards, m, generator=None)``: rewards only (the built-in rules; pure tensor code).
  Samples early stop skipped reach it at their group's mean, which max-variance never keeps
  (:func:`podsrl.algorithms.early_stop.fill_skipped`).
* ``rule(groups, m, generator=None)`` marked :func:`takes_groups`: the whole :class:`Groups`,
  for rules that weigh lengths or must see the generated mask themselves.

``generator`` is the run's seeded ``torch.Generator``; only rules that draw use it. Rules are
registered by name in ``RULES`` (``@RULES.register("name")``), or named in the config as
``module:function`` / ``file.py:function`` without registering (:mod:`podsrl.registry`).
:func:`select` is the one selection core of podsrl's trainer, ``podsrl.integrations.trl``
and every other integration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from podsrl.algorithms.early_stop import fill_skipped
from podsrl.contracts import broken, tensor_like
from podsrl.registry import Registry

Rule = Callable[[torch.Tensor, int, "torch.Generator | None"], torch.Tensor]


@dataclass(frozen=True)
class Groups:
    """What a rule selects from: P prompt groups of n samples each."""

    rewards: torch.Tensor  # [P, n]; NaN where a sample was never generated
    # [P, n] bool, False where early stop skipped a sample; None = all were
    generated: torch.Tensor | None = None
    lengths: torch.Tensor | None = None  # [P, n] completion tokens; None where the caller has none

    def selectable_rewards(self) -> torch.Tensor:
        """[P, n] rewards with skipped samples at their group's mean (they never win max-variance)."""
        return fill_skipped(self.rewards, self.generated)


def takes_groups(rule: Callable) -> Callable:
    """Mark a rule as ``rule(groups: Groups, m, generator)`` instead of ``rule(rewards, m, generator)``."""
    rule.takes_groups = True
    return rule


def _check(rewards: torch.Tensor, m: int) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, n], got shape {tuple(rewards.shape)}")
    if not 1 <= m <= rewards.shape[1]:
        raise ValueError(f"m must satisfy 1 <= m <= n={rewards.shape[1]}, got m={m}")


def kept_indices(value, args: tuple, field: str, spec: str) -> torch.Tensor:
    """A rule's contract: indices [P, m] (integers) into each group's n samples, none repeated
    within a group, none a sample early stop skipped; returned sorted within each row (the
    form every rule gives: with m == n that is arange(n), GRPO's computation)."""
    source, m = args[0], args[1]
    groups = source if isinstance(source, Groups) else Groups(source)
    num_prompts, n = groups.rewards.shape
    index = tensor_like(value, field, spec, (num_prompts, m), floating=False).long()
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= n):
        bad = int(index[(index < 0) | (index >= n)][0])
        raise broken(field, spec, f"index {bad}, outside 0..{n - 1} (the group's samples)")
    ordered = index.sort(dim=1).values  # [P, m]
    if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
        raise broken(field, spec, "an index twice within one group (each kept sample must be different)")
    return ordered


RULES = Registry("rule", "downsampling_rule", takes="(rewards, m, generator=None)", arity=3,
                 check_output=kept_indices)


@RULES.register("max_variance")
def max_variance(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The PODS rule (Xu et al., arXiv 2504.13818): keep the m rewards of largest variance.

    A variance-maximising m-subset always consists of the k highest and the m-k lowest
    rewards for some k in 0..m (the paper's structural result for max-variance
    down-sampling; the exhaustive-search test checks it). So: one stable sort per group
    (O(n log n)), then prefix sums of the m lowest and suffix sums of the m highest sorted
    rewards and squares score every k in O(m); vectorised over the P groups.

    Ties: among k with equal variance (within 1e-9 of the group's squared reward range, so floating-point
    noise cannot decide) the smallest k wins; among equal rewards the stable sort keeps the
    lower original index first, so the lowest-index copies are the "lowest" and the
    highest-index copies the "highest". The result is fully deterministic.
    """
    _check(rewards, m)
    num_prompts, n = rewards.shape
    values = rewards.double()
    sorted_values, order = torch.sort(values, dim=1, stable=True)  # [P, n] ascending
    # Centre each group first: variance is shift-invariant and centring removes the
    # cancellation in E[x^2] - E[x]^2 when rewards sit far from zero.
    sorted_values = sorted_values - sorted_values.mean(dim=1, keepdim=True)
    zero = sorted_values.new_zeros(num_prompts, 1)
    low = sorted_values[:, :m]  # [P, m] the m lowest
    high = sorted_values[:, n - m:].flip(1)  # [P, m] the m highest, largest first
    low_sum = torch.cat([zero, low.cumsum(1)], 1)  # [P, m+1]: sum of the i lowest
    low_sq = torch.cat([zero, (low * low).cumsum(1)], 1)
    high_sum = torch.cat([zero, high.cumsum(1)], 1)  # [P, m+1]: sum of the i highest
    high_sq = torch.cat([zero, (high * high).cumsum(1)], 1)
    k = torch.arange(m + 1)  # candidate number of highest rewards kept
    subset_sum = high_sum[:, k] + low_sum[:, m - k]  # [P, m+1]
    subset_sq = high_sq[:, k] + low_sq[:, m - k]
    variance = subset_sq / m - (subset_sum / m) ** 2  # [P, m+1] population variance
    best = variance.max(dim=1, keepdim=True).values
    scale = sorted_values.abs().amax(dim=1, keepdim=True) ** 2  # [P, 1]
    tolerance = 1e-9 * scale.clamp_min(1e-300)
    best_k = (variance >= best - tolerance).long().argmax(dim=1, keepdim=True)  # [P, 1] first max
    slot = torch.arange(m).unsqueeze(0)  # [1, m]
    # slots 0..m-k-1 take sorted positions 0..m-k-1 (lowest); the rest take n-k..n-1 (highest)
    positions = torch.where(slot < m - best_k, slot, slot + (n - m))  # [P, m]
    return order.gather(1, positions).sort(dim=1).values


# algorithms/early_stop.py proves saturation for this rule's selection
max_variance.early_stop_lossless = True


@RULES.register("max_reward")
def max_reward(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The m highest rewards (paper's ablation; it collapsed to 67.3% on GSM8K).
    Ties go to the lower index (stable sort)."""
    _check(rewards, m)
    order = torch.sort(rewards, dim=1, descending=True, stable=True).indices  # [P, n]
    return order[:, :m].sort(dim=1).values


@RULES.register("random")
def random_subset(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """m indices per group uniformly without replacement, drawn from ``generator`` (the
    run's seeded generator) or torch's global RNG."""
    _check(rewards, m)
    keys = torch.rand(rewards.shape, generator=generator)  # [P, n] iid uniform
    return keys.argsort(dim=1)[:, :m].sort(dim=1).values


def select(rule: str | Callable, groups: Groups | torch.Tensor, m: int,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices [P, m] of the rollouts to keep: the rule (a name, ``module:function``, or the
    function) applied to ``groups`` (a :class:`Groups`, or bare rewards [P, n]);
    ``generator``: the run's seeded stream, for rules that draw. The rule's output is checked
    (:func:`kept_indices`); a rule that keeps a sample early stop never generated fails here."""
    groups = groups if isinstance(groups, Groups) else Groups(groups)
    fn = RULES.checked(rule)
    order = None
    seen = groups
    if groups.generated is not None and not bool(groups.generated.all()):
        # generated samples first within each group, in their order: a rule's stable tie-breaking
        # then keeps generated samples among equal rewards (a sample pruned from a group whose
        # generated rewards are all equal is filled with that same value, #72)
        order = (~groups.generated).long().argsort(dim=1, stable=True)  # [P, n]
        seen = Groups(*(None if field is None else field.gather(1, order)
                        for field in (groups.rewards, groups.generated, groups.lengths)))
    keep = fn(seen, m, generator) if fn.takes_groups else fn(seen.selectable_rewards(), m, generator)
    if order is not None:
        keep = order.gather(1, keep).sort(dim=1).values  # [P, m] original indices
    if groups.generated is not None and not bool(groups.generated.gather(1, keep).all()):
        raise broken(fn.field, fn.spec,
                     "a sample early stop never generated (it has no completion to train on)")
    return keep


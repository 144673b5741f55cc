"""Extending podsrl without editing it: two down-sampling rules, named in the config as
``examples/extensions.py:max_variance_no_ties`` or ``examples/extensions.py:max_variance_shortest``
(docs/algorithms.md, "Your own rule, engine, task or reward").

A rule returns the kept indices [P, m], sorted within each row. It takes either rewards [P, n]
(``max_variance_no_ties``) or, marked ``@takes_groups``, the whole selection input
(``podsrl.algorithms.select.Groups``: rewards, the generated mask, completion lengths), as
``max_variance_shortest`` does; then m and the run's seeded generator."""

import torch

from podsrl.algorithms.select import Groups, max_variance, takes_groups


def max_variance_no_ties(rewards: torch.Tensor, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """max_variance after a tiny seeded jitter: among equally good subsets, a random one
    rather than the smallest-k one the built-in rule's tie-break picks."""
    jitter = torch.rand(rewards.shape, generator=generator, dtype=torch.float64) * 1e-9  # [P, n]
    return max_variance(rewards.double() + jitter, m)


@takes_groups
def max_variance_shortest(groups: Groups, m: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The reward values max_variance keeps, on the fewest completion tokens: the variance
    depends only on the kept values, so each value's copies are taken shortest first (then by
    index). Samples early stop skipped are never taken."""
    rewards = groups.selectable_rewards()  # [P, n]
    lengths = groups.lengths if groups.lengths is not None else torch.zeros_like(rewards)  # [P, n]
    exists = groups.generated if groups.generated is not None else torch.ones_like(rewards, dtype=torch.bool)
    kept = []
    for row, row_lengths, row_exists, best in zip(rewards, lengths, exists, max_variance(rewards, m)):
        values, counts = row[best].unique(return_counts=True)
        chosen = []
        for value, count in zip(values, counts.tolist()):
            copies = ((row == value) & row_exists).nonzero().flatten()  # [c] indices holding this reward
            chosen += copies[row_lengths[copies].argsort(stable=True)[:count]].tolist()
        kept.append(sorted(chosen))
    return torch.tensor(kept, dtype=torch.long)  # [P, m]


def leave_one_out(rewards: torch.Tensor, scale_by_std: bool = True) -> torch.Tensor:
    """An advantage estimator (``advantage_estimator: examples/extensions.py:leave_one_out``):
    RLOO's baseline, each rollout's reward minus the mean of the other kept rewards of its
    group (Ahmadian et al., arXiv 2402.14740), so a rollout never baselines itself.
    rewards [P, m] -> advantages [P, m]; ``scale_by_std`` is not used (RLOO does not scale)."""
    m = rewards.shape[1]
    if m < 2:
        return torch.zeros_like(rewards)
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (m - 1)  # [P, m]
    return rewards - others


def sequence_sum(per_token: torch.Tensor, mask: torch.Tensor, num_sequences: int, num_tokens: float) -> torch.Tensor:
    """A loss type (``loss_type: examples/extensions.py:sequence_sum``): each sequence's
    token terms summed, not averaged, then the mean over the step's sequences, so a long
    completion weighs more than a short one. per_token, mask [B, Lc] -> scalar."""
    return (per_token * mask).sum() / num_sequences

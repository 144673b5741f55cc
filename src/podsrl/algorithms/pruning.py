"""Which running samples PODS will not keep: quota-aware pruning of running rollouts (#72).

With rewards at two values (a reward's declared bounds, ``podsrl.rewards.bounded``), the
max-variance m-subset of a group (``select.max_variance``) holds floor(m/2) samples of one
class and ceil(m/2) of the other, as far as each class allows; within a class samples are
interchangeable for the variance. Once a group's *finished* samples of one class fill every
place the subset can give that class, a running sample that will end in that class is work
PODS throws away. ARRoL (arXiv 2603.24840) prunes on a learned head's prediction of a
running sample's success; podsrl adds the quota: it prunes only a class whose places are
filled, and never the scarce one.

The places the subset gives class c depend on how many samples of the other class the group
will end with. A group is sure of its finished samples, and, when the head is right, of its
running samples predicted in the other class with confidence at least ``threshold``
(``sure_other``). Class c's running samples predicted c (confidence >= threshold) are pruned
when

    finished_c >= max(floor(m/2), m - sure_other)

(with sure_other >= ceil(m/2) the subset takes floor(m/2) of c; with fewer, it takes
m - (other class) of c, all of them already finished). So when the head is right the pruned
group's best m-subset has the variance of the completed group's, and it always keeps at least
m samples (finished_c + sure_other >= m, and no sure sample is pruned). A head that is wrong
costs at most what ``tests/test_pruning.py`` computes by brute force: the kept variance falls
to what the group's finished samples and its unpruned ones give.

Both classes may be pruned at once only when the finished samples alone fill the subset (the
group is saturated: ``early_stop.saturated``); otherwise the high class is decided first and
the low class counts the high class's sure samples only if they are not being pruned.

Every function works on tensors with the group axis explicit; no model, no config.
"""

from __future__ import annotations

import torch


def needed(m: int, sure_other: torch.Tensor) -> torch.Tensor:
    """sure_other [P] -> [P]: the finished samples of a class that fill every place the
    max-variance m-subset can give it when the other class ends with at least ``sure_other``."""
    return torch.clamp(m - sure_other, min=m // 2)


def prune_running(finished: torch.Tensor, group: torch.Tensor, high_probability: torch.Tensor, m: int,
                  threshold: float) -> torch.Tensor:
    """The running samples to prune.

    finished [P, 2]: each group's finished samples at the low and the high reward bound;
    group [S]: each running sample's group; high_probability [S]: the head's calibrated
    probability that the sample ends at the high bound; threshold in (0.5, 1]: the confidence
    a prediction needs. -> [S] bool.
    """
    if not 0.5 < threshold <= 1.0:
        raise ValueError(f"threshold: must be in (0.5, 1], got {threshold}")
    groups = finished.shape[0]
    confident = torch.stack([1 - high_probability >= threshold, high_probability >= threshold],
                            dim=1)  # [S, 2]
    sure_running = torch.zeros(groups, 2, dtype=torch.long).index_add_(0, group, confident.long())  # [P, 2]
    low, high = finished[:, 0], finished[:, 1]
    full = torch.stack([low >= needed(m, high), high >= needed(m, low)], dim=1)  # [P, 2] on finished alone
    prune_high = full[:, 1] | (high >= needed(m, low + sure_running[:, 0] * ~full[:, 0]))  # [P]
    prune_low = full[:, 0] | (~prune_high & (low >= needed(m, high + sure_running[:, 1])))  # [P]
    pruned_class = torch.stack([prune_low, prune_high], dim=1)[group]  # [S, 2]
    return (pruned_class & confident).any(dim=1)


def target_split(reliable_low: int, reliable_high: int, m: int) -> tuple[int, int] | None:
    """The (low, high) counts of a max-variance m-subset the group can be sure to hold when it
    can rely on ``reliable_*`` samples of each class (finished, plus sure running ones), or
    None while neither class may be pruned: a class below floor(m/2) is scarce (all of it is
    needed), and the other class then fills the rest, if it can."""
    fewer = m // 2
    if reliable_low >= fewer and reliable_high >= fewer and reliable_low + reliable_high >= m:
        high = m - fewer if reliable_high >= m - fewer else fewer
        return m - high, high
    if reliable_low < fewer and reliable_high >= m - reliable_low:
        return reliable_low, m - reliable_low
    if reliable_high < fewer and reliable_low >= m - reliable_high:
        return m - reliable_high, reliable_high
    return None


def prune_trusting_sure(finished: torch.Tensor, group: torch.Tensor, high_probability: torch.Tensor, m: int,
                        threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A bolder rule than :func:`prune_running`, measured beside it (#72): a class's places are
    filled by its finished samples *and* its sure running ones (confidence >= threshold). Per
    group, the target split of :func:`target_split` keeps every finished sample and, of each
    class, the most confident sure runners still needed; the other sure runners of a class
    whose places are filled are pruned, and a group whose target covers both classes is settled
    (its unstarted samples need not start). Lossless when the head's sure predictions are
    right; a wrong one can cost a place of the kept subset itself.

    Same inputs as :func:`prune_running`; -> pruned [S] bool, settled [P] bool.
    """
    if not 0.5 < threshold <= 1.0:
        raise ValueError(f"threshold: must be in (0.5, 1], got {threshold}")
    pruned = torch.zeros(len(group), dtype=torch.bool)
    settled = torch.zeros(finished.shape[0], dtype=torch.bool)
    sure = [1 - high_probability >= threshold, high_probability >= threshold]  # [S] each: low, high
    confidence = [1 - high_probability, high_probability]
    for g in group.unique().tolist():
        mine = group == g  # [S]
        reliable = [int(finished[g, c]) + int((sure[c] & mine).sum()) for c in (0, 1)]
        split = target_split(reliable[0], reliable[1], m)
        if split is None:
            continue
        settled[g] = min(split) >= m // 2  # both classes' places are known
        for c in (0, 1):
            candidates = (sure[c] & mine).nonzero()[:, 0]  # sure runners of class c, by index
            keep = max(0, split[c] - int(finished[g, c]))  # a scarce class keeps them all
            order = candidates[confidence[c][candidates].argsort(descending=True, stable=True)]
            pruned[order[keep:]] = True
    return pruned, settled

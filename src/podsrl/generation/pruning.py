"""Quota-aware pruning of running rollouts (#72): the trainer's watcher of kind ``prune_running``.

At each detection point (a fraction of the expected completion length) a running sample is
shown with its pooled hidden state; the run's :class:`~podsrl.algorithms.quality_head.QualityHead`
scores it, and the group's running samples are put to the pruning rule
(:mod:`podsrl.algorithms.pruning`) with the group's finished samples, which early stop's
:class:`~podsrl.generation.saturation.SaturationStopper` has already scored as they finished. What
the pruner saw is kept for the head to learn from once the step's samples are scored (a pruned
sample is never scored: it teaches nothing). Two-valued rewards (the reward's bounds) are what
the rule's guarantee is about: a finished reward strictly inside the bounds fills no place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from podsrl.algorithms.early_stop import at_bounds
from podsrl.algorithms.pruning import prune_running, prune_trusting_sure
from podsrl.algorithms.quality_head import STATE_KEYS, QualityHead, auc, calibration_error, statistics
from podsrl.distributed import Processes
from podsrl.options import NON_NEGATIVE, Range, option
from podsrl.rollout.base import PRUNE_RUNNING

RULES = ("finished", "sure")  # prune_running's places filled by finished samples, or by sure ones too


@dataclass(frozen=True)
class PruningOptions:
    """Quota-aware pruning's settings (the config's fields of these names)."""

    prune_running: bool = option(False, "With group_early_stop on the slots engine: stop running samples "
                                        "that max-variance selection will not need, as a quality head "
                                        "learned online from the policy's hidden states predicts them (#72; "
                                        "docs/rollout_budget.md). Off by default.")
    prune_points: str = option("0.25,0.5", "prune_running: where a running sample is judged, comma-separated "
                                           "fractions of the expected completion length (the mean of the "
                                           "last step's).")
    prune_threshold: float = option(0.8, "prune_running: the calibrated confidence a prediction needs, in "
                                         "(0.5, 1].",
                                     Range(0.5, 1, low_closed=False,
                                           why="below it a class is not the likelier one"))
    prune_warmup_steps: int = option(2, "prune_running: steps the head only watches and learns before it "
                                        "prunes.",
                                     NON_NEGATIVE)
    prune_rule: str = option("finished", "prune_running: 'finished' prunes a class once finished samples "
                                         "fill its places in the max-variance subset (never the scarce one); "
                                         "'sure' lets the head's sure predictions fill them too and settles "
                                         "the group (bolder: a wrong head costs kept variance).")
    prune_head_decay: float = option(0.9, "prune_running: how much of the head's sums each step keeps (older "
                                          "samples describe an older policy).", Range(0, 1, low_closed=False))

    def points(self) -> tuple[float, ...]:
        return tuple(float(point) for point in self.prune_points.split(","))

    def check(self) -> None:
        try:
            points = self.points()
        except ValueError:
            raise ValueError(f"prune_points: comma-separated numbers, got {self.prune_points!r}") from None
        if list(points) != sorted(set(points)) or not all(0 < point <= 4 for point in points):
            raise ValueError("prune_points: distinct ascending fractions in (0, 4] of the expected length, "
                             f"got {self.prune_points!r}")
        if self.prune_rule not in RULES:
            raise ValueError(f"prune_rule: unknown {self.prune_rule!r}; use one of {', '.join(RULES)}")


def detection_lengths(points: tuple[float, ...], expected_length: float) -> tuple[int, ...]:
    """The completion length of each of ``points`` (fractions of ``expected_length``), at least 2:
    non-decreasing; where two points fall on one length, the first takes what is shown there."""
    return tuple(max(2, round(point * expected_length)) for point in points)


class QuotaPruner:
    """One generation call's pruning: shown running samples (:data:`PRUNE_RUNNING`), it scores
    them with ``head`` and names those the rule prunes; ``stopper`` holds the call's finished
    rewards per prompt; ``active`` False: it only watches (the head's warm-up). Under
    ``rule='sure'`` a settled group's samples that are neither running nor among those kept are
    named too, so the ones that have not started never start (``samples``: a group's size)."""

    kind = PRUNE_RUNNING

    def __init__(self, head: QualityHead, stopper, lengths: tuple[int, ...], m: int, threshold: float,
                 rule: str = "finished", active: bool = True, samples: int = 0) -> None:
        if len(lengths) != head.points:
            raise ValueError(f"quality head: {head.points} detection points, {len(lengths)} lengths")
        self.head, self.stopper, self.at, self.m, self.threshold = head, stopper, lengths, m, threshold
        self.rule, self.active, self.samples = rule, active, samples
        self.latest: dict[tuple[int, int], float] = {}  # the calibrated probability at a sample's last point
        # per point: the samples shown there, their features [D], the head's raw score and calibrated
        # probability then
        self.observed: list[list[tuple[tuple[int, int], torch.Tensor, float, float]]] = [[] for _ in lengths]
        self.pruned: list[tuple[int, int]] = []

    def lengths(self, prompt: int) -> tuple[int, ...]:
        return self.at

    def __call__(self, samples: list[tuple[int, int]], lengths: list[int], features: torch.Tensor,
                 running: list[tuple[int, int]]) -> list[tuple[int, int]]:
        for point, length in enumerate(self.at):
            mine = [i for i, at in enumerate(lengths) if at == length]
            if not mine or length in self.at[:point]:  # shown once, to the first point at that length
                continue
            shown = features[mine].double()  # [S, D]
            scores = self.head.scores(point, shown)
            for i, feature, score, probability in zip(mine, shown, scores.tolist(),
                                                      self.head.calibrated(point, scores).tolist()):
                self.observed[point].append((samples[i], feature, score, probability))
                self.latest[samples[i]] = probability
        if not self.active:
            return []
        # the groups of the samples shown, each with its running samples, in one call of the rule
        groups = sorted({prompt for prompt, _ in samples})
        by_group: dict[int, list[tuple[int, int]]] = {group: [] for group in groups}
        for sample in running:
            if sample[0] in by_group:
                by_group[sample[0]].append(sample)
        runners = [sample for group in groups for sample in by_group[group]]
        probability = torch.tensor([self.latest.get(sample, 0.5) for sample in runners],
                                   dtype=torch.float64)  # [S]
        at_group = torch.tensor([i for i, group in enumerate(groups) for _ in by_group[group]],
                                dtype=torch.long)  # [S]
        finished = torch.stack([self.finished(group) for group in groups])  # [G, 2]
        settling = []
        if self.rule == "sure":
            flags, settled = prune_trusting_sure(finished, at_group, probability, self.m, self.threshold)
            for group in (groups[i] for i in settled.nonzero()[:, 0].tolist()):
                # its unstarted samples need not start (finished ones named stay as they are)
                settling += [(group, s) for s in range(self.samples) if (group, s) not in by_group[group]]
        else:
            flags = prune_running(finished, at_group, probability, self.m, self.threshold)
        named = [sample for sample, flag in zip(runners, flags.tolist()) if flag]
        self.pruned += named
        return named + settling

    def finished(self, prompt: int) -> torch.Tensor:
        """[2]: the prompt's finished samples at the reward's low and high bound (early stop's scores)."""
        rewards = torch.tensor(self.stopper.rewards[prompt], dtype=torch.float64)
        return torch.stack([at.sum() for at in at_bounds(rewards, *self.stopper.bounds)])

    def learned(self, high: dict[tuple[int, int], bool]) -> list[dict]:
        """What the head learns from this call (:func:`statistics` per point), from the shown
        samples whose class the scores now tell (``high``: sample -> ended at the high bound)."""
        out = []
        for observed in self.observed:
            known = [(feature, score, high[sample]) for sample, feature, score, _ in observed
                     if sample in high]
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
            scores, probability, labels = (torch.tensor(column, dtype=torch.float64)
                                           for column in zip(*known))
            labels = labels.long()
            sure = (probability >= self.threshold) | (probability <= 1 - self.threshold)
            wrong = ((probability >= 0.5).long() != labels) & sure
            record |= {f"prune_auc_{point}": auc(scores, labels),
                       f"prune_calibration_error_{point}": calibration_error(probability, labels),
                       f"prune_sure_wrong_{point}": float(wrong.sum()) / max(1, int(sure.sum()))}
        return record


class RunPruning:
    """A run's pruning, a run part: its quality head, the expected completion length the
    detection points are fractions of, and the step's pruners (one per generation call), whose
    observations the head learns from after the step, summed over processes."""

    @classmethod
    def of(cls, options: PruningOptions, dim: int, m: int, max_completion_length: int) -> RunPruning | None:
        """The run's pruning when ``prune_running`` switches it on, else None."""
        return cls(options, dim, m, max_completion_length) if options.prune_running else None

    def __init__(self, options: PruningOptions, dim: int, m: int, max_completion_length: int) -> None:
        self.options, self.m = options, m
        self.head = QualityHead(dim, len(options.points()), decay=options.prune_head_decay)
        self.expected = max_completion_length / 2  # until a step has finished samples
        self.calls: list[tuple[QuotaPruner, dict[tuple[int, int], bool]]] = []

    def pruner(self, stopper, samples: int) -> QuotaPruner:
        """A generation call's pruner (``samples`` a prompt), pruning once the head has learned from
        the warm-up's steps."""
        options = self.options
        return QuotaPruner(self.head, stopper, detection_lengths(options.points(), self.expected), self.m,
                           options.prune_threshold, options.prune_rule,
                           active=self.head.steps >= options.prune_warmup_steps, samples=samples)

    def called(self, pruner: QuotaPruner, high: dict[tuple[int, int], bool]) -> None:
        """A call's pruner and, by (prompt, sample), which of its samples ended at the high bound."""
        self.calls.append((pruner, high))

    def after_step(self, procs: Processes, completion_length: float) -> dict[str, float]:
        """Learn the step (a collective: every process calls it once a step) and say how it went:
        samples pruned, and the head's skill at each point, averaged over calls and processes."""
        local = [pruner.learned(high) for pruner, high in self.calls]
        added = []
        for point in range(self.head.points):
            names = [name for name in STATE_KEYS if name != "steps"]
            parts = [torch.stack([call[point][name] for call in local]).sum(0) if local else
                     torch.zeros_like(getattr(self.head, name)[point]) for name in names]
            flat = torch.cat([part.flatten() for part in parts])[None]  # [1, L]
            total, start = procs.gather(flat).sum(0), 0  # summed in rank order: the same on every process
            added.append({})
            for name, part in zip(names, parts):
                added[-1][name] = total[start:start + part.numel()].view_as(part)
                start += part.numel()
        skills = [pruner.skill(high) for pruner, high in self.calls]
        self.head.absorb(added)
        self.expected = completion_length
        self.calls = []
        # the same names on every process, in one order: each metric's sum over calls and processes
        # of its known values, and how many there were (a point no call reached has none: NaN)
        names = [f"prune_{metric}_{point}" for point in range(self.head.points)
                 for metric in ("auc", "calibration_error", "sure_wrong")]
        values = [[skill[name] for skill in skills if skill.get(name, float("nan")) == skill.get(name)]
                  for name in names]
        pruned = float(sum(skill["pruned_samples"] for skill in skills))
        totals = procs.sum([pruned] + [sum(known) for known in values]
                           + [float(len(known)) for known in values])
        record = {"pruned_samples": totals[0]}
        for name, total, count in zip(names, totals[1:1 + len(names)], totals[1 + len(names):]):
            record[name] = total / count if count else float("nan")
        # every process must hold one head (0 = in sync), as rank_param_spread for the policy
        if procs.world_size > 1:
            state = self.head.state_dict()
            flat = torch.cat([state[name].double().flatten() for name in STATE_KEYS if name != "steps"])[None]
            gathered = procs.gather(flat)  # [W, L]
            record["prune_head_spread"] = float((gathered.amax(0) - gathered.amin(0)).max())
        return record

    def state_dict(self) -> dict:
        return {"head": self.head.state_dict(), "expected": self.expected}

    def check_state(self, state: dict) -> None:
        if set(state) != {"head", "expected"}:
            raise ValueError("quality head state: not a pruning state (head, expected)")
        self.head.check_state(state["head"])

    def load_state_dict(self, state: dict) -> None:
        """Restore (a checkpoint, or the roll-back of an abandoned step, whose judged samples go)."""
        self.check_state(state)
        self.head.load_state_dict(state["head"])
        self.expected = float(state["expected"])
        self.calls = []

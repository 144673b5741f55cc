"""Partial rollouts (APRIL, Zhou et al., arXiv 2509.18521): what an engine that can stop a
step's generation at a quota of complete groups hands back, and what it is handed next step.

A step's generation ends once ``quota`` groups are complete (every sample finished, or
skipped by early stop); the other groups' samples keep their tokens, and resume first in the
next step under the new weights (their keys and values recomputed: the weights changed). Every
token keeps the step whose weights drew it and its log-prob then, so the update knows how stale
it is and can correct for it (:mod:`podsrl.generation.partial_rollouts`). Whole groups are the unit:
PODS selects within a group and every advantage estimator normalises over one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from podsrl.types import Rollouts


@dataclass
class CarriedGroup:
    """One prompt's n samples between two steps. Per sample: its tokens so far (empty: not
    started), the step whose weights drew each token, each token's log-prob then (temperature
    1), and whether it finished (EOS or the length cap) or was skipped (early stop)."""

    completions: list[list[int]]
    versions: list[list[int]]
    logps: list[list[float]]
    finished: list[bool]
    skipped: list[bool]

    @property
    def cut_off(self) -> list[int]:
        """Samples with tokens that have not finished: they resume where they stopped."""
        return [s for s, (tokens, done) in enumerate(zip(self.completions, self.finished))
                if tokens and not done]

    @property
    def done(self) -> list[int]:
        """Samples that need no more decoding: finished or skipped."""
        return [s for s, (f, k) in enumerate(zip(self.finished, self.skipped)) if f or k]

    def oldest(self) -> list[int | None]:
        """Per sample, the step of its first token (None: no tokens)."""
        return [v[0] if v else None for v in self.versions]

    def restart(self, samples: list[int]) -> None:
        """Drop ``samples``' tokens: they start again from the prompt. Skipped samples start
        again too, since early stop's verdict rested on samples now dropped."""
        for s in range(len(self.completions)):
            if s in samples or self.skipped[s]:
                self.completions[s], self.versions[s], self.logps[s] = [], [], []
                self.finished[s] = self.skipped[s] = False

    def state_dict(self) -> dict:
        return {"completions": self.completions, "versions": self.versions, "logps": self.logps,
                "finished": self.finished, "skipped": self.skipped}

    @classmethod
    def unstarted(cls, num_samples: int) -> "CarriedGroup":
        """A group none of whose samples has begun."""
        return cls([[] for _ in range(num_samples)], [[] for _ in range(num_samples)],
                   [[] for _ in range(num_samples)], [False] * num_samples, [False] * num_samples)

    def copy(self) -> "CarriedGroup":
        """A copy whose lists the caller may extend."""
        return CarriedGroup([list(c) for c in self.completions], [list(v) for v in self.versions],
                            [list(lp) for lp in self.logps], list(self.finished), list(self.skipped))


@dataclass(frozen=True)
class PartialCall:
    """What a call with partial rollouts asks of an engine, beside its prompts: the groups it
    continues (``carried``, by prompt position; the others start afresh), the ``quota`` of complete
    groups it stops at, and the step (``version``) whose weights draw its tokens. An engine that
    declares ``Capabilities.partial_rollouts`` takes it as its call's ``partial`` keyword and
    returns a :class:`PartialGeneration`; a call without it wants every prompt's group."""

    carried: dict[int, CarriedGroup]
    quota: int
    version: int


@dataclass
class PartialGeneration:
    """One step's generation with partial rollouts: ``rollouts`` [quota, n, Lc] of the groups
    that completed first (``complete``: their positions in the call's prompts, in that order;
    ``rollouts.token_versions`` and ``sampling_logp``: NaN on tokens of this step), and the
    other prompts' groups, by position, to carry into the next step."""

    rollouts: Rollouts
    complete: list[int]
    carried: dict[int, CarriedGroup] = field(default_factory=dict)


def token_tensors(completions: list[list[list[int]]], versions: list[list[list[int]]],
                  logps: list[list[list[float]]], version: int | None,
                  width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, n, width] the step of each token (0 past a completion's end) and its sampling log-prob,
    NaN past a completion's end and on tokens drawn by the current ``version`` (their importance
    weight is exactly 1: the engine samples from the policy's own forward pass); ``version``
    None: every token keeps its log-prob (an engine whose numerics are not the policy's)."""
    shape = (len(completions), len(completions[0]), width)
    token_versions = torch.zeros(shape, dtype=torch.long)
    sampling_logp = torch.full(shape, float("nan"))
    for p, group in enumerate(completions):
        for s, tokens in enumerate(group):
            length = len(tokens)
            if length:
                token_versions[p, s, :length] = torch.tensor(versions[p][s])
                sampling_logp[p, s, :length] = torch.tensor(logps[p][s])
    if version is not None:
        sampling_logp[token_versions == version] = float("nan")
    return token_versions, sampling_logp

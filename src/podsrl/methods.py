"""What each method generates, selects and trains on: the one place that says it.

| method | rollouts generated per prompt | rollouts trained on per prompt |
| --- | --- | --- |
| grpo | m | m (no selection) |
| grpo-ga | n | all n, micro-batched with gradient accumulation, one optimizer step |
| pods | n | m, picked by a down-sampling rule (Xu et al., arXiv 2504.13818) |

The config, the training loop and the comparison tools ask a :class:`Method` instead of
testing the method's name; the run binds its method once, at set-up, to m and the rule
(:class:`Keeping`), and every stage that needs m asks that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from podsrl.algorithms.select import RULES, Groups, select
from podsrl.registry import Checked, Spec, component_label


@dataclass(frozen=True)
class Method:
    name: str
    generates_n: bool  # generates n rollouts per prompt (else m)
    selects: bool  # keeps m of them by a rule (else trains on every generated rollout)
    description: str

    def generated_per_prompt(self, n: int, m: int) -> int:
        """Rollouts generated per prompt."""
        return n if self.generates_n else m

    def trained_per_prompt(self, n: int, m: int) -> int:
        """Rollouts trained on per prompt."""
        return m if self.selects or not self.generates_n else n

    def bound(self, m: int, rule: Spec, generator: torch.Generator | None = None) -> Keeping:
        """This method bound to m and, when it selects, to the down-sampling ``rule`` (resolved and
        checked here; a method that keeps every rollout ignores it) and the rule's random stream."""
        return Keeping(self, m, RULES.checked(rule) if self.selects else None, generator)

    def arm_name(self, n: int, m: int, rule) -> str:
        """How comparisons label a run of this method: 'grpo 4/4', 'grpo-ga 16', 'pods 16->4 max_variance'
        (a rule given with arguments shows them: :func:`podsrl.registry.component_label`)."""
        if not self.generates_n:
            return f"{self.name} {m}/{m}"
        if not self.selects:
            return f"{self.name} {n}"
        return f"{self.name} {n}->{m} {component_label(rule)}"

    def dir_name(self, n: int, m: int, rule) -> str:
        """A folder name for a comparison arm: 'grpo-m4', 'grpo-ga-n16', 'pods-n16-m4-max_variance'."""
        if not self.generates_n:
            return f"{self.name}-m{m}"
        if not self.selects:
            return f"{self.name}-n{n}"
        # a module:function rule, its arguments too
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", component_label(rule))
        return f"{self.name}-n{n}-m{m}-{safe}"


@dataclass(frozen=True)
class Keeping:
    """A run's method bound to m (num_kept), its checked rule (None for a method that keeps every
    rollout) and the rule's random stream (the ``random`` rule's; a checkpoint restores it in
    place): what generation, early stop, adaptive n and selection ask of it. Called on a step's
    groups, it is the step's select stage."""

    method: Method
    m: int
    rule: Checked | None
    generator: torch.Generator | None = None

    def generated_per_prompt(self, n: int) -> int:
        """Rollouts generated per prompt with n rollouts per group."""
        return self.method.generated_per_prompt(n, self.m)

    def __call__(self, groups: Groups) -> torch.Tensor:
        """Indices [P, trained] of the rollouts to train on, from the groups [P, generated]."""
        if self.rule is not None:
            return select(self.rule, groups, self.m, generator=self.generator)
        return torch.arange(groups.rewards.shape[1]).expand(groups.rewards.shape[0], -1)


METHODS: dict[str, Method] = {
    "grpo": Method("grpo", generates_n=False, selects=False,
                   description="generate and train m per prompt (no selection)"),
    "grpo-ga": Method("grpo-ga", generates_n=True, selects=False,
                      description="generate n, train on all n with gradient accumulation"),
    "pods": Method("pods", generates_n=True, selects=True,
                   description="generate n, train on m picked by `rule`"),
}

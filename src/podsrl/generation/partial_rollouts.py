"""Partial rollouts (``partial_rollouts``; APRIL, Zhou et al., arXiv 2509.18521): a step's
generation stops once this process's share of ``prompts_per_step`` groups is complete; the
other groups in flight carry over, and their cut-off samples resume first next step.

Where completions have a long tail, a step otherwise waits for its few longest samples while
most slots idle. Here ``partial_extra_prompts`` more groups than the step trains on are in
flight on each process; the first to complete are trained on, so a long sample finishes in a
later step, under newer weights. What that costs, and how it is bounded:

* every token keeps the step whose weights drew it (``Rollouts.token_versions``), so its
  staleness when trained is known: the number of updates in between;
* ``partial_max_staleness`` bounds it: at the start of a step, a carried sample whose first
  token would be older than the bound is dropped and generated again from its prompt
  (counted: ``partial_samples_restarted``), so no token is ever trained staler than the bound;
* the update corrects for stale tokens (``partial_stale_correction``): ``importance`` weighs
  them by pi_policy / pi_sampler from the log-prob recorded when each was drawn, truncated or
  masked as TRL's ``vllm_importance_sampling_*`` settings say (on the slots engine, tokens of
  the current step weigh exactly 1: it samples from the policy itself; on vllm, every token
  is weighed by pi_policy / pi_vLLM); ``mask`` leaves them out of the loss (weight 0; slots
  only).

Whole groups are the unit: PODS selects within a complete group and the advantage normalises
over it. With dynamic sampling (DAPO), the step's rounds run over the one pool, each stopped
once the informative groups still lacking are complete, so no informative group is generated
beyond the step's share and thrown away; constant complete groups are set aside. The groups
in flight are part of the run's learned state (:class:`CarriedPool`, one per process):
checkpointed, restored, and rolled back with an abandoned step. The rounds over the pool are the
prompt source's (:class:`podsrl.generation.prompt_source.PromptSource`); here, the settings and
the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from podsrl.distributed import Processes
from podsrl.options import POSITIVE, Range, option
from podsrl.rollout.partial import CarriedGroup
from podsrl.trainer.state import RunState

STALE_CORRECTIONS = ("importance", "mask")


@dataclass(frozen=True)
class PartialRolloutOptions:
    """Partial rollouts' settings (the config's fields of these names)."""

    partial_rollouts: bool = option(False, "Stop a step's generation once prompts_per_step groups are "
                                           "complete; the groups still in flight carry over and their "
                                           "cut-off samples resume first next step, under the new weights "
                                           "(APRIL, arXiv 2509.18521). Needs an engine that resumes samples "
                                           "(slots, vllm).")
    partial_extra_prompts: int = option(2, "partial_rollouts: groups in flight on each process beyond its "
                                           "share of prompts_per_step (over-provisioning; the first complete "
                                           "groups train).",
                                        POSITIVE)
    partial_max_staleness: int = option(2, "partial_rollouts: the most updates a trained token may be older "
                                           "than the policy it trains; a carried sample that would exceed it "
                                           "is generated again from its prompt (partial_samples_restarted).",
                                        Range(1, why="0 would regenerate every carried sample"))
    partial_stale_correction: str = option("importance", "partial_rollouts: 'importance' weighs tokens drawn "
                                                         "by an earlier policy by pi/pi_old as "
                                                         "vllm_importance_sampling_* say (TRL's truncated or "
                                                         "masked ratios); 'mask' leaves them out of the "
                                                         "loss.")

    def check(self) -> None:
        if self.partial_stale_correction not in STALE_CORRECTIONS:
            raise ValueError(f"partial_stale_correction: unknown {self.partial_stale_correction!r}; use one "
                             f"of {', '.join(STALE_CORRECTIONS)}")


class CarriedPool:
    """This process's groups in flight between steps: each one's prompt (its index in the train
    split) and its samples so far, kept as ``options`` say. A run part
    (:class:`podsrl.trainer.state.PerProcess`)."""

    per_process = True

    def __init__(self, options: PartialRolloutOptions = PartialRolloutOptions()) -> None:
        self.options = options
        self.prompts: list[int] = []
        self.groups: list[CarriedGroup] = []

    def __len__(self) -> int:
        return len(self.groups)

    def fresh_needed(self, quota: int) -> int:
        """Fresh prompts a round takes: enough for ``quota`` + ``partial_extra_prompts`` groups in
        flight (none where the round asks for no group)."""
        return max(quota + self.options.partial_extra_prompts - len(self), 0) if quota else 0

    def bound_staleness(self, step: int) -> int:
        """Restart every sample whose first token would train more than ``partial_max_staleness``
        updates stale in ``step``; returns how many."""
        restarted = 0
        for group in self.groups:
            stale = [s for s, first in enumerate(group.oldest())
                     if first is not None and step - first > self.options.partial_max_staleness]
            if stale:
                group.restart(stale)
                restarted += len(stale)
        return restarted

    def step_record(self, resumed: int, restarted: int, procs: Processes) -> dict[str, int]:
        """The step's numbers, summed over processes: the groups carried on, the carried samples
        its rounds resumed (``resumed``) and restarted (``restarted``), and the samples cut off."""
        cut_off = sum(len(group.cut_off) for group in self.groups)
        carried, resumed, restarted, cut_off = procs.sum([float(len(self)), float(resumed), float(restarted),
                                                          float(cut_off)])
        return {"partial_groups_carried": int(carried), "partial_samples_resumed": int(resumed),
                "partial_samples_restarted": int(restarted), "partial_samples_cut_off": int(cut_off)}

    def state_dict(self) -> dict:
        return {"prompts": list(self.prompts), "groups": [group.state_dict() for group in self.groups]}

    def check_state(self, state: dict) -> None:
        if set(state) != {"prompts", "groups"} or len(state["prompts"]) != len(state["groups"]):
            raise ValueError("partial_rollouts: the checkpoint's carried groups do not fit (expected prompts "
                             "and groups of one length)")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.prompts = list(state["prompts"])
        self.groups = [CarriedGroup(**group).copy() for group in state["groups"]]  # not the snapshot's lists


def carried_pool(options: PartialRolloutOptions, state: RunState) -> CarriedPool | None:
    """The run's groups in flight between steps, one of its learned parts (None: partial rollouts off)."""
    if not options.partial_rollouts:
        return None
    state.parts["carried_groups"] = pool = CarriedPool(options)
    return pool

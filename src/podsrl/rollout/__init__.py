"""Generation engines, registered by name."""

from podsrl.rollout.hf import Rollouts, completion_mask_from_eos, generate

ENGINES = {"hf": generate}

__all__ = ["ENGINES", "Rollouts", "completion_mask_from_eos", "generate"]

"""The algorithm core: pure functions on tensors with an explicit group axis (no config,
no model): down-sampling rules (``select``), advantages and the policy loss."""

from podsrl.algorithms.advantages import group_advantages
from podsrl.algorithms.loss import policy_loss
from podsrl.algorithms.select import RULES, max_reward, max_variance, random_subset, select

__all__ = ["RULES", "group_advantages", "max_reward", "max_variance", "policy_loss", "random_subset", "select"]

"""The algorithm core: pure functions on tensors with an explicit group axis (no config,
no model): down-sampling rules (``select``), advantages and the policy loss, each kind
registered by name (``RULES``, ``ADVANTAGES``, ``LOSSES``)."""

from podsrl.algorithms.advantages import ADVANTAGES, group_advantages
from podsrl.algorithms.loss import LOSSES, policy_loss
from podsrl.algorithms.select import RULES, Groups, max_reward, max_variance, random_subset, select, takes_groups

__all__ = ["ADVANTAGES", "LOSSES", "RULES", "Groups", "group_advantages", "max_reward", "max_variance",
           "policy_loss", "random_subset", "select", "takes_groups"]

"""The algorithm core: pure functions on tensors with an explicit group axis (no config,
no model): down-sampling rules (``select``), advantages and the policy loss, each kind
registered by name (``RULES``, ``ADVANTAGES``, ``LOSSES``).

- :mod:`~podsrl.algorithms.select`: down-sampling rules, which m of n rollouts go into the update
- :mod:`~podsrl.algorithms.advantages`: advantages over each prompt's kept rollouts
- :mod:`~podsrl.algorithms.loss`: the clipped policy-gradient loss and its reductions
- :mod:`~podsrl.algorithms.importance`: importance weights between the sampling engine and the policy
- :mod:`~podsrl.algorithms.group_stats`: reward mean, spread and constant groups, before and after selection
- :mod:`~podsrl.algorithms.pass_rate`: per-prompt pass-rate posteriors (which prompts to generate for)
- :mod:`~podsrl.algorithms.rollout_budget`: adaptive n, how many rollouts per prompt this step
- :mod:`~podsrl.algorithms.early_stop`: when more rollouts of a prompt cannot help max-variance selection
- :mod:`~podsrl.algorithms.pruning`: which running samples PODS will not keep (quota-aware pruning)
- :mod:`~podsrl.algorithms.quality_head`: the chance a running sample ends at the high reward bound
"""

from podsrl.algorithms.advantages import ADVANTAGES, group_advantages
from podsrl.algorithms.loss import LOSSES, policy_loss
from podsrl.algorithms.select import RULES, Groups, max_reward, max_variance, random_subset, select, takes_groups

__all__ = ["ADVANTAGES", "LOSSES", "RULES", "Groups", "group_advantages", "max_reward", "max_variance",
           "policy_loss", "random_subset", "select", "takes_groups"]

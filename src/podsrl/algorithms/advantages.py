"""Advantages over each prompt's kept rollouts.

rewards [P, m] -> advantages [P, m]; pure tensor code (no config, no model). An estimator is
``estimator(rewards, scale_by_std) -> advantages``, registered in ``ADVANTAGES`` (the config's
``advantage_estimator``) or named there as ``module:function`` (:mod:`podsrl.registry`);
``scale_by_std`` is the config's ``scale_rewards``.
"""

from __future__ import annotations

import dataclasses

import torch

from podsrl.algorithms.group_stats import is_constant
from podsrl.contracts import finite, tensor_like
from podsrl.registry import Registry, argument_ranges, positive


def advantages_like(value, args: tuple, field: str, spec: str) -> torch.Tensor:
    """An estimator's contract: finite floating-point advantages [P, m], the rewards' shape."""
    rewards = args[0]
    return finite(tensor_like(value, field, spec, rewards.shape, floating=True), field, spec)


ADVANTAGES = Registry("advantage estimator", "advantage_estimator", takes="(rewards, scale_by_std)", arity=2,
                      check_output=advantages_like)


# -1 flips signs
@ADVANTAGES.register("group")
@argument_ranges(eps=dataclasses.replace(positive, why="it is added to each group's reward std"))
def group_advantages(rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """``A_i = (r_i - mean_S r) / (std_S r + eps)`` over each group's kept set S.

    rewards [P, m] -> advantages [P, m]. The paper normalises over the m *kept* rollouts,
    not the n generated. ``std`` is the sample standard deviation (correction 1, as TRL and
    the authors' code); ``scale_by_std=False`` only centres (Dr. GRPO). A group whose kept
    rewards are all equal gets exactly 0, never NaN (it carries no learning signal).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, m], got shape {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [P, m]
    constant = is_constant(rewards).unsqueeze(1)  # [P, 1]
    if scale_by_std and rewards.shape[1] > 1:
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)
    return centred.masked_fill(constant, 0.0)

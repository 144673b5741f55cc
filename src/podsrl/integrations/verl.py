"""PODS inside verl's v1 trainer: train GRPO on the ``num_kept`` most informative of each
prompt's ``rollout.n`` rollouts (Xu et al., arXiv 2504.13818).

verl's v1 trainer takes each training batch from a replay buffer that a config can replace
(``trainer.v1.sampler.custom_sampler.path`` / ``.name``). Its ``sample()`` runs before batch
balancing, the old-policy and reference log-prob passes, the advantages and the actor
update, so the rollouts dropped here cost none of them, and verl's GRPO advantage is
normalised over the kept m (the paper's detail). :class:`PODSReplayBuffer` samples as verl's
own buffer does, then keeps ``num_kept`` sessions per prompt by ``downsampling_rule`` with
podsrl's selection core (the code the trainer and ``podsrl.trl`` use), clears the dropped
trajectories from TransferQueue and returns the kept keys. Validation batches pass untouched.

Switching a verl GRPO command: append the overrides that
``python -m podsrl.integrations.verl_core PROMPTS N M`` prints (:func:`sampler_overrides`)::

    trainer.v1.sampler.custom_sampler.path=pkg://podsrl.integrations.verl
    trainer.v1.sampler.custom_sampler.name=PODSReplayBuffer
    +trainer.v1.sampler.sampler_kwargs.num_kept=4
    +trainer.v1.sampler.sampler_kwargs.downsampling_rule=max_variance
    data.train_batch_size=64 actor_rollout_ref.rollout.n=16 actor_rollout_ref.actor.ppo_mini_batch_size=16

(``PODSReplayBufferAsync`` for ``trainer.v1.trainer_mode`` colocate_async / separate_async.)
Supported verl: the range in :data:`SUPPORTED_VERL`; docs/verl.md says what was run.
"""

from __future__ import annotations

import torch
from packaging.version import Version

try:
    import transfer_queue as tq
    import verl
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
except ImportError as err:  # an optional dependency
    raise ImportError("podsrl.integrations.verl needs verl with its TransferQueue: pip install '.[verl]' in "
                      f"a podsrl clone ({err})") from err

from podsrl.algorithms.select import RULES
from podsrl.integrations.verl_core import (
    RowSelection,
    VerlConfigError,
    check_batch_settings,
    sampler_overrides,
    select_sessions,
    verl_batch_arguments,
)

# [lowest tested, first untested): the replay buffer's contract is new in 0.9
SUPPORTED_VERL = ("0.9.1", "0.9.2")
if not Version(SUPPORTED_VERL[0]) <= Version(verl.__version__) < Version(SUPPORTED_VERL[1]):
    raise ImportError(f"podsrl.integrations.verl supports verl >= {SUPPORTED_VERL[0]}, < {SUPPORTED_VERL[1]} "
                      f"(it subclasses verl's v1 ReplayBuffer); found verl {verl.__version__}: pip install "
                      "'.[verl]' in a podsrl clone")

__all__ = ["PODSReplayBuffer", "PODSReplayBufferAsync", "RowSelection", "VerlConfigError",
           "check_verl_config", "sampler_overrides", "select_sessions", "verl_batch_arguments"]
KWARGS = "trainer.v1.sampler.sampler_kwargs"


def check_verl_config(config, num_kept: int, sampler_name: str) -> None:
    """Refuse verl settings PODS cannot run with; ``config`` is main_ppo's whole config."""
    filter_groups = config.algorithm.get("filter_groups", None)
    if filter_groups is not None and filter_groups.get("enable", False):
        raise VerlConfigError("algorithm.filter_groups.enable: verl ignores DAPO's group filter under a "
                              "custom sampler; PODS with max_variance already trains on no constant group "
                              "unless all n rollouts agree. Switch one of them off")
    reward_model = config.reward.reward_model
    if reward_model.get("enable", False) and not reward_model.get("enable_resource_pool", False):
        raise VerlConfigError("reward.reward_model: a colocated reward model scores after the replay buffer "
                              "samples, so PODS has no scores to select by; use a rule-based reward or "
                              "reward.reward_model.enable_resource_pool=True")
    mode = config.trainer.v1.trainer_mode
    wanted = "PODSReplayBuffer" if mode == "sync" else "PODSReplayBufferAsync"
    if sampler_name != wanted:
        raise VerlConfigError(f"trainer.v1.sampler.custom_sampler.name: trainer_mode {mode} samples through "
                              f"{wanted}, not {sampler_name}")
    parameter_sync_step = config.trainer.v1.get(mode, {}).get("parameter_sync_step", 1)
    check_batch_settings(config.data.train_batch_size, config.actor_rollout_ref.rollout.n,
                         config.actor_rollout_ref.actor.ppo_mini_batch_size, num_kept,
                         parameter_sync_step=parameter_sync_step)


class _Selection:
    """What both buffers add to verl's: the options, the checks, and the selection after sampling."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        options = dict(self.sampler_kwargs or {})
        self.num_kept = int(options.get("num_kept", 0))
        if self.num_kept < 2:
            raise VerlConfigError(f"{KWARGS}.num_kept: set the number of rollouts per prompt to train on "
                                  f"(2 <= num_kept <= rollout.n), got {options.get('num_kept')!r}")
        self.downsampling_rule = str(options.get("downsampling_rule", "max_variance"))
        RULES.resolve(self.downsampling_rule)  # a mistake fails at start-up, not at the first step
        # the same seeded stream for rules that draw: a resumed run draws anew (verl restores no sampler
        # state)
        self.selection_generator = torch.Generator().manual_seed(int(options.get("seed", 0)))
        root = self.sampler_kwargs._get_root() if hasattr(self.sampler_kwargs, "_get_root") else None
        if root is not None and "algorithm" in root:  # built by main_ppo from the whole config
            check_verl_config(root, self.num_kept, type(self).__name__)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id,
                                        batch_size=batch_size)
        if partition_id == "val":
            return batch, metrics
        selection = select_sessions(batch.keys, self._scores(batch), self.num_kept, self.downsampling_rule,
                                    self.selection_generator)
        if selection.dropped_keys:
            tq.kv_clear(partition_id=batch.partition_id, keys=selection.dropped_keys)
        tags = dict(zip(batch.keys, batch.tags))
        kept = KVBatchMeta(partition_id=batch.partition_id, keys=selection.kept_keys,
                           tags=[tags[key] for key in selection.kept_keys], extra_info=batch.extra_info)
        return kept, {**metrics, **selection.metrics}

    @staticmethod
    def _scores(batch: KVBatchMeta) -> list[float]:
        """Each trajectory's reward, as verl's own group filter reads it (rm_scores over tokens)."""
        try:
            scores = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                     select_fields=["rm_scores"])["rm_scores"]
        except (ValueError, KeyError) as err:  # the store has no such field for these keys
            raise VerlConfigError(f"PODS: the sampled trajectories have no rm_scores yet ({err}); a "
                                  "colocated reward model scores after sampling: use a rule-based reward or "
                                  "reward.reward_model.enable_resource_pool=True") from None
        return [float(value.sum().item()) for value in scores]


class PODSReplayBuffer(_Selection, ReplayBuffer):
    """verl's synchronous replay buffer, then PODS selection (``trainer_mode: sync``)."""


class PODSReplayBufferAsync(_Selection, ReplayBufferAsync):
    """verl's asynchronous replay buffer, then PODS selection (colocate_async, separate_async)."""

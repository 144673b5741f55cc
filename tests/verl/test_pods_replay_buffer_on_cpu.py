"""PODSReplayBuffer against verl 0.9's own replay buffer and a real TransferQueue store, on
CPU (Ray with a logical CPU count set before TransferQueue starts: its controller and two
storage units take one each, and on 2 cores Ray would otherwise wait for CPUs forever).
Runs in the verl environment (scripts/test_verl.sh); elsewhere it is skipped."""

import types
from importlib import resources

import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is not installed: scripts/test_verl.sh runs these in .venv-verl")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402

from podsrl.algorithms.advantages import group_advantages  # noqa: E402
from podsrl.algorithms.select import select  # noqa: E402
from podsrl.integrations.verl import (  # noqa: E402
    PODSReplayBuffer,
    PODSReplayBufferAsync,
    VerlConfigError,
    sampler_overrides,
)


@pytest.fixture(scope="module", autouse=True)
def store():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init()
    yield
    tq.close()
    ray.shutdown()


@pytest.fixture(autouse=True)
def empty_store():
    yield
    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(partition_id=partition, keys=list(items))


def put_groups(rewards: list[list[float]], partition: str = "train", outputs: int = 1, with_scores: bool = True):
    """Finished prompt groups as verl's agent loop leaves them: a prompt key per uid, a
    trajectory per session and output with token-level rm_scores (the reward on the last token)."""
    for p, group in enumerate(rewards):
        uid = f"prompt{p}"
        tq.kv_batch_put(keys=[uid], partition_id=partition,
                        tags=[{"is_prompt": True, "status": "finished", "global_steps": 1}])
        keys = [f"{uid}_{s}_{i}" for s in range(len(group)) for i in range(outputs)]
        scores = torch.zeros(len(keys), 5)  # [rows, response tokens]
        scores[:, -1] = torch.tensor([group[s] if i == outputs - 1 else -5.0
                                      for s in range(len(group)) for i in range(outputs)])
        fields = {"rm_scores": scores} if with_scores else {"responses": torch.ones(len(keys), 5, dtype=torch.long)}
        tq.kv_batch_put(keys=keys, partition_id=partition, fields=TensorDict(fields, batch_size=[len(keys)]),
                        tags=[{} for _ in keys])


def buffer(cls=PODSReplayBuffer, **kwargs):
    return cls("sync", OmegaConf.create({}), None, "drop", OmegaConf.create(kwargs), poll_interval=0.05,
               refill_fn=lambda count: None)


REWARDS = [[0.0, 1.0, 1.0, 0.5, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.2, 0.0, 1.0, 0.0, 0.2, 1.0]]


def test_keeps_exactly_the_max_variance_sessions_and_clears_the_dropped_ones():
    put_groups(REWARDS, outputs=2)
    batch, metrics = buffer(num_kept=3).sample(global_steps=1, partition_id="train", batch_size=3)
    expected = select("max_variance", torch.tensor(REWARDS), 3)  # [P, m] podsrl's rule, brute-force-tested
    want = {f"prompt{p}_{s}_{i}" for p, row in enumerate(expected.tolist()) for s in row for i in range(2)}
    assert set(batch.keys) == want and len(batch.keys) == len(batch.tags) == 3 * 3 * 2
    assert set(tq.kv_list()["train"]) == want  # dropped trajectories and the prompt keys are gone
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["rm_scores"])
    assert len(data["rm_scores"]) == len(batch.keys)  # the kept rows are still readable downstream
    assert metrics["pods/rollouts_generated"] == 18 and metrics["pods/rollouts_kept"] == 9
    assert metrics["pods/generated_reward_zero_var_frac"] == pytest.approx(1 / 3)


def test_with_num_kept_n_it_returns_what_verls_buffer_returns_row_for_row():
    put_groups(REWARDS)
    stock, _ = buffer(ReplayBuffer).sample(global_steps=1, partition_id="train", batch_size=3)
    tq.kv_clear(partition_id="train", keys=list(tq.kv_list()["train"]))
    put_groups(REWARDS)
    pods, _ = buffer(num_kept=6).sample(global_steps=1, partition_id="train", batch_size=3)
    assert pods.keys == stock.keys and pods.tags == stock.tags


def test_validation_batches_pass_untouched():
    put_groups(REWARDS, partition="val")
    batch, metrics = buffer(num_kept=2).sample(global_steps=1, partition_id="val", batch_size=3)
    assert len(batch.keys) == 18 and not any(key.startswith("pods/") for key in metrics)


def test_verls_grpo_advantage_on_the_kept_rows_is_podsrls_over_the_kept_m():
    put_groups(REWARDS)
    batch, _ = buffer(num_kept=3).sample(global_steps=1, partition_id="train", batch_size=3)
    scores = torch.stack(list(tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                              select_fields=["rm_scores"])["rm_scores"]))  # [B, L]
    uids = [key.split("_")[0] for key in batch.keys]
    advantages, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), index=__import__("numpy").array(
        uids, dtype=object), epsilon=1e-6)
    for uid in sorted(set(uids)):
        rows = [i for i, u in enumerate(uids) if u == uid]
        ours = group_advantages(scores[rows].sum(1).unsqueeze(0), eps=1e-6)[0]  # [m]
        assert torch.allclose(advantages[rows, -1], ours, atol=1e-5)


def test_scores_missing_at_sampling_time_are_refused():
    put_groups(REWARDS, with_scores=False)
    with pytest.raises(VerlConfigError, match="no rm_scores yet"):
        buffer(num_kept=3).sample(global_steps=1, partition_id="train", batch_size=3)


def main_ppo_config(**changes):
    """verl's trainer config composed by Hydra as main_ppo composes it, with the overrides
    docs/verl.md prints (sampler_overrides: 8 prompts, n = 8, m = 4) and ``changes``."""
    from hydra import compose, initialize_config_dir

    overrides = sampler_overrides(prompts_per_step=8, num_generations=8, num_kept=4)
    with initialize_config_dir(config_dir=str(resources.files("verl.trainer.config")), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    for key, value in changes.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def build_through_verl(config):
    trainer = types.SimpleNamespace(config=config, trainer_mode=config.trainer.v1.trainer_mode,
                                    _add_prompts_to_generate=lambda count: None)
    return PPOTrainer._build_replay_buffer(trainer)


def test_verls_buffer_factory_builds_the_sampler_from_the_config():
    built = build_through_verl(main_ppo_config())
    assert type(built) is PODSReplayBuffer and built.num_kept == 4 and built.downsampling_rule == "max_variance"


@pytest.mark.parametrize("changes, refusal", [
    ({"algorithm.filter_groups.enable": True}, "algorithm.filter_groups.enable"),
    ({"reward.reward_model.enable": True, "reward.reward_model.enable_resource_pool": False}, "reward.reward_model"),
    ({"trainer.v1.trainer_mode": "colocate_async"}, "samples through PODSReplayBufferAsync"),
    ({"actor_rollout_ref.actor.ppo_mini_batch_size": 8}, "verl would pad with synthetic rows"),
    ({"trainer.v1.sampler.sampler_kwargs": {"num_kept": 1}}, "num_kept"),
    ({"trainer.v1.sampler.sampler_kwargs": {"num_kept": 4, "downsampling_rule": "best"}}, "downsampling_rule"),
])
def test_settings_pods_cannot_run_with_are_refused_at_start_up(changes, refusal):
    with pytest.raises(ValueError, match=refusal):
        build_through_verl(main_ppo_config(**changes))


def test_the_async_buffer_is_built_for_async_modes():
    config = main_ppo_config(**{"trainer.v1.trainer_mode": "colocate_async",
                                "trainer.v1.sampler.custom_sampler.name": "PODSReplayBufferAsync"})
    assert type(build_through_verl(config)) is PODSReplayBufferAsync


def test_the_documented_gsm8k_command_composes_and_passes_the_start_up_checks():
    """docs/verl.md's main_ppo command, composed by Hydra from verl's own config as main_ppo
    would (the $(...) part replaced by what the helper prints), builds the sampler."""
    import re
    import shlex
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    page = (Path(__file__).resolve().parents[2] / "docs" / "verl.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "verl.trainer.main_ppo" in b)
    helper = re.search(r"\$\(python -m podsrl.integrations.verl_core (\d+) (\d+) (\d+)\)", block)
    words = shlex.split(block.replace("\\\n", " ").replace(helper.group(0), ""))
    overrides = words[words.index("verl.trainer.main_ppo") + 1:] + sampler_overrides(*map(int, helper.groups()))
    with initialize_config_dir(config_dir=str(resources.files("verl.trainer.config")), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    assert config.actor_rollout_ref.rollout.n == 16 and config.algorithm.adv_estimator == "grpo"
    assert type(build_through_verl(config)) is PODSReplayBuffer

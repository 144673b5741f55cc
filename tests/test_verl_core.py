"""PODS in verl without verl: which sessions of a sampled batch are kept, and verl's batch
arithmetic (podsrl.integrations.verl_core). The sampler itself runs against verl's
TransferQueue in tests/verl/ (scripts/test_verl.sh)."""

import itertools
import random

import pytest
import torch

from podsrl.algorithms.select import select
from podsrl.integrations.verl_core import (
    VerlConfigError,
    check_batch_settings,
    main,
    select_sessions,
    split_key,
    verl_batch_arguments,
)


def batch_of(rewards: list[list[float]], outputs: int = 1, shuffle_seed: int | None = None):
    """verl's keys {uid}_{session}_{index} and scores for prompt groups of rewards; with
    several outputs per session, only the last one carries the session's reward."""
    keys, scores = [], []
    for p, group in enumerate(rewards):
        for s, reward in enumerate(group):
            for index in range(outputs):
                keys.append(f"prompt-{p}_{s}_{index}")
                scores.append(reward if index == outputs - 1 else -5.0)
    if shuffle_seed is not None:
        order = list(range(len(keys)))
        random.Random(shuffle_seed).shuffle(order)
        keys, scores = [keys[i] for i in order], [scores[i] for i in order]
    return keys, scores


def test_kept_sessions_have_the_largest_variance_of_any_m_subset_brute_force():
    rng = random.Random(0)
    for trial in range(60):
        n, m = rng.choice([(4, 2), (5, 3), (6, 2), (6, 4)])
        rewards = [[rng.choice([0.0, 0.2, 1.0]) for _ in range(n)] for _ in range(3)]
        keys, scores = batch_of(rewards, outputs=1 + trial % 2, shuffle_seed=trial)
        selection = select_sessions(keys, scores, m, "max_variance")
        kept_sessions = {split_key(k)[:2] for k in selection.kept_keys}
        assert kept_sessions.isdisjoint({split_key(k)[:2] for k in selection.dropped_keys})
        assert sorted(selection.kept_keys + selection.dropped_keys) == sorted(keys)
        assert [k for k in keys if k in set(selection.kept_keys)] == selection.kept_keys  # the batch's order
        for p, group in enumerate(rewards):
            mine = sorted(s for uid, s in kept_sessions if uid == f"prompt-{p}")
            best = max(torch.tensor(c).var(correction=0) for c in itertools.combinations(group, m))
            assert len(mine) == m
            assert float(torch.tensor([group[s] for s in mine]).var(correction=0)) == pytest.approx(float(best))
            # exactly podsrl's rule (ties broken the same way as the trainer and podsrl.trl)
            assert mine == select("max_variance", torch.tensor([group]), m)[0].tolist()
        outputs = 1 + trial % 2
        assert len(selection.kept_keys) == 3 * m * outputs  # every output of a kept session


def test_metrics_are_the_trainers_statistics_under_podsrls_names():
    keys, scores = batch_of([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    metrics = select_sessions(keys, scores, 2, "max_variance").metrics
    assert metrics["pods/generated_reward_zero_var_frac"] == 0.5 and metrics["pods/kept_reward_zero_var_frac"] == 0.5
    assert metrics["pods/generated_reward_mean"] == pytest.approx(5 / 8)
    assert metrics["pods/kept_reward_mean"] == pytest.approx(3 / 4)
    assert (metrics["pods/rollouts_generated"], metrics["pods/rollouts_kept"]) == (8.0, 4.0)


def test_a_group_with_failed_sessions_left_out_keeps_what_it_can():
    keys, scores = batch_of([[0.0, 1.0, 0.5, 1.0], [0.0, 1.0, 0.0, 0.0]])
    keys = [k for k in keys if not k.startswith("prompt-1_") or split_key(k)[1] < 2]  # prompt 1: 2 of 4 sessions
    scores = scores[:len(keys)]
    selection = select_sessions(keys, scores, 3, "max_variance")
    assert sorted(k for k in selection.kept_keys if k.startswith("prompt-1_")) == ["prompt-1_0_0", "prompt-1_1_0"]
    assert sum(k.startswith("prompt-0_") for k in selection.kept_keys) == 3
    assert selection.metrics["pods/rollouts_generated"] == 6.0 and selection.metrics["pods/rollouts_kept"] == 5.0


def test_random_rule_draws_from_the_given_generator():
    keys, scores = batch_of([[1.0] * 6] * 4)
    first = select_sessions(keys, scores, 3, "random", torch.Generator().manual_seed(5)).kept_keys
    again = select_sessions(keys, scores, 3, "random", torch.Generator().manual_seed(5)).kept_keys
    assert first == again and len(first) == 12


@pytest.mark.parametrize("num_kept", [1, 5])
def test_num_kept_outside_two_to_n_is_refused(num_kept):
    keys, scores = batch_of([[0.0, 1.0, 0.0, 1.0]])
    with pytest.raises(VerlConfigError, match=f"num_kept: must be between 2 and rollout.n = 4, got {num_kept}"):
        select_sessions(keys, scores, num_kept, "max_variance")


def test_batch_arguments_against_the_arithmetic_they_must_satisfy():
    """Every (P, n, m, mini-batches, ranks) on a grid: either settings under which verl adds no
    padding rows (kept rows = whole actor mini-batches, each split evenly over the ranks), or a
    refusal exactly where no such settings exist."""
    for P, n, m, k, dp in itertools.product([4, 6, 8, 64], [4, 8, 16], [2, 3, 4], [1, 2, 4], [1, 2, 8]):
        possible = m <= n and P % k == 0 and (P * m // k) % n == 0 and (P * m // k) % dp == 0
        if not possible:
            with pytest.raises(VerlConfigError):
                verl_batch_arguments(P, n, m, k, dp)
            continue
        args = verl_batch_arguments(P, n, m, k, dp)
        mini_batch_rows = args["actor_rollout_ref.actor.ppo_mini_batch_size"] * args["actor_rollout_ref.rollout.n"]
        assert args["data.train_batch_size"] == P and args["actor_rollout_ref.rollout.n"] == n
        assert mini_batch_rows * k == P * m and mini_batch_rows % dp == 0
        check_batch_settings(P, n, args["actor_rollout_ref.actor.ppo_mini_batch_size"], m, dp)  # accepted


def test_a_stock_grpo_batch_setting_is_refused_with_the_arithmetic():
    """verl's usual ppo_mini_batch_size = train_batch_size would make a 16 x 64 = 1024-row
    mini-batch for 256 kept rows: verl would pad 768 synthetic rows."""
    with pytest.raises(VerlConfigError, match=r"64 prompts x num_kept 4 = 256 kept rows .* ppo_mini_batch_size 64 x "
                                              r"rollout.n 16 = 1024 rows"):
        check_batch_settings(64, 16, 64, 4)


def test_the_helper_refuses_an_unknown_trainer_mode_or_rule(capsys):
    """#38: unknown --rule / --trainer_mode values printed overrides with exit 0; the error
    appeared only on the cluster."""
    assert main(["8", "8", "4", "--trainer_mode", "async"]) == 2
    assert capsys.readouterr().err.strip() == ("error: trainer_mode: 'async' is not one of verl's sync, "
                                               "colocate_async, separate_async")
    assert main(["8", "8", "4", "--rule", "best"]) == 2
    assert "downsampling_rule: unknown rule 'best'" in capsys.readouterr().err
    assert main(["8", "8", "4", "--trainer_mode", "colocate_async"]) == 0
    assert "custom_sampler.name=PODSReplayBufferAsync" in capsys.readouterr().out



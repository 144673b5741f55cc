"""One registration form for every extension kind (podsrl.registry): registered names and
module:function / file.py:function names resolve the same way for rules, engines, tasks and
reward functions; mistakes are one line naming the field."""

import itertools
import sys
from pathlib import Path

import pytest
import torch

from podsrl.algorithms import ADVANTAGES, LOSSES, group_advantages, policy_loss
from podsrl.algorithms.select import RULES, Groups, max_variance, select, takes_groups
from podsrl.contracts import UserCodeError
from podsrl.registry import Registry
from podsrl.rewards import REWARDS, load_reward_fn
from podsrl.rollout import ENGINES, SCHEDULES
from podsrl.rollout.schedule import PendingSamples, Schedule
from podsrl.tasks import TASKS
from podsrl.trainer.config import make_config

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "extensions.py")


@pytest.mark.parametrize("registry", [RULES, ADVANTAGES, LOSSES, SCHEDULES, ENGINES, TASKS, REWARDS])
def test_every_kind_is_a_registry_that_resolves_its_own_names(registry):
    assert isinstance(registry, Registry) and registry
    for name, obj in registry.items():
        assert registry.resolve(name) is obj


@pytest.mark.parametrize("registry", [RULES, ADVANTAGES, LOSSES, SCHEDULES, ENGINES, TASKS, REWARDS])
def test_unknown_names_are_one_line_naming_the_field_and_the_known_names(registry):
    with pytest.raises(ValueError) as refused:
        registry.resolve("no_such_thing")
    message = str(refused.value)
    assert message.startswith(f"{registry.field}: unknown ") and "\n" not in message
    assert all(name in message for name in registry)


def test_register_adds_a_name_once(monkeypatch):
    rules = Registry("rule", "downsampling_rule", dict(RULES))
    rules.register("mine")(max_variance)
    assert rules.resolve("mine") is max_variance
    with pytest.raises(ValueError, match="downsampling_rule: a rule named 'mine' is registered already"):
        rules.register("mine")(max_variance)


def test_a_users_component_registered_by_name_is_held_to_the_contract_like_one_named_by_file(monkeypatch):
    """Registered by decorator, a user's rule is still the user's: its failure is one line
    naming it (a UserCodeError the trainer stops on), not a traceback from inside podsrl."""
    def mine(rewards, m, generator=None):
        raise RuntimeError("broken on purpose")

    monkeypatch.setitem(RULES, "mine_broken", mine)
    with pytest.raises(UserCodeError, match=r"^downsampling_rule: mine_broken failed: RuntimeError: broken on purpose"):
        select("mine_broken", torch.zeros(2, 4), 2)
    assert RULES.checked("max_variance").users is False  # podsrl's own rules run as they are


def test_a_rule_from_a_file_is_used_by_name_in_the_config_and_in_select():
    cfg = make_config(overrides={"downsampling_rule": f"{EXAMPLE}:max_variance_no_ties"})
    rule = RULES.resolve(cfg.downsampling_rule)
    assert rule.__name__ == "max_variance_no_ties" and "podsrl_user_file_extensions_" in rule.__module__
    assert sys.modules.get("extensions") is None  # loaded under a private name only
    generator = torch.Generator().manual_seed(0)
    for rewards in itertools.islice(itertools.product([0.0, 1.0, 0.5], repeat=6), 0, 729, 37):
        groups = torch.tensor([rewards])  # [1, 6]
        kept = select(cfg.downsampling_rule, groups, 3, generator)
        best = select("max_variance", groups, 3)
        assert groups[0, kept[0]].var() == pytest.approx(float(groups[0, best[0]].var()))  # as good as the built-in


def test_a_module_function_reward_and_its_mistakes(tmp_path):
    assert load_reward_fn("trl.rewards:accuracy_reward").__name__ == "accuracy_reward"
    with pytest.raises(ValueError, match="^reward_funcs: 'trl.rewards' has no function 'nope'$"):
        load_reward_fn("trl.rewards:nope")
    with pytest.raises(ValueError, match="^reward_funcs: cannot import module 'no_such_pkg_x' "):
        load_reward_fn("no_such_pkg_x:f")


def test_config_refuses_a_rule_or_engine_that_does_not_resolve_before_anything_loads():
    with pytest.raises(ValueError, match="^downsampling_rule: .* has no function 'nope'"):
        make_config(overrides={"downsampling_rule": f"{EXAMPLE}:nope"})
    with pytest.raises(ValueError, match=r"^generation_engine: unknown engine 'sglang': neither a built-in engine "
                                         r"\(hf, slots, vllm\)"):
        make_config(overrides={"generation_engine": "sglang"})


def test_a_comparison_arm_named_by_a_file_rule_is_one_folder():
    from podsrl.experiments.compare import arm_dir_name

    name = arm_dir_name({"method": "pods", "num_generations": 16, "num_kept": 4,
                         "downsampling_rule": f"{EXAMPLE}:max_variance_no_ties"})
    assert "/" not in name and ":" not in name and name.startswith("pods-n16-m4-")


def test_a_run_trains_with_a_rule_and_an_engine_named_by_module(random_model_dir, tmp_path):
    from podsrl.metrics import read_metrics
    from podsrl.trainer import train

    cfg = make_config(overrides={"model": random_model_dir, "task": "parity", "max_steps": "2", "prompts_per_step": "2",
                                 "num_generations": "4", "num_kept": "2", "max_completion_length": "4",
                                 "eval_prompts": "4", "eval_samples": "1", "eval_steps": "0", "save_steps": "0",
                                 "progress": "false", "output_dir": str(tmp_path / "run"),
                                 "downsampling_rule": f"{EXAMPLE}:max_variance_no_ties",
                                 "generation_engine": "podsrl.rollout:HFEngine"})
    train(cfg)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and all(r["loss"] is not None for r in records[1:])


def test_a_groups_rule_keeps_max_variance_on_the_fewest_tokens_brute_force():
    """examples/extensions.py:max_variance_shortest against every m-subset: the largest
    variance, and among the subsets holding the reward values max_variance keeps, the fewest
    completion tokens."""
    rule = RULES.resolve(f"{EXAMPLE}:max_variance_shortest")
    assert getattr(rule, "takes_groups", False)
    generator = torch.Generator().manual_seed(0)
    for trial in range(40):
        n, m = 6, 1 + trial % 5
        rewards = torch.randint(0, 3, (2, n), generator=generator).float() / 2  # [2, n] many ties
        lengths = torch.randint(1, 9, (2, n), generator=generator)  # [2, n]
        kept = select(rule, Groups(rewards, lengths=lengths), m)
        for row in range(2):
            subsets = list(itertools.combinations(range(n), m))
            best_var = max(float(rewards[row, list(s)].var(correction=0)) for s in subsets)
            values = sorted(rewards[row, max_variance(rewards, m)[row]].tolist())
            fewest = min(int(lengths[row, list(s)].sum()) for s in subsets
                         if sorted(rewards[row, list(s)].tolist()) == values)
            assert float(rewards[row, kept[row]].var(correction=0)) == pytest.approx(best_var)
            assert int(lengths[row, kept[row]].sum()) == fewest
            assert kept[row].tolist() == sorted(kept[row].tolist())


def test_the_trainer_gives_a_groups_rule_its_rewards_generated_mask_and_lengths(tmp_path):
    """A rule marked takes_groups sees what the trainer generated: rewards [P, n], no mask
    without early stop, and each sample's completion length (its logged rollout's tokens)."""
    seen = []

    @takes_groups
    def spy(groups, m, generator=None):
        seen.append(groups)
        return max_variance(groups.rewards, m)

    module = type(sys)("podsrl_test_spy_rule")
    module.spy = spy
    sys.modules[module.__name__] = module
    try:
        from podsrl.trainer import train

        train(make_config(overrides={k: str(v) for k, v in dict(
            model="tiny", max_steps=1, prompts_per_step=4, num_generations=6, num_kept=3, max_completion_length=6,
            eval_prompts=8, eval_samples=1, eval_steps=0, save_steps=0, progress=False, task="parity",
            output_dir=tmp_path / "run", downsampling_rule="podsrl_test_spy_rule:spy").items()}))
    finally:
        del sys.modules[module.__name__]
    (groups,) = seen
    assert groups.rewards.shape == (4, 6) and groups.generated is None
    assert groups.lengths.shape == (4, 6) and ((groups.lengths >= 1) & (groups.lengths <= 6)).all()


def test_an_advantage_estimator_from_a_file_against_its_definition():
    """examples/extensions.py:leave_one_out: each reward minus the mean of the others, by loops."""
    estimator = ADVANTAGES.resolve(f"{EXAMPLE}:leave_one_out")
    rewards = torch.rand(5, 4, generator=torch.Generator().manual_seed(3))  # [P, m]
    advantages = estimator(rewards, True)
    for p in range(5):
        for i in range(4):
            others = [float(rewards[p, j]) for j in range(4) if j != i]
            assert float(advantages[p, i]) == pytest.approx(float(rewards[p, i]) - sum(others) / 3, abs=1e-6)
    assert torch.equal(estimator(rewards[:, :1], True), torch.zeros(5, 1))  # m = 1: no baseline, no signal


def test_a_loss_type_from_a_file_against_its_definition_and_accumulation():
    """examples/extensions.py:sequence_sum inside policy_loss: the sum of the masked token terms
    over the number of sequences, and micro-batches that add up to the whole batch."""
    aggregate = LOSSES.resolve(f"{EXAMPLE}:sequence_sum")
    generator = torch.Generator().manual_seed(4)
    logp = -torch.rand(6, 5, generator=generator)  # [B, Lc]
    advantages = torch.randn(6, generator=generator)  # [B]
    mask = (torch.rand(6, 5, generator=generator) > 0.3).float()
    whole, _ = policy_loss(logp, logp, advantages, mask, loss_type=aggregate)
    expected = sum(-float(advantages[b]) * float(mask[b].sum()) for b in range(6)) / 6  # ratio 1: -A per token
    assert float(whole) == pytest.approx(expected, abs=1e-5)
    halves = sum(float(policy_loss(logp[i:i + 3], logp[i:i + 3], advantages[i:i + 3], mask[i:i + 3],
                                   loss_type=aggregate, num_sequences=6)[0]) for i in (0, 3))
    assert halves == pytest.approx(float(whole), abs=1e-6)


@pytest.mark.slow
def test_the_trainer_uses_the_configured_advantage_estimator_and_loss(tmp_path):
    """Both named as module:function in the config reach the update (spies count the calls)."""
    calls = {"advantages": 0, "loss": 0}

    def estimator(rewards, scale_by_std):
        calls["advantages"] += 1
        return group_advantages(rewards, scale_by_std)

    def aggregate(per_token, mask, num_sequences, num_tokens):
        calls["loss"] += 1
        return (per_token * mask).sum() / num_tokens

    module = type(sys)("podsrl_test_spy_update")
    module.estimator, module.aggregate = estimator, aggregate
    sys.modules[module.__name__] = module
    try:
        from podsrl.trainer import train

        train(make_config(overrides={k: str(v) for k, v in dict(
            model="tiny", max_steps=2, prompts_per_step=4, num_generations=6, num_kept=3, max_completion_length=6,
            eval_prompts=8, eval_samples=1, eval_steps=0, save_steps=0, progress=False, task="parity",
            micro_batch_size=4, output_dir=tmp_path / "run", advantage_estimator="podsrl_test_spy_update:estimator",
            loss_type="podsrl_test_spy_update:aggregate").items()}))
    finally:
        del sys.modules[module.__name__]
    assert calls == {"advantages": 2, "loss": 2 * 3}  # 12 kept rows per step in micro-batches of 4


def test_a_schedule_from_a_module_orders_the_slots_and_says_what_it_needs():
    """A Schedule object named module:attr: it picks the next prompt (here the last one with
    samples left) and its early-stop refusal reaches the config check."""
    module = type(sys)("podsrl_test_schedule")
    module.last_first = Schedule(lambda pending, candidates: candidates[-1], stop_groups_refusal="no cancelling")
    sys.modules[module.__name__] = module
    try:
        pending = PendingSamples(3, 2, SCHEDULES.resolve("podsrl_test_schedule:last_first"), [0.0] * 3, None)
        assert [pending.pop() for _ in range(6)] == [(2, 0), (2, 1), (1, 0), (1, 1), (0, 0), (0, 1)]
        assert make_config(overrides={"generation_engine": "slots",
                                      "generation_schedule": "podsrl_test_schedule:last_first"})
        with pytest.raises(ValueError, match="^group_early_stop: no cancelling$"):
            make_config(overrides={"generation_engine": "slots", "group_early_stop": "true",
                                   "generation_schedule": "podsrl_test_schedule:last_first",
                                   "generation_micro_group": "8"})
    finally:
        del sys.modules[module.__name__]

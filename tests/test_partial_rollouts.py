"""Partial rollouts: a step's generation stops at its quota of complete groups, the rest carry over
with their tokens' versions and log-probs, resume first next step, stay within the staleness bound,
and are checkpointed with the run."""

import dataclasses
import json
import random

import pytest
import torch

from podsrl.algorithms.importance import STALE_MASK, SamplerCorrection, sampler_importance_weights
from podsrl.generation.partial_rollouts import CarriedPool, PartialRolloutOptions
from podsrl.models.logprobs import token_logprobs
from podsrl.rollout import SlotsEngine, SlotsOptions, generate_in_slots
from podsrl.rollout.partial import CarriedGroup, PartialCall
from podsrl.tasks import TaskOptions, build_task, render_prompt
from podsrl.trainer import train
from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.trainer.config import Config, validate
from podsrl.update import flatten_for_update
from tests.conftest import quick


@pytest.fixture(scope="module")
def prompts(tiny):
    task = build_task(TaskOptions())
    return [render_prompt(tiny.tokenizer, ex) for ex in task.train[:6]]


def partial(bundle, prompts, n, *, carried=None, quota, version, slots=4, temperature=0.0, watchers=()):
    engine = SlotsEngine(SlotsOptions(max_completion_length=8, temperature=temperature, micro_group=slots,
                                      schedule="round_robin"))
    return engine(bundle.model, bundle.tokenizer, prompts, n, watchers=watchers,
                  partial=PartialCall(carried or {}, quota, version))


def ended(tokens, eos, cap=8):
    return bool(tokens) and (tokens[-1] == eos or len(tokens) == cap)


def test_the_quota_of_complete_groups_comes_back_and_the_rest_carries_over(tiny, prompts):
    eos = tiny.tokenizer.eos_token_id
    result = partial(tiny, prompts, 3, quota=2, version=1)
    assert len(result.complete) == 2 and result.rollouts.completion_ids.shape[:2] == (2, 3)
    for group in result.rollouts.completion_id_lists():  # every returned sample ended
        assert ended(group, eos)
    assert sorted(result.complete + list(result.carried)) == list(range(len(prompts)))
    cut_off = [s for group in result.carried.values() for s in group.cut_off]
    assert cut_off, "with 4 slots for 18 samples some must be cut off"
    for group in result.carried.values():
        for s in group.cut_off:
            assert not ended(group.completions[s], eos)
            assert group.versions[s] == [1] * len(group.completions[s]) == [1] * len(group.logps[s])


def test_resumed_samples_continue_exactly_where_they_stopped(tiny, prompts):
    """Greedy: a group cut off in one call and resumed in the next (its keys and values
    recomputed) ends exactly as an uninterrupted generation of it does."""
    expected = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 3, SlotsOptions(max_completion_length=8,
                                                                                      temperature=0.0))
    first = partial(tiny, prompts, 3, quota=1, version=1)
    carried_prompts = sorted(first.carried)
    second = partial(tiny, [prompts[p] for p in carried_prompts], 3, quota=len(carried_prompts), version=2,
                     carried={i: first.carried[p] for i, p in enumerate(carried_prompts)})
    assert any(group.cut_off for group in first.carried.values())
    texts = dict(zip(first.complete, first.rollouts.texts))
    texts.update((carried_prompts[i], group) for i, group in zip(second.complete, second.rollouts.texts))
    assert [texts[p] for p in range(len(prompts))] == expected.texts
    versions = second.rollouts.token_versions
    assert (versions[second.rollouts.completion_mask.bool()] == 1).any()  # tokens of the first call kept theirs
    assert set(versions[second.rollouts.completion_mask.bool()].tolist()) <= {1, 2}


def test_decoding_stops_as_soon_as_the_quota_is_met(tiny, prompts):
    """No model call once the quota's last group completes: the cut-off samples stop consuming
    compute at once (each call records how many groups were complete before it)."""
    complete_before_call, model = [], tiny.model
    result_holder = {}
    original = model.forward

    def counting(*args, **kwargs):
        decoder = result_holder.get("decoder")
        complete_before_call.append(len(decoder.completed) if decoder else -1)
        return original(*args, **kwargs)

    from podsrl.rollout import slot_decoder
    init = slot_decoder.SlotDecoder.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        result_holder["decoder"] = self

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model, "forward", counting)
        patch.setattr(slot_decoder.SlotDecoder, "__init__", remember)
        result = partial(tiny, prompts, 3, quota=2, version=1, slots=3)
    decoder = result_holder["decoder"]
    decode_calls = complete_before_call[-decoder.decode_steps:]
    assert max(decode_calls) < 2 <= len(decoder.completed)  # the last call was the one that met the quota
    full = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 3, SlotsOptions(max_completion_length=8,
                                                                                  temperature=0.0, micro_group=3))
    assert decoder.decode_steps < full.stats["decode_steps"]
    assert result.rollouts.stats["decode_steps"] == decoder.decode_steps


def test_recorded_logprobs_are_the_policys_and_current_tokens_weigh_exactly_one(tiny, prompts):
    torch.manual_seed(0)
    first = partial(tiny, prompts, 3, quota=1, version=1, temperature=1.0)
    carried_prompts = sorted(first.carried)
    torch.manual_seed(1)
    second = partial(tiny, [prompts[p] for p in carried_prompts], 3, quota=len(carried_prompts), version=1,
                     carried={i: first.carried[p] for i, p in enumerate(carried_prompts)}, temperature=1.0)
    rollouts = second.rollouts
    # trained in the step that drew it (no update in between): no log-prob to correct with, weight exactly 1
    assert rollouts.sampling_logp.isnan().all()
    kept = rollouts.kept(torch.arange(3).repeat(len(carried_prompts), 1))
    batch = flatten_for_update(kept, torch.ones(len(carried_prompts), 3))
    policy_logp = token_logprobs(tiny.model, batch.input_ids, batch.attention_mask, batch.completion_mask.shape[1])
    mask = batch.completion_mask.float()
    for mode in ("token_truncate", "sequence_mask", STALE_MASK):
        weights = sampler_importance_weights(policy_logp, batch.sampling_logp, mask, SamplerCorrection(mode=mode))
        assert torch.equal(weights * mask.sum(-1, keepdim=True).clamp(max=1), torch.ones_like(weights) *
                           mask.sum(-1, keepdim=True).clamp(max=1))
    # the same tokens seen from the next step: their recorded log-probs are the policy's (same weights)
    third = partial(tiny, [prompts[p] for p in carried_prompts], 3, quota=len(carried_prompts), version=2,
                    carried={i: first.carried[p] for i, p in enumerate(carried_prompts)}, temperature=1.0)
    stale = ~third.rollouts.sampling_logp.isnan()
    assert stale.any()
    batch = flatten_for_update(third.rollouts.kept(torch.arange(3).repeat(len(carried_prompts), 1)),
                               torch.ones(len(carried_prompts), 3))
    policy_logp = token_logprobs(tiny.model, batch.input_ids, batch.attention_mask, batch.completion_mask.shape[1])
    recorded = batch.sampling_logp
    on = ~recorded.isnan()
    assert torch.allclose(policy_logp[on], recorded[on], atol=1e-4)
    masked = sampler_importance_weights(policy_logp, recorded, batch.completion_mask.float(),
                                        SamplerCorrection(mode=STALE_MASK))
    assert torch.equal(masked, (~on).float())


def test_every_group_completes_exactly_once_over_many_calls(tiny, prompts):
    """Groups tagged by id across calls (the trainer's pool): each one started is either complete
    in exactly one call or still in flight, never both and never twice; every complete group's
    samples all ended."""
    eos, pool, started, complete, fresh = tiny.tokenizer.eos_token_id, [], [], [], iter(range(10**6))
    torch.manual_seed(0)
    for version in range(1, 7):
        new = [next(fresh) for _ in range(2 + 2 - len(pool))]  # 2 a call, 2 more in flight
        started += new
        ids = [tag for tag, _ in pool] + new
        texts = [prompts[tag % len(prompts)] for tag in ids]
        result = partial(tiny, texts, 3, quota=2, version=version, temperature=1.0, slots=3,
                         carried={i: group for i, (_, group) in enumerate(pool)})
        complete += [ids[p] for p in result.complete]
        for sample in result.rollouts.completion_id_lists():
            assert ended(sample, eos)
        pool = [(ids[p], group) for p, group in sorted(result.carried.items())]
    assert len(complete) == len(set(complete)) == 12
    assert sorted(complete + [tag for tag, _ in pool]) == sorted(started)


@pytest.mark.parametrize("seed", range(20))
def test_the_staleness_bound_restarts_exactly_the_samples_beyond_it(seed):
    rng = random.Random(seed)
    step, bound = rng.randint(3, 9), rng.randint(1, 3)
    pool = CarriedPool(PartialRolloutOptions(partial_max_staleness=bound))
    for _ in range(rng.randint(1, 4)):
        n = rng.randint(2, 5)
        versions = []
        for _ in range(n):
            first = rng.randint(1, step - 1)
            versions.append(sorted(rng.randint(first, step - 1) for _ in range(rng.randint(0, 4))))
        finished = [bool(v) and rng.random() < 0.5 for v in versions]
        skipped = [not v and rng.random() < 0.3 for v in versions]
        pool.prompts.append(rng.randrange(100))
        pool.groups.append(CarriedGroup([[7] * len(v) for v in versions], versions,
                                        [[-1.0] * len(v) for v in versions], finished, skipped))
    before = [[v[0] if v else None for v in g.versions] for g in pool.groups]
    restarted = pool.bound_staleness(step)
    assert restarted == sum(first is not None and step - first > bound for firsts in before for first in firsts)
    for group, firsts in zip(pool.groups, before):
        had_stale = any(first is not None and step - first > bound for first in firsts)
        for s, first in enumerate(firsts):
            assert not group.versions[s] or step - group.versions[s][0] <= bound
            if first is not None and step - first <= bound:
                assert group.versions[s]  # within the bound: kept
            if had_stale:  # early stop's verdict rested on dropped samples: skipped ones start again
                assert not group.skipped[s]


def test_pool_state_round_trips():
    pool = CarriedPool()
    pool.prompts = [4, 9]
    pool.groups = [CarriedGroup([[1, 2], []], [[3, 3], []], [[-0.5, -1.5], []], [True, False], [False, True]),
                   CarriedGroup([[5]], [[2]], [[-2.0]], [False], [False])]
    other = CarriedPool()
    other.load_state_dict(pool.state_dict())
    assert other.state_dict() == pool.state_dict()
    pool.groups[0].completions[0].append(3)  # a snapshot is a copy
    assert other.groups[0].completions[0] == [1, 2]
    with pytest.raises(ValueError, match="partial_rollouts"):
        other.load_state_dict({"prompts": [1], "groups": []})


@pytest.mark.parametrize("overrides,message", [
    (dict(generation_engine="hf"), "partial_rollouts: generation_engine hf cannot stop"),
    (dict(generation_schedule="length_aware"), "partial_rollouts: generation_schedule length_aware"),
    (dict(adaptive_n=True), "partial_rollouts: not with adaptive_n"),
    (dict(generation_batch_size=32), "partial_rollouts: generation_batch_size 32"),  # >= n: a valid size otherwise
    (dict(partial_stale_correction="drop"), "partial_stale_correction: unknown 'drop'"),
    (dict(partial_max_staleness=0), "partial_max_staleness: must be >= 1"),
    (dict(partial_extra_prompts=0), "partial_extra_prompts: must be positive"),
])
def test_combinations_that_cannot_work_are_refused_in_one_line(overrides, message):
    cfg = Config(**{"generation_engine": "slots", "partial_rollouts": True, **overrides})
    with pytest.raises(ValueError, match=message) as err:
        validate(cfg)
    assert "\n" not in str(err.value)


def records(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "train_seconds"} for r in rows
            if r["step"] > 0]


# the shipped tiny model on arithmetic: completions of 5 to 9 tokens, so groups complete at different times
PARTIAL = dict(task="arithmetic", max_completion_length=12, generation_engine="slots", generation_micro_group=8,
               generation_schedule="round_robin", partial_rollouts=True, prompts_per_step=4, num_generations=4,
               num_kept=2)


def partial_config(out, **overrides):
    return quick("tiny", out, **{**PARTIAL, **overrides})


@pytest.mark.slow
def test_a_resumed_run_repeats_an_uninterrupted_one_with_the_carried_groups(tmp_path):
    straight = tmp_path / "straight"
    train(partial_config(straight, max_steps=4, save_steps=2))
    parts = torch.load(list_checkpoints(straight / "checkpoints")[0] / "parts.pt", weights_only=True)[0]
    assert parts["carried_groups"]["groups"], "the checkpoint holds the groups in flight"
    resumed = tmp_path / "resumed"
    train(partial_config(resumed, max_steps=2, save_steps=2))
    train(partial_config(resumed, max_steps=4, save_steps=2, resume=True))
    def training(rows):  # the shorter run's last step also evaluated
        return [{k: v for k, v in row.items() if not k.startswith("eval_")} for row in rows]
    assert training(records(resumed)) == training(records(straight))
    assert any(r["partial_samples_resumed"] for r in records(straight))


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [dict(method="grpo", num_kept=4), dict(method="grpo-ga"),
                                       dict(group_early_stop=True, correct_weight=1.0, format_weight=0.0),
                                       dict(partial_stale_correction="mask", partial_max_staleness=1),
                                       dict(prompt_selector="pass_rate")])
def test_partial_rollouts_compose_and_stay_within_the_staleness_bound(tmp_path, overrides):
    cfg = partial_config(tmp_path / "run", max_steps=4, **overrides)
    train(cfg)
    rows = records(tmp_path / "run")
    assert len(rows) == 4
    for row in rows:
        assert row["staleness_max"] <= cfg.partial_max_staleness
        assert 0.0 <= row["off_policy_token_frac"] <= 1.0 and 0.0 <= row["idle_slot_frac"] < 1.0
        assert row["importance_sampling_weight_min"] <= row["importance_sampling_weight_max"]
    assert all(row["partial_groups_carried"] >= PARTIAL["prompts_per_step"] // 4 for row in rows)


@pytest.mark.slow
def test_dynamic_sampling_over_partial_rollouts_sets_constant_groups_aside_and_loses_no_informative_one(tmp_path):
    """DAPO's rounds over the one pool of groups in flight: each round asks for the informative
    groups still lacking, so informative groups are never generated beyond the step's share
    (none is thrown away); constant complete groups are set aside (counted), and fill the batch
    only at the cap. The tiny model's arithmetic groups are often constant."""
    cfg = partial_config(tmp_path / "run", max_steps=5, dynamic_sampling=True, dynamic_sampling_rounds=2)
    train(cfg)
    rows = records(tmp_path / "run")
    share = PARTIAL["prompts_per_step"]
    for row in rows:
        constant = round(row["generated_constant_frac"] * row["prompts_generated"])
        trained_constant = round(row["reward_zero_var_frac"] * share)
        assert row["prompts_generated"] - constant <= share  # informative groups generated: at most the share
        assert row["constant_groups_set_aside"] == constant - trained_constant
        if row["prompt_rounds"] < 3:  # it stopped before the cap: every trained group is informative
            assert trained_constant == 0 and row["prompts_generated"] - constant == share
        assert row["staleness_max"] <= cfg.partial_max_staleness
    assert any(row["prompt_rounds"] > 1 for row in rows) and any(row["constant_groups_set_aside"] for row in rows)


class TwoProcesses:
    """Rank ``rank`` of two, whose collectives see the other process's numbers ``other``."""

    world_size = 2

    def __init__(self, rank, other):
        self.rank, self.other = rank, other

    def gather(self, tensor):
        return torch.cat([tensor, self.other] if self.rank == 0 else [self.other, tensor])


class CountingSelector:
    learns = False

    def __init__(self):
        self.taken = []

    def take(self, count, step, group_size):
        self.taken.append(count)
        return list(range(100, 100 + count))


@pytest.mark.parametrize("rank,mine,other,slice_", [(0, 3, 1, [100, 101, 102]), (1, 3, 1, [101, 102, 103]),
                                                    (1, 0, 4, []), (0, 2, 0, [100, 101])])
def test_each_process_draws_exactly_the_fresh_prompts_it_lacks_from_one_shared_list(rank, mine, other, slice_):
    """Dynamic sampling's rounds leave processes lacking different numbers of groups: one list is
    drawn for both (the selector's draws stay the same on every process), each takes its slice."""
    from podsrl.generation.prompt_source import PromptSource

    selector = CountingSelector()
    source = PromptSource(selector, 4, None, None, None, TwoProcesses(rank, torch.tensor([other])),
                          pool=CarriedPool(PartialRolloutOptions(partial_rollouts=True)))
    assert source.fresh_prompts(mine, step=1, n=4) == slice_
    assert selector.taken == ([mine + other] if mine + other else [])


def test_a_process_with_its_share_generates_nothing_and_carries_every_group_on(tiny, prompts):
    """Quota 0 (dynamic sampling's round where this process already has its informative
    groups): no engine call, no group lost."""
    from podsrl.distributed import Processes
    from podsrl.methods import METHODS
    from podsrl.tasks.base import PreparedSplit
    from podsrl.trainer.stages import RolloutGenerator

    class NoCalls:
        def __call__(self, *args, **kwargs):
            raise AssertionError("the engine was called for quota 0")

    generator = RolloutGenerator(NoCalls(), tiny.model, tiny.tokenizer, Processes(),
                                 METHODS["pods"].bound(2, "max_variance"), 0, 4, 0, None)
    group = CarriedGroup([[5, 6], []], [[1, 1], []], [[-0.5, -0.7], []], [False, False], [False, False])
    split = PreparedSplit([None, None], prompts[:2], 0, False, "")
    result = generator(split, 2, 2, 1, carried={0: group}, quota=0)
    assert result.complete == [] and result.rollouts.completion_ids.shape == (0, 2, 1)
    assert result.carried == {0: group}


def test_a_config_dataclass_default_leaves_partial_rollouts_off():
    assert not Config().partial_rollouts
    assert {f.name for f in dataclasses.fields(Config)} >= {"partial_rollouts", "partial_extra_prompts",
                                                             "partial_max_staleness", "partial_stale_correction"}


@pytest.mark.slow
def test_samples_beyond_the_staleness_bound_are_generated_again(tmp_path):
    """Many groups in flight and few slots: groups wait several steps, so samples reach the bound;
    they are restarted (counted), and no trained token is ever staler than the bound."""
    cfg = partial_config(tmp_path / "run", max_steps=6, partial_extra_prompts=8, partial_max_staleness=1,
                         generation_micro_group=4)
    train(cfg)
    rows = records(tmp_path / "run")
    assert sum(row["partial_samples_restarted"] for row in rows) > 0
    assert max(row["staleness_max"] for row in rows) == 1


class GarbageEngine:
    """A user's engine whose partial call returns the wrong number of groups."""

    def __init__(self, options):
        self.inner = None

    def __call__(self, model, tokenizer, prompts, num_samples, watchers=(), partial=None):
        assert partial is not None, "called without a partial call"
        engine = SlotsEngine(SlotsOptions(max_completion_length=4, temperature=0.0, micro_group=4))
        result = engine(model, tokenizer, prompts, num_samples, partial=partial)
        result.complete = result.complete[:-1]
        return result

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def check_state(self, state):
        pass


def test_a_user_engines_partial_generation_is_held_to_its_contract(tiny, prompts):
    from podsrl.contracts import UserCodeError
    from podsrl.rollout import CheckedEngine

    engine = CheckedEngine(GarbageEngine(None), "generation_engine", "my_engines:GarbageEngine")
    with pytest.raises(UserCodeError, match="^generation_engine: my_engines:GarbageEngine returned 1 complete groups"):
        engine(tiny.model, tiny.tokenizer, prompts, 3, partial=PartialCall({}, 2, 1))

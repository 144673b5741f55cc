"""Lossless early stop of saturated groups: the stop condition against brute force, the slots
engine's cancellation, the scorer's bounds and masked scoring, and a short training run."""

import dataclasses
import itertools
import json
import math
import random
from collections import Counter

import pytest
import torch

from podsrl.algorithms.early_stop import fill_skipped, max_kept_variance, saturated
from podsrl.algorithms.select import max_variance
from podsrl.generation.saturation import SaturationStopper, reward_bounds
from podsrl.rewards import RewardError, bounded, in_process
from podsrl.rollout import ENGINES, STOP_GROUPS, HFOptions, SlotsOptions, generate_in_slots
from podsrl.scoring import Scorer, ScoringOptions
from podsrl.tasks import TaskOptions, build_task, prepare_split
from podsrl.trainer import train
from podsrl.trainer.config import Config, validate
from podsrl.trainer.logging import group_stats


def best_subset_variance(values: list[float], m: int) -> float:
    """Brute force: the largest population variance of any m of ``values``."""
    def variance(xs):
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / len(xs)
    return max(variance(c) for c in itertools.combinations(values, m))


@pytest.mark.parametrize("seed", range(40))
def test_stopping_never_lowers_the_best_achievable_kept_variance(seed):
    rng = random.Random(seed)
    low, high = rng.choice([(0.0, 1.0), (-1.0, 1.0), (0.2, 0.7)])
    m = rng.randint(2, 5)
    n = rng.randint(m, 10)
    # rewards drawn from the bounds and a few interior values, so ties and saturation both happen
    support = [low, high, low + 0.3 * (high - low), low + 0.8 * (high - low)]
    weights = [rng.random() for _ in support]
    rewards = rng.choices(support, weights, k=n)
    best_over_all = best_subset_variance(rewards, m)
    bound = max_kept_variance(m, low, high)
    assert best_over_all <= bound + 1e-12
    for k in range(1, n + 1):
        prefix = rewards[:k] + [math.nan] * (n - k)  # the samples not finished yet are NaN
        stop = bool(saturated(torch.tensor([prefix], dtype=torch.float64), m, low, high)[0])
        prefix_best = best_subset_variance(rewards[:k], m) if k >= m else 0.0
        if stop:  # lossless: what the finished samples allow is what all n would allow
            assert prefix_best == pytest.approx(best_over_all, abs=1e-12), (rewards, k, m)
        # complete: a prefix that already reaches the bound is recognised
        assert stop == (k >= m and prefix_best >= bound - 1e-12), (rewards, k, m)


def test_max_kept_variance_is_reached_by_a_balanced_split_at_the_bounds():
    for m in range(2, 9):
        split = [1.0] * (m // 2) + [-2.0] * (m - m // 2)
        assert max_kept_variance(m, -2.0, 1.0) == pytest.approx(torch.tensor(split).var(correction=0).item())
    with pytest.raises(ValueError, match="low < high"):
        saturated(torch.zeros(1, 2), 2, 1.0, 1.0)


@pytest.mark.parametrize("seed", range(20))
def test_max_variance_never_keeps_a_filled_sample_of_a_saturated_group(seed):
    gen = torch.Generator().manual_seed(seed)
    m, n = 4, 12
    rewards = torch.randint(0, 2, (8, n), generator=gen).double()  # binary rewards in [0, 1]
    generated = torch.ones(8, n, dtype=torch.bool)
    for row in range(8):  # keep only a saturated prefix generated where one exists
        for k in range(m, n + 1):
            if saturated(rewards[row:row + 1, :k], m, 0.0, 1.0)[0]:
                generated[row, k:] = False
                break
    scored = rewards.masked_fill(~generated, float("nan"))
    keep = max_variance(fill_skipped(scored, generated), m)
    assert generated.gather(1, keep).all()
    full = max_variance(rewards, m)  # the kept variance equals the one with every sample generated
    assert torch.allclose(rewards.gather(1, keep).var(1, correction=0), rewards.gather(1, full).var(1, correction=0))


def test_group_stats_leave_skipped_samples_out():
    rewards = torch.tensor([[1.0, 0.0, float("nan"), float("nan")], [1.0, 1.0, 1.0, 1.0]])
    stats = group_stats("r", rewards)
    assert stats["r_mean"] == pytest.approx(5 / 6)
    assert stats["r_std"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert stats["r_zero_var_frac"] == 0.5


# --- bounds and masked scoring ---------------------------------------------------------------
def test_scorer_bounds_from_declared_functions():
    task = build_task(TaskOptions())
    assert Scorer.build(task, ScoringOptions()).bounds() == pytest.approx((0.0, 1.0))

    def undeclared(prompts, completions, **_):
        return [0.5] * len(completions)

    with pytest.raises(ValueError, match="undeclared"):
        reward_bounds(Scorer.build(task, ScoringOptions(reward_funcs=(undeclared,), reward_weights=(1.0,))))
    signed = bounded(-1.0, 2.0)(lambda prompts, completions, **_: [0.0] * len(completions))
    scorer = Scorer.build(task, ScoringOptions(reward_funcs=(signed, task.correct_fn), reward_weights=(-0.5, 2.0)))
    # -0.5 * [-1, 2] = [-1, 0.5]; 2 * [0, 1] = [0, 2]
    assert scorer.bounds() == pytest.approx((-1.0, 2.5))


@pytest.mark.parametrize("declared, message", [
    (("0", "1"), r"must be two finite numbers \(low, high\), got \('0', '1'\)"),
    ((0.0, 1.0, 2.0), "must be two finite numbers"),
    ((0.0,), "must be two finite numbers"),
    ((0.0, float("inf")), "must be two finite numbers"),
    ((True, 1.0), "must be two finite numbers"),
    (0.5, "must be two finite numbers"),
    ((1.0, 0.0), r"\(1.0, 0.0\) are reversed \(low 1 is above high 0\)"),
])
def test_malformed_reward_bounds_are_refused_naming_the_function_before_any_work(declared, message):
    """Early stop's losslessness rests on the declared bounds: strings, three numbers, infinite or
    reversed bounds are refused when the reward stack is built (before the model loads), never read
    in part or swapped."""
    task = build_task(TaskOptions())

    def my_reward(prompts, completions, **_):
        return [0.5] * len(completions)

    my_reward.reward_bounds = declared
    with pytest.raises(ValueError, match=f"^reward function my_reward: reward_bounds {message}"):
        Scorer.build(task, ScoringOptions(reward_funcs=(in_process(my_reward),), reward_weights=(1.0,)))
    with pytest.raises(ValueError, match="bounded\\(low, high\\): "):
        bounded(*declared) if isinstance(declared, tuple) and len(declared) == 2 else bounded("a", 1)


@pytest.mark.parametrize("policy", ["raise", "zero"])
def test_a_reward_outside_its_declared_bounds_is_a_failure_of_the_function(policy):
    """A value outside the declared [low, high] would make early stop's verdicts wrong: under 'raise'
    one line naming the function, the value and the bounds; under 'zero' it scores 0, counted."""
    task = build_task(TaskOptions())
    values = [0.5, 1.5, -0.25, 1.0]
    loose = bounded(0.0, 1.0)(in_process(lambda prompts, completions, **_: values[:len(completions)]))
    loose.__name__ = "loose"
    scorer = Scorer.build(task, ScoringOptions(reward_funcs=(loose,), reward_weights=(1.0,),
                                               reward_error_policy=policy))
    stack = scorer.custom
    if policy == "raise":
        with pytest.raises(RewardError, match=r"^reward function loose returned 1.5 on prompt index 1, outside its "
                                              r"declared reward_bounds \[0, 1\]"):
            stack(["p"] * 4, ["c"] * 4, {})
        return
    assert stack(["p"] * 4, ["c"] * 4, {}).tolist() == [0.5, 0.0, 0.0, 1.0]
    assert stack.failures == 2


@pytest.fixture(scope="module")
def arithmetic_split(tiny):
    task = build_task(TaskOptions())
    split = prepare_split(task.train[:6], tiny.tokenizer, system_prompt="", use_chat_template=False,
                          max_prompt_tokens=512)
    return task, split


def test_scoring_skips_samples_never_generated(tiny, arithmetic_split):
    task, split = arithmetic_split
    scorer = Scorer.build(task, ScoringOptions())
    torch.manual_seed(0)
    rollouts = ENGINES["hf"](HFOptions())(tiny.model, tiny.tokenizer, split.prompts, 5)
    full = scorer(split, rollouts)
    generated = torch.rand(6, 5, generator=torch.Generator().manual_seed(1)) < 0.6
    masked = scorer(split, dataclasses.replace(rollouts, generated=generated))
    assert torch.equal(masked.reward.isnan(), ~generated)
    assert torch.equal(masked.reward[generated], full.reward[generated])
    assert torch.equal(masked.correct[generated], full.correct[generated])
    # scoring samples one by one (as early stop does) gives the batch's rewards
    where = generated.nonzero().tolist()
    ids = rollouts.completion_id_lists()
    one_by_one = scorer.sample_scores(split, [p for p, _ in where], [rollouts.texts[p][j] for p, j in where],
                                      [ids[p * 5 + j] for p, j in where])
    assert torch.equal(one_by_one.reward, full.reward[generated])
    assert torch.equal(one_by_one.correct, full.correct[generated])


def test_the_reward_stage_reuses_what_early_stop_scored(tiny, arithmetic_split):
    """Every generated sample is scored once: the reward stage scores only what the watcher
    never saw, and the result equals scoring every sample afresh (a deterministic reward)."""
    task, split = arithmetic_split
    scored = []

    @in_process  # counts in this process
    @bounded(0.0, 1.0)
    def counted(prompts, completions, **kwargs):
        scored.append(len(completions))
        return task.correct_fn(prompts=prompts, completions=completions, **kwargs)

    scorer = Scorer.build(task, ScoringOptions(reward_funcs=(counted,), reward_weights=(1.0,)))
    stopper = SaturationStopper(scorer, split, tiny.tokenizer, 2, (0.0, 1.0))
    torch.manual_seed(0)
    rollouts = generate_in_slots(tiny.model, tiny.tokenizer, split.prompts, 8,
                                 SlotsOptions(max_completion_length=8, micro_group=12,
                                              schedule="round_robin"), watchers=(stopper,))
    early = stopper.early_scores(rollouts)  # [6, 8]
    reported = sum(scored)
    assert reported == int((~early.reward.isnan()).sum()) > 0  # every reported sample found in the result
    assert not bool((~early.reward.isnan() & ~rollouts.generated_mask).any())
    reused = scorer(split, dataclasses.replace(rollouts, early_scores=early))
    assert sum(scored) == int(rollouts.generated_mask.sum())  # the rest scored once, nothing twice
    fresh = scorer(split, rollouts)
    for name in ("reward", "correct", "format", "unverifiable"):
        assert torch.equal(getattr(reused, name).nan_to_num(-1.0), getattr(fresh, name).nan_to_num(-1.0)), name
    # the scores travel with the rollouts through chunking and prompt selection
    both = type(rollouts).concat([dataclasses.replace(rollouts, early_scores=early)] * 2, tiny.tokenizer.pad_token_id)
    assert torch.equal(both.at_prompts([7]).early_scores.reward.nan_to_num(-1.0), early.reward[1:2].nan_to_num(-1.0))
    keep = torch.tensor([[0, 2]] * 6)
    kept = dataclasses.replace(rollouts, early_scores=early).kept(keep)
    assert torch.equal(kept.early_scores.reward.nan_to_num(-1.0), early.reward[:, [0, 2]].nan_to_num(-1.0))


def test_a_reward_failure_in_early_stop_waits_for_the_end_of_generation(tiny, arithmetic_split):
    """Raised inside the engine, a failure would stop this process alone; kept, generation
    ends normally and the generator raises it where every process agrees on it."""
    task, split = arithmetic_split
    calls = []

    @in_process
    @bounded(0.0, 1.0)
    def refuses(prompts, completions, **kwargs):
        calls.append(len(completions))
        raise ValueError("refused")

    scorer = Scorer.build(task, ScoringOptions(reward_funcs=(refuses,), reward_weights=(1.0,)))
    stopper = SaturationStopper(scorer, split, tiny.tokenizer, 2, (0.0, 1.0))
    torch.manual_seed(0)
    rollouts = generate_in_slots(tiny.model, tiny.tokenizer, split.prompts, 8,
                                 SlotsOptions(max_completion_length=8, micro_group=12,
                                              schedule="round_robin"), watchers=(stopper,))
    assert rollouts.generated_mask.all()  # nothing stopped early
    assert isinstance(stopper.failure, RewardError) and "refused" in str(stopper.failure)
    before = len(calls)
    assert stopper([0], [rollouts.completion_id_lists()[0]]) == [] and len(calls) == before  # not called again


def test_slots_engine_cancels_the_unstarted_samples_of_a_saturated_group(tiny, arithmetic_split):
    _, split = arithmetic_split
    seen = []

    def stop_prompt_0_after_three(prompt_index, completion_ids):
        seen.extend(zip(prompt_index, completion_ids))
        return [0] if sum(p == 0 for p, _ in seen) >= 3 else []

    stop_prompt_0_after_three.kind = STOP_GROUPS
    torch.manual_seed(0)
    out = generate_in_slots(tiny.model, tiny.tokenizer, split.prompts, 8,
                            SlotsOptions(max_completion_length=8, micro_group=12,
                                         schedule="round_robin"), watchers=(stop_prompt_0_after_three,))
    generated = out.generated
    assert 3 <= int(generated[0].sum()) < 8  # stopped: at least the samples that made it stop exist
    assert generated[1:].all()  # the other groups were not touched
    assert torch.equal(out.completion_mask.sum(-1) > 0, generated)  # skipped samples are empty
    assert all(out.texts[0][j] == "" for j in range(8) if not generated[0, j])
    # what the watcher saw finish is in the result with the same tokens (a sample that ends
    # on its first token in the last refill may finish unreported: nothing is left to cancel)
    ids = out.completion_id_lists()
    for prompt in range(6):
        result = Counter(tuple(ids[prompt * 8 + j]) for j in range(8) if generated[prompt, j])
        reported = Counter(tuple(tokens) for p, tokens in seen if p == prompt)
        assert not reported - result, prompt
    assert sum(p == 0 for p, _ in seen) >= 3


def test_saturation_stopper_scores_with_the_run_reward(tiny, arithmetic_split):
    task, split = arithmetic_split
    scorer = Scorer.build(task, ScoringOptions(correct_weight=1.0, format_weight=0.0))
    stopper = SaturationStopper(scorer, split, tiny.tokenizer, 2, (0.0, 1.0))
    answer = split.examples[0].answer
    right = tiny.tokenizer(f"Answer: {answer}", add_special_tokens=False)["input_ids"]
    wrong = tiny.tokenizer(f"Answer: {int(answer) + 1}", add_special_tokens=False)["input_ids"]
    assert stopper([0, 1], [right, right]) == []
    assert stopper([0], [right]) == []  # two right answers: variance 0 so far
    assert stopper([0, 1], [wrong, right]) == [0]  # one right, one wrong: the bound for m = 2
    assert stopper([0], [wrong]) == []  # reported once


# --- configuration and a training run --------------------------------------------------------
EARLY_STOP = dict(generation_engine="slots", generation_schedule="round_robin", generation_micro_group=32,
                  group_early_stop=True)


def test_config_names_what_early_stop_needs():
    validate(Config(**EARLY_STOP))
    for change, message in [(dict(generation_engine="hf"), "generation_engine slots"),
                            (dict(generation_schedule="fifo"), "round_robin"),
                            (dict(generation_schedule="length_aware"), "predicted-long"),
                            (dict(generation_micro_group=0), "generation_micro_group"),
                            (dict(downsampling_rule="random"), "max_variance"),
                            (dict(method="grpo"), "method pods"),
                            (dict(num_kept=1), "num_kept")]:
        with pytest.raises(ValueError, match=message):
            validate(Config(**{**EARLY_STOP, **change}))


@pytest.mark.slow
def test_training_with_early_stop_generates_fewer_rollouts_and_resumes(tmp_path):
    cfg = Config(**EARLY_STOP, correct_weight=1.0, format_weight=0.0, prompts_per_step=8, num_generations=8,
                 max_steps=4, eval_steps=0, eval_prompts=16, eval_samples=1, save_steps=2, progress=False,
                 output_dir=str(tmp_path / "run"), log_rollouts=8)
    train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollouts_generated" in r]
    assert len(steps) == 4
    assert all(r["rollouts_generated"] <= 64 for r in steps)
    assert sum(r["rollouts_generated"] for r in steps) < 4 * 64  # at 59% accuracy many groups saturate
    assert all(0 <= r["groups_stopped_early"] <= 1 for r in steps)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == sum(r["rollouts_generated"] for r in steps)  # skipped samples are not logged
    # an interrupted run resumes to the same steps (early stop keeps no state across steps)
    train(dataclasses.replace(cfg, max_steps=2, output_dir=str(tmp_path / "resumed")))
    train(dataclasses.replace(cfg, output_dir=str(tmp_path / "resumed"), resume=True))
    again = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]

    def late_steps(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "train_seconds"}
                for r in rows if r["step"] > 2]
    assert late_steps(again) == late_steps(records) and len(late_steps(records)) == 2

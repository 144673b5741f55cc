"""Prompt selection (#30): the pass-rate posterior against numerical integrals and a
brute-force replay of its history, the draw probabilities against their definition, the
starvation floor, unseen prompts, exact state round trips, DAPO's informative-first batch,
and the selectors inside the trainer (refill rounds, evaluation untouched)."""

import json
import math
import random
import zlib

import pytest
import torch

from podsrl.algorithms.group_stats import is_constant
from podsrl.algorithms.pass_rate import PassRatePosterior, beta_power_mean, draw_probabilities, nonconstant_probability
from podsrl.generation.prompt_source import informative_first
from podsrl.metrics import read_metrics
from podsrl.prompt_selection import (
    PROMPT_SELECTORS,
    PassRateSelector,
    PromptSelectionOptions,
)
from podsrl.trainer import train
from podsrl.trainer.config import make_config


def beta_integral(f, alpha: float, beta: float, points: int = 200_001) -> float:
    """E[f(p)] under Beta(alpha, beta) by the trapezoid rule; integer or large alpha, beta: a
    smooth density (a slope unbounded at 0 or 1 costs the rule ~1e-6 relative)."""
    p = torch.linspace(0, 1, points, dtype=torch.float64)
    log_norm = math.lgamma(alpha + beta) - math.lgamma(alpha) - math.lgamma(beta)
    density = torch.exp(log_norm + (alpha - 1) * torch.log(p.clamp_min(1e-300))
                        + (beta - 1) * torch.log((1 - p).clamp_min(1e-300)))
    return float(torch.trapezoid(f(p) * density, p))


@pytest.mark.parametrize("alpha, beta, n", [(1.0, 1.0, 4), (2.5, 7.0, 16), (9.2, 8.8, 16), (30.0, 2.0, 64),
                                            (3.0, 1.0, 1)])
def test_moments_and_informativeness_match_numerical_integrals(alpha, beta, n):
    a, b = torch.tensor([alpha]), torch.tensor([beta])
    assert float(beta_power_mean(a, b, n)) == pytest.approx(beta_integral(lambda p: p ** n, alpha, beta), rel=1e-6)
    constant = beta_integral(lambda p: p ** n + (1 - p) ** n, alpha, beta)
    assert float(nonconstant_probability(a, b, n)) == pytest.approx(1 - constant, abs=1e-7)


def test_moments_below_one_follow_the_beta_recursion():
    """alpha < 1 (a density unbounded at 0, where the trapezoid rule fails): E[p^(k+1)] =
    E[p^k] (alpha + k) / (alpha + beta + k), from E[p^0] = 1."""
    alpha, beta = torch.tensor([0.3, 0.8]), torch.tensor([0.5, 2.0])
    expected = torch.ones(2, dtype=torch.float64)
    for k in range(12):
        assert torch.allclose(beta_power_mean(alpha, beta, k), expected, rtol=1e-10)
        expected = expected * (alpha + k) / (alpha + beta + k)


def test_a_sharp_belief_gives_the_known_pass_rate_formula():
    for p in (0.05, 0.5, 0.9):
        sharp = nonconstant_probability(torch.tensor([1e7 * p]), torch.tensor([1e7 * (1 - p)]), 16)
        assert float(sharp) == pytest.approx(1 - p ** 16 - (1 - p) ** 16, abs=1e-5)


def test_draw_probabilities_are_their_definition_and_keep_the_floor():
    generator = torch.Generator().manual_seed(0)
    for exploration in (0.01, 0.1, 1.0):
        informativeness = torch.rand(50, generator=generator, dtype=torch.float64)
        informativeness[:5] = 0.0  # predicted constant
        q = draw_probabilities(informativeness, exploration)
        assert float(q.sum()) == pytest.approx(1.0)
        expected = (1 - exploration) * informativeness / informativeness.sum() + exploration / 50
        assert torch.allclose(q, expected)
        assert float(q.min()) >= exploration / 50 - 1e-15  # no prompt starves
    assert torch.equal(draw_probabilities(torch.zeros(4, dtype=torch.float64), 0.1),
                       torch.full((4,), 0.25, dtype=torch.float64))


def test_posterior_is_the_discounted_sum_of_its_history():
    """A random history, replayed by brute force: each observation weighs 0.5^(age / half_life)
    at the step asked about, and the belief is the pool prior plus the weighted counts."""
    rng = random.Random(0)
    size, half_life, strength = 12, 7.0, 3.0
    posterior = PassRatePosterior(size, half_life, strength)
    history = []  # (step, index, passes, trials)
    step = 0
    for _ in range(30):
        step += rng.randint(0, 4)
        indices = [rng.randrange(size) for _ in range(rng.randint(1, 5))]  # repeats allowed
        trials = [rng.randint(0, 8) for _ in indices]
        passes = [rng.randint(0, t) for t in trials]
        posterior.observe(step, torch.tensor(indices), torch.tensor(passes, dtype=torch.float64),
                          torch.tensor(trials))
        history += [(step, i, s, t) for i, s, t in zip(indices, passes, trials)]
    asked = step + 3
    weight = {h: 0.5 ** ((asked - h[0]) / half_life) for h in history}
    pool_pass = sum(weight[h] * h[2] for h in history)
    pool_fail = sum(weight[h] * (h[3] - h[2]) for h in history)
    pool_rate = (pool_pass * 0.5 ** (-3 / half_life) + 1) / ((pool_pass + pool_fail) * 0.5 ** (-3 / half_life) + 2)
    assert posterior.pool_rate() == pytest.approx(pool_rate)  # the pool's rate as of the last observation
    alpha, beta = posterior.beta(asked)
    for i in range(size):
        passes = sum(weight[h] * h[2] for h in history if h[1] == i)
        fails = sum(weight[h] * (h[3] - h[2]) for h in history if h[1] == i)
        assert float(alpha[i]) == pytest.approx(strength * pool_rate + passes)
        assert float(beta[i]) == pytest.approx(strength * (1 - pool_rate) + fails)
    assert posterior.seen.tolist() == [any(h[1] == i and h[3] > 0 for h in history) for i in range(size)]


def selector(size=40, **options) -> PassRateSelector:
    return PassRateSelector(size, PromptSelectionOptions(seed=3, **options))


def observe(sel, step, indices, passes, n=16):
    correct = torch.tensor([[1.0] * p + [0.0] * (n - p) for p in passes])
    sel.observe(step, indices, correct)


@pytest.mark.slow
def test_first_draws_follow_the_draw_probabilities():
    """One prompt per draw: the empirical frequencies of 20,000 draws match the definition
    (a 5-sigma band per prompt), after evidence made some prompts look constant."""
    sel = selector(size=8, exploration=0.2)
    observe(sel, 0, [0, 1, 2, 3], [16, 0, 8, 12])  # all-pass, all-fail, half, mostly
    probabilities, _ = sel.probabilities(1, 16)
    counts = torch.zeros(8)
    draws = 20_000
    for _ in range(draws):
        counts[sel.take(1, 1, 16)[0]] += 1
    for i in range(8):
        p = float(probabilities[i])
        assert abs(counts[i] / draws - p) < 5 * math.sqrt(p * (1 - p) / draws), i
    assert probabilities[2] > probabilities[4] > probabilities[0]  # half-right > unseen > all-right


@pytest.mark.slow
def test_a_prompt_that_looks_constant_is_still_drawn_at_the_exploration_rate():
    """The starvation bound: a prompt whose group looks certain to be constant keeps at least
    exploration / N per draw, so over T steps of P draws it is drawn at least 1 - (1 - e/N)^P
    of the steps (checked over 3,000 steps, 4 sigma)."""
    size, count, exploration = 30, 5, 0.1
    sel = selector(size=size, exploration=exploration, half_life=1e9)
    observe(sel, 0, [0] * 20, [16] * 20)  # prompt 0: 320 passes out of 320
    observe(sel, 0, list(range(1, size)), [8] * (size - 1))
    probabilities, informativeness = sel.probabilities(1, 16)
    assert float(informativeness[0]) < 0.05 < 0.9 < float(informativeness[1:].min())
    assert float(probabilities[0]) < 1.3 * exploration / size  # it is the floor that keeps it in play
    steps = 3000
    hits = sum(0 in sel.take(count, 1, 16) for _ in range(steps))
    floor = 1 - (1 - exploration / size) ** count
    assert hits / steps >= floor - 4 * math.sqrt(floor * (1 - floor) / steps)


def test_unseen_prompts_are_preferred_to_prompts_known_to_be_constant():
    """The pool passing everything makes an unseen prompt likely constant too (shrinkage),
    but less so than the prompts that were seen passing: its belief is the vague pool prior."""
    sel = selector(size=20)
    observe(sel, 0, list(range(10)), [16] * 10)  # the first half: every rollout right
    probabilities, informativeness = sel.probabilities(1, 16)
    assert float(informativeness[10:].min()) > 3 * float(informativeness[:10].max())
    assert float(probabilities[10:].min()) > float(probabilities[:10].max())


def test_forgetting_lets_a_prompt_come_back():
    sel = selector(size=4, half_life=5.0)
    observe(sel, 0, [0], [16])
    early = float(sel.probabilities(1, 16)[1][0])
    late = float(sel.probabilities(100, 16)[1][0])
    assert late > 2 * early  # twenty half-lives later it is judged by the pool again


def test_state_survives_json_exactly():
    sel = selector()
    for step in range(5):
        drawn = sel.take(6, step, 16)
        observe(sel, step, drawn, [random.Random(step * 7 + i).randint(0, 16) for i in range(6)])
    copy = selector()
    copy.load_state_dict(json.loads(json.dumps(sel.state_dict())))
    assert [sel.take(6, 9, 16) for _ in range(3)] == [copy.take(6, 9, 16) for _ in range(3)]
    assert torch.equal(sel.probabilities(9, 16)[0], copy.probabilities(9, 16)[0])


def test_pass_rate_refuses_more_prompts_than_the_split_holds():
    with pytest.raises(ValueError, match="prompt_selector: pass_rate draws 5 different prompts"):
        selector(size=4).take(5, 0, 16)
    with pytest.raises(ValueError, match="prompts_per_step = 5 different prompts per step, more than the 4 usable"):
        PassRateSelector(4, PromptSelectionOptions(prompts_per_step=5))  # at set-up, before any model loads


def test_constant_groups_and_the_informative_first_batch():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.2, 0.2, float("nan")], [0.0, float("nan"), 0.8]])
    assert is_constant(rewards).tolist() == [True, False, True, False]  # not-generated samples ignored
    constant = torch.tensor([True, False, True, False, False, True])
    assert informative_first(constant, 4) == [1, 3, 4, 0]  # generation order within each kind
    assert informative_first(constant, 2) == [1, 3]


def test_selectors_are_registered_and_module_selectors_resolve():
    assert set(PROMPT_SELECTORS) == {"shuffled", "pass_rate"}
    assert PROMPT_SELECTORS.resolve("podsrl.prompt_selection:PassRateSelector") is PassRateSelector
    with pytest.raises(ValueError, match="prompt_selector: unknown prompt selector 'best'"):
        make_config(overrides={"prompt_selector": "best"})


# --- in the trainer ---------------------------------------------------------------------
def run(model_dir, out, reward_funcs=None, **overrides):
    values = dict(model=model_dir, max_steps=3, prompts_per_step=4, num_generations=6, num_kept=3,
                  max_completion_length=6, eval_prompts=16, eval_samples=2, eval_steps=0, save_steps=0,
                  progress=False, output_dir=str(out), learning_rate=1e-3, warmup_steps=0, task="parity")
    values.update(overrides)
    return train(make_config(overrides={k: str(v) for k, v in values.items()}), reward_funcs).run_dir


def mostly_constant(prompts, completions, **_columns):
    """0 for two prompts in three (their groups are constant), the completion's CRC parity
    for the rest (a group of 6 of them is constant 1 time in 32)."""
    return [float(zlib.crc32(c.encode()) % 2) if zlib.crc32(p.encode()) % 3 == 0 else 0.0
            for p, c in zip(prompts, completions)]


@pytest.mark.slow
def test_dynamic_sampling_refills_until_its_cap_and_logs_what_it_spent(random_model_dir, tmp_path):
    """Two groups in three come out constant: steps run extra rounds, set constant groups
    aside, and stop as soon as the batch has its informative groups or, at the cap, fill it
    with constant ones; the record says what was generated."""
    records = [r for r in read_metrics(run(random_model_dir, tmp_path / "ds", [mostly_constant], max_steps=6,
                                           dynamic_sampling=True, dynamic_sampling_rounds=2)
                                       / "metrics.jsonl") if r["step"] > 0]
    for r in records:
        assert r["prompts_generated"] == 4 * r["prompt_rounds"]
        assert 1 <= r["prompt_rounds"] <= 3
        constant = round(r["generated_constant_frac"] * r["prompts_generated"])
        trained_constant = round(r["reward_zero_var_frac"] * 4)
        assert r["constant_groups_set_aside"] == constant - trained_constant
        if r["prompt_rounds"] < 3:  # stopped early: it had its 4 informative groups
            assert trained_constant == 0
    assert any(r["prompt_rounds"] > 1 for r in records)


def test_pass_rate_and_dynamic_sampling_train_together(random_model_dir, tmp_path):
    """Dynamic sampling is the prompt source's, not a selector: with pass_rate, steps refill
    while groups come out constant, and every round's draws come from (and teach) the posterior
    (resuming such a run bit for bit: tests/test_trainer.py's resume cases)."""
    records = [r for r in read_metrics(run(random_model_dir, tmp_path / "both", [mostly_constant], max_steps=4,
                                           prompt_selector="pass_rate", dynamic_sampling=True,
                                           dynamic_sampling_rounds=2) / "metrics.jsonl") if r["step"] > 0]
    assert any(r["prompt_rounds"] > 1 for r in records)
    assert all(r["prompts_generated"] == 4 * r["prompt_rounds"] for r in records)
    assert all("selector_informativeness" in r for r in records)  # pass_rate's own numbers, kept
    seen = [r["selector_prompts_seen"] for r in records]
    assert seen == sorted(seen) and seen[-1] > 4  # the posterior observed more than one round's prompts


@pytest.mark.slow
def test_selectors_leave_evaluation_on_the_whole_held_out_set(random_model_dir, tmp_path):
    """The first evaluation (the same model) is the same with every selector, and with dynamic
    sampling: they only change which train prompts are generated for."""
    first = [read_metrics(run(random_model_dir, tmp_path / f"{name}-{dynamic}", prompt_selector=name,
                              dynamic_sampling=dynamic, max_steps=1) / "metrics.jsonl")[0]
             for name, dynamic in (("shuffled", False), ("pass_rate", False), ("shuffled", True))]
    assert first[0]["eval_accuracy"] == first[1]["eval_accuracy"] == first[2]["eval_accuracy"]
    assert first[0]["eval_greedy_accuracy"] == first[1]["eval_greedy_accuracy"]


def test_max_train_prompts_limits_the_pool_and_pass_rate_refuses_a_smaller_one(random_model_dir, tmp_path):
    records = read_metrics(run(random_model_dir, tmp_path / "pr", prompt_selector="pass_rate", max_train_prompts=6,
                               max_steps=4) / "metrics.jsonl")
    assert max(r["selector_prompts_seen"] for r in records if r["step"] > 0) <= 6
    with pytest.raises(ValueError, match="max_train_prompts: pass_rate draws prompts_per_step = 4"):
        make_config(overrides={"prompt_selector": "pass_rate", "max_train_prompts": "3", "prompts_per_step": "4"})


def test_a_pass_rate_pool_smaller_than_prompts_per_step_is_refused_before_the_run_folder_gets_a_file(
        random_model_dir, tmp_path):
    """The pool is known only once the prompts are tokenised (max_prompt_tokens drops some), so
    this is refused at set-up, not by the config check; the run folder must not keep a config.json
    that the same command would then call a run (#38)."""
    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(10)]
    for name, part in (("train", rows[:2]), ("test", rows[2:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in part))
    with pytest.raises(ValueError, match=r"^prompts_per_step: 4 prompts a step, and the train split has 2 usable "
                                         r"prompts; use at most 2$"):  # any selector's (#80), checked first
        run(random_model_dir, tmp_path / "run", prompt_selector="pass_rate", task="jsonl",
            train_data=tmp_path / "train.jsonl", test_data=tmp_path / "test.jsonl")
    assert not (tmp_path / "run").exists()


def test_an_unknown_selector_name_is_refused_naming_the_field():
    """Only registered names (and module:function) select prompts; the shuffled pass is
    'shuffled', and dynamic sampling is a property of the prompt source, not a selector."""
    from podsrl.trainer.config import Config

    assert Config().prompt_selector == "shuffled" and not Config().dynamic_sampling
    for old in ("none", "dynamic_sampling"):
        with pytest.raises(ValueError, match=rf"^prompt_selector: unknown .*{old}"):
            make_config(overrides={"prompt_selector": old})


class RefillingRecorder:
    """A user's selector with numbers of its own (the prompt source reads only its contract:
    take, observe, record, learns)."""

    learns = False

    def __init__(self, numbers: dict) -> None:
        self.numbers, self.next = numbers, 0

    def take(self, count, step, group_size):
        self.next += count
        return list(range(self.next - count, self.next))

    def observe(self, step, indices, correct):
        pass

    def record(self):
        return dict(self.numbers)


def test_dynamic_sampling_keeps_the_selectors_numbers_and_refuses_one_named_like_its_own():
    """The refilling source adds the selector's record() to its rounds' record, and a selector
    number named like one of the rounds' is a one-line error naming prompt_selector, not a
    silent overwrite."""
    from podsrl.contracts import UserCodeError
    from podsrl.distributed import Processes
    from podsrl.generation.prompt_source import PromptSource
    from podsrl.rollout.partial import PartialGeneration
    from podsrl.tasks.base import Example, PreparedSplit
    from podsrl.trainer.timer import StageTimer
    from podsrl.types import Rollouts, Scores

    split = PreparedSplit([Example(f"q{i}", "1") for i in range(12)], [f"q{i}" for i in range(12)], 0, False, "")

    def generate(part, n, step, round_index, carried, quota):  # [P, n, 1]: one token per sample, every group
        p = len(part.prompts)
        rollouts = Rollouts(torch.zeros(p, 1, dtype=torch.long), torch.ones(p, 1, dtype=torch.long),
                            torch.ones(p, n, 1, dtype=torch.long), torch.ones(p, n, 1, dtype=torch.long),
                            [["x"] * n for _ in range(p)], {"generated_tokens": p * n, "decode_steps": 1})
        return PartialGeneration(rollouts, list(range(p)))

    def score(part, rollouts, step):  # prompt i's group is constant unless i is a multiple of 3
        rewards = torch.tensor([[float(int(e.prompt[1:]) % 3 == 0 and j == 0) for j in range(rollouts.group_size)]
                                for e in part.examples])
        return Scores(rewards, rewards, torch.full_like(rewards, float("nan")), torch.zeros_like(rewards).bool())

    def source(numbers):
        return PromptSource(RefillingRecorder(numbers), 4, split, generate, score, Processes(), extra_rounds=2,
                            pad_token_id=0)

    groups = source({"curriculum_level": 2.0}).scored_groups(1, 3, StageTimer())
    assert groups.record["curriculum_level"] == 2.0
    assert groups.record["prompt_rounds"] == 3 and groups.record["prompts_generated"] == 12  # 4 informative: at the cap
    assert [e.prompt for e in groups.split.examples] == ["q0", "q3", "q6", "q9"]  # informative ones first
    with pytest.raises(UserCodeError, match="prompt_selector: .*'prompt_rounds' from record\\(\\), a name the trainer"):
        source({"prompt_rounds": 1.0}).scored_groups(1, 3, StageTimer())

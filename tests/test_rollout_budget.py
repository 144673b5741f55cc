"""adaptive_n: the constancy posterior against numerical integration and Monte Carlo, the cost
regression, the controller's choice on synthetic inputs, and a short training run."""

import json
import math

import pytest
import torch

from podsrl.algorithms.rollout_budget import (
    RolloutBudget,
    candidate_sizes,
    constant_probability,
    generation_cost,
    value_counts,
)
from podsrl.trainer import train
from podsrl.trainer.config import Config, validate


def beta_moment(a: float, b: float, s: int, points: int = 200_000) -> float:
    """E[p^s] for p ~ Beta(a, b), by the midpoint rule after substitutions that remove the
    density's endpoint singularities: p = u^(1/a) on [0, 1/2], 1 - p = v^(1/b) on [1/2, 1]."""
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    grid = (torch.arange(points, dtype=torch.float64) + 0.5) / points
    u = grid * 0.5**a
    p = u ** (1 / a)  # [0, 1/2]
    left = (s * p.log() + (b - 1) * torch.log1p(-p)).exp().mean() * 0.5**a / a
    v = grid * 0.5**b
    q = v ** (1 / b)  # 1 - p on [1/2, 1]
    right = ((s + a - 1) * torch.log1p(-q)).exp().mean() * 0.5**b / b
    return float((left + right) / math.exp(log_beta))


def constancy_oracle(counts: list[int], s: int, points: int = 200_000) -> float:
    """P(s fresh samples all equal) under Dirichlet(counts + 1/2, 1/2): the sum over categories of
    E[q_j^s], each q_j's marginal being Beta(a_j, A - a_j); integrated numerically."""
    alphas = [c + 0.5 for c in counts if c > 0] + [0.5]
    total = sum(alphas)
    return sum(beta_moment(a, total - a, s, points) for a in alphas)


@pytest.mark.parametrize("k,t", [(0, 4), (2, 4), (4, 4), (15, 16), (16, 16), (1, 8)])
def test_binary_constancy_matches_the_beta_integrals(k, t):
    counts = torch.tensor([[float(k), float(t - k)]])
    sizes = [1, 2, 4, 16, 64]
    got = constant_probability(counts, torch.tensor(sizes))[0]
    for value, s in zip(got.tolist(), sizes):
        assert value == pytest.approx(constancy_oracle([k, t - k], s), abs=2e-3), (k, t, s)
    if k in (0, t):  # one value seen: the unseen category is the other answer, the Jeffreys beta-binomial
        a, b = t + 0.5, 0.5
        assert got[2].item() == pytest.approx(beta_moment(a, b, 4) + beta_moment(b, a, 4), abs=2e-3)


def test_many_valued_constancy_matches_monte_carlo():
    counts = torch.tensor([[3.0, 1.0, 4.0]])  # three observed values; one unseen category besides
    alphas = torch.tensor([3.5, 1.5, 4.5, 0.5])
    q = torch.distributions.Dirichlet(alphas).sample((400_000,))  # [N, 4]
    for s in (1, 2, 3, 6):
        expected = float((q**s).sum(dim=1).mean())
        got = float(constant_probability(counts, torch.tensor([s]))[0, 0])
        assert got == pytest.approx(expected, abs=3e-3), s


def test_constancy_falls_with_group_size_and_more_failures_seen():
    counts = value_counts(torch.tensor([[1.0] * 16, [1.0] * 15 + [0.0], [1.0, 0.0] * 8]))
    probability = constant_probability(counts, torch.tensor(candidate_sizes(4, 64)))  # [3, S]
    assert (probability[:, 1:] <= probability[:, :-1]).all()
    assert (probability[0] > probability[1]).all() and (probability[1] > probability[2]).all()
    assert float(probability[0, -1]) < 1.0  # all-correct so far is not certain to stay all-correct


def test_value_counts_ignore_skipped_samples():
    counts = value_counts(torch.tensor([[1.0, 0.0, float("nan"), 1.0], [0.5, 0.5, 0.5, 0.5]]))
    assert counts.tolist() == [[1.0, 2.0], [4.0, 0.0]]


def test_generation_cost_regression():
    rollouts = [64.0, 128.0, 256.0, 128.0]
    seconds = [0.02 + 0.001 * x for x in rollouts]
    fixed, per_rollout = generation_cost(rollouts, seconds)
    assert fixed == pytest.approx(0.02) and per_rollout == pytest.approx(0.001)
    # one size only: everything per rollout (an upper bound on the marginal cost)
    assert generation_cost([128.0, 128.0], [0.2, 0.2]) == (0.0, pytest.approx(0.2 / 128))


def test_candidate_sizes():
    assert candidate_sizes(4, 64) == [4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert candidate_sizes(4, 20) == [4, 6, 8, 12, 16, 20]
    assert candidate_sizes(3, 3) == [3]


def fed_controller(group_rewards: torch.Tensor, per_rollout: float, rest: float, prompts: int = 16) -> RolloutBudget:
    """A controller that has seen steps at two sizes with the given costs and groups."""
    budget = RolloutBudget(4, 16, 64, prompts)
    for n in (8, 16):
        budget.costs.append((float(prompts * n), 0.01 + per_rollout * prompts * n, rest))
    budget.groups.append(value_counts(group_rewards))
    return budget


def oracle_choice(group_rewards: torch.Tensor, per_rollout: float, rest: float, prompts: int = 16) -> int:
    """argmax over sizes of non-constant groups per second, informative fraction by integration."""
    best, best_rate = None, -1.0
    for s in candidate_sizes(4, 64):
        informative = []
        for row in group_rewards.tolist():
            k, t = int(sum(row)), len(row)
            informative.append(1 - constancy_oracle([k, t - k], s, points=20_000))
        rate = sum(informative) / (0.01 + per_rollout * prompts * s + rest)
        if rate > best_rate:
            best, best_rate = s, rate
    return best


@pytest.mark.parametrize("correct,per_rollout,rest", [
    (8, 1e-4, 0.1),  # every group half right: constancy is rare beyond a few samples -> a small n
    (16, 1e-5, 0.1),  # every group all right so far, generation nearly free -> a large n
    (16, 1e-3, 0.1),  # the same groups, generation dear -> a smaller n
    (14, 2e-4, 0.1),
])
def test_controller_chooses_the_oracle_size(correct, per_rollout, rest):
    rewards = torch.tensor([[1.0] * correct + [0.0] * (16 - correct)] * 16)
    budget = fed_controller(rewards, per_rollout, rest)
    chosen = budget.choose(step=3)  # not an exploration step
    assert budget.decision["n_explore"] == 0
    assert chosen == oracle_choice(rewards, per_rollout, rest)
    assert budget.decision["n_generation_per_rollout_s"] == pytest.approx(per_rollout)


def test_controller_choices_move_the_expected_way():
    half = torch.tensor([[1.0, 0.0] * 8] * 16)
    solved = torch.tensor([[1.0] * 16] * 16)
    assert fed_controller(half, 1e-4, 0.1).choose(3) <= 8  # mixed groups: little to gain from many samples
    cheap, dear = fed_controller(solved, 1e-5, 0.1).choose(3), fed_controller(solved, 1e-3, 0.1).choose(3)
    assert cheap > dear


def test_controller_explores_and_restores():
    budget = RolloutBudget(4, 16, 64, 16)
    assert budget.choose(1) == 16 and budget.decision == {"n": 16, "n_explore": 0}
    budget.observe(torch.ones(16, 16), 0.1, 0.2)
    second = budget.choose(2)  # one size seen so far: try another so the cost fit has two
    assert second != 16 and budget.decision["n_explore"] == 1
    budget.observe(torch.ones(16, second), 0.15, 0.2)
    state = json.loads(json.dumps(budget.state_dict()))  # the checkpoint stores it as JSON
    again = RolloutBudget(4, 16, 64, 16)
    again.load_state_dict(state)
    assert again.choose(3) == budget.choose(3) and again.decision == budget.decision


@pytest.mark.parametrize("n_max", [8, 12, 16, 64])
@pytest.mark.parametrize("seconds", [1e-3, 0.05, 5.0])
@pytest.mark.parametrize("correct", [4, 8])
def test_second_step_always_tries_a_size_not_seen(n_max, seconds, correct):
    """Whatever the best size after one step, the next step's size differs from the one the cost
    fit has seen (exploring two grid steps from the best could land on it again, forever)."""
    budget = RolloutBudget(4, 8, n_max, 16)
    budget.choose(1)
    budget.observe(torch.tensor([[1.0] * correct + [0.0] * (8 - correct)] * 16), seconds, 0.1)
    assert budget.choose(2) != 8 and budget.decision["n_explore"] == 1


def test_config_checks_adaptive_n():
    validate(Config(adaptive_n=True))
    with pytest.raises(ValueError, match="adaptive_n"):
        validate(Config(adaptive_n=True, method="grpo"))
    with pytest.raises(ValueError, match="num_generations_max"):
        validate(Config(adaptive_n=True, num_generations=32, num_generations_max=16))


@pytest.mark.slow
def test_training_with_adaptive_n_logs_its_decisions(tmp_path):
    cfg = Config(adaptive_n=True, prompts_per_step=4, num_generations_max=16, max_steps=5, eval_steps=0,
                 eval_prompts=8, eval_samples=1, save_steps=0, progress=False, output_dir=str(tmp_path))
    train(cfg)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert steps[0]["n"] == 16 and all(r["n"] in candidate_sizes(4, 16) for r in steps)
    assert all("n_informative" in r and 0 <= r["n_informative"] <= 1 for r in steps[1:])
    assert steps[1]["n"] != 16  # the second step explores another size
    parts = torch.load(next((tmp_path / "checkpoints").glob("step_*/parts.pt")), weights_only=True)
    assert len(parts[0]["group_size"]["costs"]) == 5


@pytest.mark.slow
def test_training_with_adaptive_n_and_early_stop(tmp_path):
    """Both on: early stop skips rollouts of the sizes adaptive_n picks; the cost fit regresses
    seconds on the requested P x n, so its slope includes early stop's saving."""
    cfg = Config(adaptive_n=True, group_early_stop=True, generation_engine="slots", generation_schedule="round_robin",
                 generation_micro_group=32, correct_weight=1.0, format_weight=0.0, prompts_per_step=8,
                 num_generations=8, num_generations_max=16, max_steps=4, eval_steps=0, eval_prompts=8,
                 eval_samples=1, save_steps=0, progress=False, output_dir=str(tmp_path))
    train(cfg)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(steps) == 4
    generated = [r["rollouts_generated"] for r in steps]
    requested = [8 * r["n"] for r in steps]
    assert sum(generated) < sum(requested)  # at 59% accuracy some groups saturate
    assert all(r["n"] in candidate_sizes(4, 16) for r in steps) and len({r["n"] for r in steps}) > 1

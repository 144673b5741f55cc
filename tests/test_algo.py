"""Advantages and loss: hand-computed values, edge cases, gradients, accumulation."""

import math

import pytest
import torch

from podsrl.algorithms import group_advantages, policy_loss
from podsrl.algorithms.loss import LOSSES
from podsrl.models import logprobs
from podsrl.rollout import Sampling


def test_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.2, 0.2, 0.2]])
    adv = group_advantages(rewards, eps=0.0)
    std0 = math.sqrt(4 * 0.25 / 3)  # sample std of [1,0,0,1]
    assert adv[0].tolist() == pytest.approx([0.5 / std0, -0.5 / std0, -0.5 / std0, 0.5 / std0])
    mean1 = 1.6 / 4
    std1 = math.sqrt(((0.6) ** 2 + 3 * 0.2 ** 2) / 3)
    assert adv[1].tolist() == pytest.approx([(1 - mean1) / std1] + [(0.2 - mean1) / std1] * 3, rel=1e-5)
    centred = group_advantages(rewards, scale_by_std=False)
    assert centred[0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_advantage_denominator_adds_1e_4_to_the_std():
    # a group with a tiny spread: the 1e-4 dominates the std (7.07e-6) and bounds the advantage
    rewards = torch.tensor([[0.0, 1e-5], [0.0, 1.0]], dtype=torch.float64)
    adv = group_advantages(rewards)
    tiny_std, unit_std = math.sqrt(2) * 0.5e-5, math.sqrt(2) * 0.5  # sample std of two values
    assert adv[0].tolist() == pytest.approx([-0.5e-5 / (tiny_std + 1e-4), 0.5e-5 / (tiny_std + 1e-4)], rel=1e-9)
    assert adv[1].tolist() == pytest.approx([-0.5 / (unit_std + 1e-4), 0.5 / (unit_std + 1e-4)], rel=1e-9)


def test_zero_variance_groups_get_zero_not_nan():
    rewards = torch.tensor([[0.3, 0.3, 0.3], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    for scale in (True, False):
        adv = group_advantages(rewards, scale_by_std=scale)
        assert torch.equal(adv, torch.zeros(3, 3))
    single = group_advantages(torch.tensor([[0.5], [1.0]]))  # m == 1
    assert torch.equal(single, torch.zeros(2, 1))


def test_advantages_sum_to_zero_per_group():
    rewards = torch.rand(50, 8, generator=torch.Generator().manual_seed(0))
    adv = group_advantages(rewards)
    assert torch.allclose(adv.sum(1), torch.zeros(50), atol=1e-5)


def test_loss_with_ratio_one_is_reinforce_with_baseline():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = policy_loss(logp, logp, adv, mask)
    # ratio 1 everywhere: per token -A; sequence means: -2 and +1; mean over sequences: -0.5
    assert float(loss) == pytest.approx(-0.5)
    assert stats["clip_fraction"] == 0
    token_loss, _ = policy_loss(logp, logp, adv, mask, loss_type="dapo")
    assert float(token_loss) == pytest.approx((2 * -2.0 + 3 * 1.0) / 5)


@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (0.1, 0.3)])
def test_clipping_hand_computed(eps_low, eps_high):
    """Ratios 1.5 and 0.5 against the range [1 - eps_low, 1 + eps_high]: with A = +1 the
    objective per token is min(r, clip(r)): the upper bound binds for 1.5 and nothing for
    0.5; with A = -1 it is min(-r, -clip(r)): the lower bound binds for 0.5."""
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    mask = torch.ones(1, 2)
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, epsilon=eps_low, epsilon_high=eps_high)
    assert float(loss) == pytest.approx(-((1 + eps_high) + 0.5) / 2)
    assert stats["clip_fraction"] == pytest.approx(1.0)  # both tokens differ from their clipped value
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask, epsilon=eps_low, epsilon_high=eps_high)
    assert float(loss) == pytest.approx((1.5 + (1 - eps_low)) / 2)


def ppo_oracle(logp, old, adv, mask, eps_low, eps_high, loss_type):
    """The clipped objective token by token in plain Python."""
    per_sequence, total, tokens, clipped = [], 0.0, 0, 0
    for b in range(logp.shape[0]):
        terms = []
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            ratio = math.exp(float(logp[b, t]) - float(old[b, t]))
            a = float(adv[b])
            bounded = min(max(ratio, 1 - eps_low), 1 + eps_high)
            terms.append(-min(ratio * a, bounded * a))
            clipped += ratio * a != bounded * a
        per_sequence.append(sum(terms) / max(1, len(terms)))
        total, tokens = total + sum(terms), tokens + len(terms)
    loss = sum(per_sequence) / len(per_sequence) if loss_type == "grpo" else total / tokens
    return loss, clipped / tokens


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_clipped_loss_matches_a_token_by_token_oracle(loss_type):
    generator = torch.Generator().manual_seed(5)
    for trial in range(20):
        logp = -torch.rand(6, 7, generator=generator, dtype=torch.float64)
        old = logp + 0.4 * torch.randn(6, 7, generator=generator, dtype=torch.float64)  # ratios ~0.5-2
        adv = torch.randn(6, generator=generator, dtype=torch.float64)
        mask = (torch.rand(6, 7, generator=generator) > 0.3).double()
        mask[:, 0] = 1
        eps_low, eps_high = 0.05 + 0.3 * float(torch.rand(1, generator=generator)), 0.05 + 0.5 * trial / 20
        loss, stats = policy_loss(logp, old, adv, mask, epsilon=eps_low, epsilon_high=eps_high,
                                  loss_type=loss_type)
        expected_loss, expected_clipped = ppo_oracle(logp, old, adv, mask, eps_low, eps_high, loss_type)
        assert float(loss) == pytest.approx(expected_loss, rel=1e-12, abs=1e-12)
        assert stats["clip_fraction"] == pytest.approx(expected_clipped, abs=1e-12)
        assert 0 < expected_clipped < 1


def test_k3_kl_term():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    mask = torch.ones(1, 2)
    loss, stats = policy_loss(logp, logp.detach(), torch.tensor([0.0]), mask, ref_logp=ref, beta=0.5)
    q = math.log(0.5)  # ref - logp on the first token; 0 on the second
    k3 = math.exp(q) - q - 1
    assert stats["kl"] == pytest.approx(k3 / 2)
    assert float(loss) == pytest.approx(0.5 * k3 / 2)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, logp, torch.tensor([0.0]), mask, beta=0.1)


def test_gradient_matches_finite_differences():
    torch.manual_seed(0)
    logp = (-torch.rand(3, 4, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(3, 4, dtype=torch.float64)
    ref = logp.detach() + 0.1 * torch.randn(3, 4, dtype=torch.float64)
    adv = torch.randn(3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    for loss_type in ("grpo", "dapo"):
        def fn(x):
            return policy_loss(x, old, adv, mask, ref_logp=ref, beta=0.3, epsilon=0.5,
                               epsilon_high=0.5, loss_type=loss_type)[0]
        assert torch.autograd.gradcheck(fn, (logp,))


def test_reinforce_gradient_is_minus_advantage_over_length():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0, -2.0]), mask)
    loss.backward()
    expected = torch.tensor([[-1 / 2 / 2, -1 / 2 / 2, 0.0], [2 / 3 / 2] * 3])
    assert torch.allclose(logp.grad, expected)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_micro_batch_losses_add_up_to_full_batch(loss_type):
    generator = torch.Generator().manual_seed(1)
    logp = -torch.rand(8, 5, generator=generator)
    old = logp + 0.05 * torch.randn(8, 5, generator=generator)
    adv = torch.randn(8, generator=generator)
    mask = (torch.rand(8, 5, generator=generator) > 0.3).float()
    mask[:, 0] = 1
    full, _ = policy_loss(logp, old, adv, mask, loss_type=loss_type)
    parts = sum(policy_loss(logp[i:i + 3], old[i:i + 3], adv[i:i + 3], mask[i:i + 3], loss_type=loss_type,
                            num_sequences=8, num_tokens=float(mask.sum()))[0] for i in range(0, 8, 3))
    assert float(parts) == pytest.approx(float(full), rel=1e-6)


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_logprobs_equal_full_rows_with_gradients(random_model_dir, lora):
    """Brute-force oracle: every row run in full. Groups of unequal size (a micro-batch may
    cut a group), prompts of unequal length (left padding), completions of unequal length."""
    from podsrl.models import load_model
    from podsrl.rollout import generate
    from podsrl.update import flatten_for_update, micro_batches

    bundle = load_model(random_model_dir, lora_rank=4 if lora else 0)
    torch.manual_seed(0)
    rollouts = generate(bundle.model, bundle.tokenizer, ["What is 1 + 2?", "7", "What is 10 - 3 + 4?"], 3,
                        Sampling(max_completion_length=6, temperature=1.0))
    rollouts.completion_mask[0, 1, 3:] = 0  # a shorter completion
    batch = flatten_for_update(rollouts, torch.zeros(3, 3))
    part = next(micro_batches(batch.rows(1, 8), 7))  # rows 1-7: groups of 2, 3, 2
    lc = part.completion_mask.shape[1]
    model = bundle.model
    results = []
    for fn in (logprobs.token_logprobs, logprobs.shared_prompt_token_logprobs):
        model.zero_grad()
        logp = fn(model, part.input_ids, part.attention_mask, lc)  # [7, lc]
        weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)
        (logp * weights * part.completion_mask).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        results.append((logp.detach() * part.completion_mask, grads))
    (full, full_grads), (shared, shared_grads) = results
    assert torch.allclose(shared, full, atol=1e-5)
    assert all(torch.allclose(s, f, atol=1e-5, rtol=1e-4) for s, f in zip(shared_grads, full_grads))
    assert any(float(g.abs().max()) > 0 for g in full_grads)


def test_a_loss_type_is_named_as_loss_types_are_and_an_unknown_one_is_refused():
    """LOSSES is the one table of loss types; policy_loss takes a name from it or the function,
    and the names before LOSSES ('sequence', 'token') are gone (never published)."""
    generator = torch.Generator().manual_seed(3)
    logp, mask = -torch.rand(4, 5, generator=generator), (torch.rand(4, 5, generator=generator) > 0.3).float()
    adv = torch.randn(4, generator=generator)
    for name in ("grpo", "dapo"):
        assert float(policy_loss(logp, logp, adv, mask, loss_type=name)[0]) == float(
            policy_loss(logp, logp, adv, mask, loss_type=LOSSES[name])[0])
    for name in ("mean", "sequence", "token"):
        with pytest.raises(ValueError, match=f"loss_type: unknown loss type '{name}'"):
            policy_loss(logp, logp, adv, mask, loss_type=name)

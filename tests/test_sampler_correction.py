"""What an engine that samples with its own numerics (vllm) adds to the pipeline, tested
without vLLM: TRL's importance-sampling correction against a per-token oracle, the update
with the engine's log-probs, their path from Rollouts to the update, and the weights an
engine is fed (LoRA merged out of place)."""

import copy
import math

import pytest
import torch

from podsrl.algorithms.importance import (
    SAMPLER_CORRECTION_MODES,
    SamplerCorrection,
    sampler_importance_weights,
    sampler_logp_difference,
)
from podsrl.algorithms.loss import policy_loss
from podsrl.models import load_model
from podsrl.rollout.weights import inference_weights, weights_version
from podsrl.types import Rollouts
from podsrl.update import OptimizerOptions, UpdateOptions, flatten_for_update, make_optimizer, update_policy


def oracle_weights(policy, sampling, mask, mode, low, high):
    """TRL 1.16's rule, one row and one token at a time (grpo_trainer.py, importance sampling)."""
    rows, cols = policy.shape
    out = []
    for b in range(rows):
        diffs = [(policy[b, t] - sampling[b, t]) * mask[b, t] for t in range(cols)]
        ratios = [math.exp(sum(diffs))] if mode.startswith("sequence") else [math.exp(d) for d in diffs]
        if mode.endswith("truncate"):
            ratios = [min(max(r, low), high) for r in ratios]
        else:
            ratios = [0.0 if r < low or r > high else r for r in ratios]
        out.append(ratios)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("mode", SAMPLER_CORRECTION_MODES)
def test_importance_weights_match_trls_rule_token_by_token(mode):
    generator = torch.Generator().manual_seed(3)
    hits = {"below": 0, "inside": 0, "above": 0}
    for _ in range(30):
        policy = -torch.rand(5, 6, generator=generator, dtype=torch.float64) * 3
        sampling = policy + 0.6 * torch.randn(5, 6, generator=generator, dtype=torch.float64)
        mask = (torch.rand(5, 6, generator=generator) > 0.3).double()
        low, high = 0.5 * float(torch.rand(1, generator=generator)), 1.2 + float(torch.rand(1, generator=generator))
        got = sampler_importance_weights(policy, sampling, mask, SamplerCorrection(mode, low, high))
        expected = oracle_weights(policy, sampling, mask, mode, low, high)
        assert got.shape == expected.shape == ((5, 1) if mode.startswith("sequence") else (5, 6))
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
        raw = oracle_weights(policy, sampling, mask, mode, 0.0, math.inf)
        hits["below"] += int((raw < low).sum())
        hits["above"] += int((raw > high).sum())
        hits["inside"] += int(((raw >= low) & (raw <= high)).sum())
    assert all(hits.values()), hits  # the bounds were exercised on both sides


def test_identical_log_probs_weigh_one_and_nan_counts_as_one():
    policy = -torch.rand(3, 4)
    mask = torch.ones(3, 4)
    for mode in SAMPLER_CORRECTION_MODES:
        assert torch.allclose(sampler_importance_weights(policy, policy, mask, SamplerCorrection(mode)),
                              torch.tensor(1.0))
    sampling = policy.clone()
    sampling[0, 1] = float("nan")
    weights = sampler_importance_weights(policy, sampling, mask, SamplerCorrection("token_truncate"))
    assert torch.equal(weights, torch.ones(3, 4))
    total, tokens, largest = sampler_logp_difference(policy, policy + 0.25, mask)
    assert total == pytest.approx(0.25 * 12) and tokens == 12 and largest == pytest.approx(0.25)


def test_the_weights_multiply_the_policy_term_before_the_kl_term():
    generator = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=generator, dtype=torch.float64)
    ref = logp + 0.1 * torch.randn(4, 5, generator=generator, dtype=torch.float64)
    adv = torch.randn(4, generator=generator, dtype=torch.float64)
    mask = torch.ones(4, 5, dtype=torch.float64)
    weights = torch.rand(4, 5, generator=generator, dtype=torch.float64) + 0.5
    weighted, _ = policy_loss(logp, logp, adv, mask, ref_logp=ref, beta=0.3, sampler_weights=weights)
    q = ref - logp
    kl = torch.exp(q) - q - 1
    expected = ((-adv.unsqueeze(1) * weights + 0.3 * kl) * mask).sum(1).div(5).mean()
    assert float(weighted) == pytest.approx(float(expected), rel=1e-12)


def rollouts_with_sampling_logp(tokenizer, prompts, n, seed):
    generator = torch.Generator().manual_seed(seed)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids = torch.randint(3, 100, (len(prompts), n, 5), generator=generator)
    mask = torch.ones(len(prompts), n, 5, dtype=torch.long)
    logp = -torch.rand(len(prompts), n, 5, generator=generator)
    return Rollouts(enc["input_ids"], enc["attention_mask"], ids, mask, [["x"] * n for _ in prompts],
                    stats={"generated_tokens": int(mask.sum()), "decode_steps": 4}, sampling_logp=logp)


def test_sampling_log_probs_follow_their_rows_through_selection_and_flattening(tiny):
    rollouts = rollouts_with_sampling_logp(tiny.tokenizer, ["What is 1 + 2?", "What is 30 - 4?"], 4, seed=1)
    keep = torch.tensor([[3, 0], [1, 2]])
    kept = rollouts.kept(keep)
    assert torch.equal(kept.sampling_logp, torch.stack([rollouts.sampling_logp[p, keep[p]] for p in range(2)]))
    batch = flatten_for_update(kept, torch.zeros(2, 2))
    assert torch.equal(batch.sampling_logp, kept.sampling_logp.reshape(4, 5))
    both = Rollouts.concat([rollouts.at_prompts([1]), rollouts.at_prompts([0])], tiny.tokenizer.pad_token_id)
    assert torch.equal(both.sampling_logp, rollouts.sampling_logp[[1, 0]])
    assert batch.rows(1, 3).trimmed().sampling_logp.shape == (2, 5)


def one_update(model, batch, correction):
    optimizer, scheduler = make_optimizer([p for p in model.parameters() if p.requires_grad],
                                          OptimizerOptions(optim="sgd", learning_rate=0.1, weight_decay=0.0,
                                                           warmup_steps=0))
    options = UpdateOptions(micro_batch_size=3, max_grad_norm=0.0)
    return update_policy(model, optimizer, scheduler, batch, options, correction=correction)


def test_the_update_logs_the_engines_gap_and_corrects_for_it(tiny):
    """With the policy's own log-probs as the engine's the update is the uncorrected one and
    logs a zero gap; with an engine whose log-probs are off by 0.3 per token the gap is 0.3,
    and sequence_mask (ratio e^(0.3 x tokens) > 3) masks every sequence: nothing moves."""
    from podsrl.models.logprobs import token_logprobs

    model = copy.deepcopy(tiny.model).train()
    rollouts = rollouts_with_sampling_logp(tiny.tokenizer, ["What is 1 + 2?", "What is 30 - 4?"], 3, seed=2)
    batch = flatten_for_update(rollouts, torch.tensor([[1.0, -0.5, 0.5], [0.5, 1.0, -1.0]]))
    with torch.no_grad():
        own = token_logprobs(model, batch.input_ids, batch.attention_mask, 5)
    plain = one_update(copy.deepcopy(model), _without_sampling(batch), None)
    assert plain.loss == pytest.approx(-1.5 / 6, abs=1e-6)  # REINFORCE: minus the mean advantage
    assert "sampling_logp_difference_mean" not in plain.as_record()  # a run without such an engine logs nothing new
    batch.sampling_logp = own.clone()
    same = one_update(copy.deepcopy(model), batch, SamplerCorrection("token_truncate"))
    assert same.loss == pytest.approx(plain.loss, abs=1e-6)
    # the update shares each prompt's forward pass: its log-probs match token_logprobs' to ~1e-5
    assert same.sampling_logp_difference_mean < 1e-5
    assert same.importance_sampling_weight_mean == pytest.approx(1.0, abs=1e-4)
    batch.sampling_logp = own - 0.3
    moved = copy.deepcopy(model)
    masked = one_update(moved, batch, SamplerCorrection("sequence_mask", 0.0, 3.0))
    assert masked.sampling_logp_difference_mean == pytest.approx(0.3, abs=1e-4)
    assert masked.importance_sampling_weight_mean == 0.0 and masked.loss == 0.0
    assert all(torch.equal(a, b) for a, b in zip(moved.parameters(), model.parameters()))
    uncorrected = one_update(copy.deepcopy(model), batch, None)
    assert uncorrected.loss == pytest.approx(plain.loss, abs=1e-6)
    assert uncorrected.importance_sampling_weight_mean == 1.0


def _without_sampling(batch):
    return type(batch)(batch.input_ids, batch.attention_mask, batch.completion_mask, batch.advantages)


@pytest.mark.parametrize("targets", [(), ("q_proj", "v_proj")])
def test_inference_weights_are_the_merged_model_and_leave_the_policy_alone(targets):
    bundle = load_model("tiny", lora_rank=4, lora_alpha=8, lora_target_modules=targets)
    with torch.no_grad():
        for name, p in bundle.model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # peft starts B at 0: make the adapter change something
    before = {name: p.clone() for name, p in bundle.model.named_parameters()}
    pushed = dict(inference_weights(bundle.model))
    merged = dict(copy.deepcopy(bundle.model).merge_and_unload().named_parameters())
    assert pushed.keys() == merged.keys()
    assert all(torch.allclose(pushed[k], merged[k], atol=1e-6) for k in merged)
    base_of = {k: f"base_model.model.{k.removesuffix('.weight')}.base_layer.weight" for k in merged}
    changed = [k for k, base in base_of.items() if base in before and not torch.equal(pushed[k], before[base])]
    # the LoRA layers' weights, merged
    assert changed and all(any(t in k for t in targets or ("proj",)) for k in changed)
    assert all(torch.equal(p, before[name]) for name, p in bundle.model.named_parameters())
    plain = load_model("tiny").model
    assert dict(inference_weights(plain)).keys() == dict(plain.named_parameters()).keys()


def test_the_weights_version_changes_with_every_in_place_update():
    model = load_model("tiny").model
    version = weights_version(model)
    assert weights_version(model) == version
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.tensor([[3, 4, 5]])).logits.sum().backward()
    optimizer.step()
    stepped = weights_version(model)
    assert stepped != version
    model.load_state_dict(model.state_dict())  # a checkpoint restore copies in place
    assert weights_version(model) != stepped

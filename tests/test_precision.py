"""Mixed precision (bf16 autocast over float32 master weights) and activation checkpointing
in the update, on the CPU with the tiny random model."""

import copy

import pytest
import torch

from podsrl.metrics import read_metrics
from podsrl.models import load_model
from podsrl.models.precision import autocast
from podsrl.rollout import Sampling, generate
from podsrl.trainer import train
from podsrl.trainer.config import make_config
from podsrl.update import UpdateOptions, flatten_for_update, update_policy
from tests.conftest import quick as conftest_quick

OPTIONS = UpdateOptions(max_grad_norm=0, loss_type="dapo")


def small_batch(bundle):
    torch.manual_seed(0)
    rollouts = generate(bundle.model, bundle.tokenizer, ["What is 1 + 2?", "7", "What is 10 - 3 + 4?"], 4,
                        Sampling(max_completion_length=6, temperature=1.0))
    return flatten_for_update(rollouts, torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))


def sgd_change(model, batch, lr, options=OPTIONS, precision=""):
    """Parameter change of one plain SGD step (weights as float64 for comparison)."""
    model.train()  # as in a run (transformers checkpoints only modules in training mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    before = {k: v.detach().double().clone() for k, v in model.named_parameters()}
    with autocast("cpu", precision):
        update_policy(model, optimizer, scheduler, batch, options)
    return {k: v.detach().double() - before[k] for k, v in model.named_parameters()}


def flat(change):
    return torch.cat([v.flatten() for v in change.values()])


def test_bf16_mixed_precision_keeps_updates_that_bf16_weights_lose(random_model_dir):
    bundle = load_model(random_model_dir)
    batch = small_batch(bundle)
    full = flat(sgd_change(copy.deepcopy(bundle.model), batch, lr=1e-6))
    mixed_model = copy.deepcopy(bundle.model)
    mixed = flat(sgd_change(mixed_model, batch, lr=1e-6, precision="bfloat16"))
    pure = flat(sgd_change(copy.deepcopy(bundle.model).to(torch.bfloat16), batch, lr=1e-6))
    assert all(p.dtype == torch.float32 for p in mixed_model.parameters())  # master weights stay float32
    assert not torch.equal(mixed, full)  # the forward really ran in bfloat16 ...
    cosine = torch.nn.functional.cosine_similarity(mixed, full, dim=0)
    assert cosine > 0.95, cosine  # ... and the float32 weights took the same step
    moved = full != 0  # (embedding rows of tokens not in the batch get no gradient)
    assert moved.sum() > 1000
    assert (mixed[moved] != 0).float().mean() > 0.9
    assert (pure[moved] != 0).float().mean() < 0.05  # in bfloat16 weights a 1e-6-scale step rounds away
    # (all but weights within ~1e-6 x 2^8 of zero)


@pytest.mark.parametrize("share_prompt", [True, False])
def test_activation_checkpointing_gives_the_same_update(random_model_dir, share_prompt):
    bundle = load_model(random_model_dir)
    batch = small_batch(bundle)
    options = UpdateOptions(max_grad_norm=0, loss_type="dapo", share_prompt_in_update=share_prompt)
    plain = flat(sgd_change(copy.deepcopy(bundle.model), batch, lr=1.0, options=options))
    model = copy.deepcopy(bundle.model)
    options = UpdateOptions(max_grad_norm=0, loss_type="dapo", share_prompt_in_update=share_prompt,
                            gradient_checkpointing=True)
    calls = []  # the MLP runs inside the checkpointed layer: twice per micro-batch when recomputed
    mlp = model.model.layers[0].mlp
    mlp.forward = lambda *args, _forward=mlp.forward, **kwargs: calls.append(1) or _forward(*args, **kwargs)
    checkpointed = flat(sgd_change(model, batch, lr=1.0, options=options))
    assert len(calls) == 2  # one micro-batch: forward + recompute in backward
    torch.testing.assert_close(checkpointed, plain, rtol=1e-4, atol=1e-6)
    assert not model.is_gradient_checkpointing  # off again: generation keeps its KV cache


def quick(model_dir, output_dir, **overrides):
    """conftest's two-step run, without checkpoints."""
    return conftest_quick(model_dir, output_dir, **{"save_steps": 0, **overrides})


def test_a_bf16_run_with_checkpointing_trains_float32_weights(random_model_dir, tmp_path):
    result = train(quick(random_model_dir, tmp_path / "run", bf16=True, gradient_checkpointing=True))
    records = read_metrics(result.run_dir / "metrics.jsonl")[1:]
    assert all(r["grad_norm"] > 0 and r["skipped_step"] == 0 for r in records)
    from safetensors.torch import load_file

    saved = load_file(str(result.run_dir / "model" / "model.safetensors"))
    assert {v.dtype for v in saved.values()} == {torch.float32}


@pytest.mark.parametrize("overrides, message", [
    (dict(fp16=True), "fp16: float16 mixed precision is not supported yet"),
    (dict(bf16=True, dtype="bfloat16"), "bf16: mixed precision keeps float32 master weights"),
])
def test_precision_settings_that_cannot_work_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(overrides=overrides)

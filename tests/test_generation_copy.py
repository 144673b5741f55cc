"""The hf engine's generation copy (generation_dtype): a plain model with LoRA merged that
samples what the policy samples, follows every update, leaves the policy and the RNG streams
alone, and with a static cache compiles its decode step once, not at every step."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import CompileConfig

from podsrl.models import load_model
from podsrl.rollout import GenerationCopy, HFEngine, HFOptions, Sampling
from podsrl.trainer import train
from podsrl.trainer.config import make_config
from tests.conftest import quick

PROMPTS = ["1+2=", "13+22=", "7-3=", "100+5="]


def lora_policy(rank: int = 4):
    bundle = load_model("tiny", lora_rank=rank, lora_alpha=2 * rank)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in bundle.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)  # peft starts B at 0: make the adapter change something
    return bundle.model, bundle.tokenizer


def nudge(model) -> None:
    """An optimizer step's worth of change to every trainable parameter, in place."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))


def last_logits(model, tokenizer) -> torch.Tensor:
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        return model(**enc).logits[:, -1].float()  # [P, V]


def test_float32_copy_samples_what_the_lora_policy_samples_and_follows_updates():
    policy, tokenizer = lora_policy()
    engine, plain = HFEngine(HFOptions(max_completion_length=6, copy_dtype="float32")), HFEngine(HFOptions(
        max_completion_length=6))
    for step in range(3):
        torch.manual_seed(step)
        ours = engine(policy, tokenizer, PROMPTS, 4)
        torch.manual_seed(step)
        theirs = plain(policy, tokenizer, PROMPTS, 4)
        assert torch.equal(ours.completion_ids, theirs.completion_ids), f"step {step}"
        assert torch.allclose(last_logits(engine.copy.model, tokenizer), last_logits(policy, tokenizer), atol=1e-4)
        nudge(policy)
    greedy = engine.generate(policy, tokenizer, PROMPTS, 1, Sampling(max_completion_length=6,
                                                                     temperature=0.0))  # evaluation's path
    assert torch.equal(greedy.completion_ids, plain.generate(policy, tokenizer, PROMPTS, 1,
                                                             Sampling(max_completion_length=6,
                                                                      temperature=0.0)).completion_ids)


def test_copy_refreshes_only_when_the_policy_changed_and_never_touches_it():
    policy, _ = lora_policy()
    before = {name: p.clone() for name, p in policy.named_parameters()}
    copy = GenerationCopy("bfloat16")
    model = copy(policy)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not hasattr(model, "peft_config") and not any("lora" in name for name, _ in model.named_parameters())
    tensors = {name: p.data_ptr() for name, p in model.named_parameters()}
    first = copy.step_record()["weight_sync_seconds"]
    assert first > 0
    assert copy(policy) is model and copy.step_record()["weight_sync_seconds"] == 0.0  # nothing changed
    nudge(policy)
    copy(policy)
    assert copy.step_record()["weight_sync_seconds"] > 0
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == tensors  # refreshed in place
    policy_now = dict(policy.named_parameters())
    unchanged = [name for name, p in before.items() if "lora" not in name]
    assert unchanged and all(torch.equal(before[name], policy_now[name]) for name in unchanged)


def test_building_the_copy_draws_nothing_from_the_trainers_rng():
    policy, _ = lora_policy()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    GenerationCopy("float32")(policy)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.slow
def test_static_cache_compiles_the_decode_step_once_not_every_step():
    """On the CPU with dynamo's eager backend: the guards that decide recompiles are the same
    as on a GPU (shapes, the cache, the parameters refreshed in place)."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    policy, tokenizer = lora_policy()
    compile_config = CompileConfig(backend="eager")
    compile_config._compile_all_devices = True  # transformers compiles on GPUs only unless told
    engine = HFEngine(HFOptions(max_completion_length=6, copy_dtype="float32", static_cache=True,
                                        compile_config=compile_config))
    plain = HFEngine(HFOptions(max_completion_length=6))
    graphs = []
    for step in range(4):
        prompts = [prompt + "9" * step for prompt in PROMPTS]  # each step's prompts are longer than the last's
        torch.manual_seed(step)
        ours = engine(policy, tokenizer, prompts, 4)
        torch.manual_seed(step)
        theirs = plain(policy, tokenizer, prompts, 4)
        assert torch.equal(ours.completion_ids, theirs.completion_ids)
        assert torch.equal(ours.prompt_ids, theirs.prompt_ids)  # the static cache's extra padding is trimmed
        engine.generate(policy, tokenizer, PROMPTS[:3], 1, Sampling(max_completion_length=6,
                                                                    temperature=0.0))  # an evaluation
        nudge(policy)
        graphs.append(dynamo_utils.counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1, "the decode step was not compiled: the test would prove nothing"
    assert graphs[1:] == [graphs[0]] * 3, f"recompiled after the first step: graphs per step {graphs}"


@pytest.mark.parametrize("overrides, message", [
    (dict(generation_dtype="float16"), "generation_dtype: expected"),
    (dict(generation_dtype="bfloat16", generation_engine="slots"), "generation_dtype: the generation copy is the hf"),
    (dict(generation_static_cache="true"), "generation_static_cache: needs a generation copy"),
    (dict(generation_static_cache="true", generation_dtype="auto"), "generation_static_cache: needs a generation copy"),
])
def test_config_refuses_what_the_copy_cannot_do(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(overrides={k: str(v) for k, v in overrides.items()})


@pytest.mark.parametrize("overrides, expected", [
    ({}, ""),  # float32: generating from the policy keeps samples exact (the main job)
    ({"bf16": "true"}, "bfloat16"),
    ({"dtype": "bfloat16"}, "bfloat16"),
    ({"bf16": "true", "generation_engine": "slots"}, ""),  # the copy is the hf engine's
    ({"bf16": "true", "generation_dtype": ""}, ""),
    ({"generation_dtype": "float32"}, "float32"),
])
def test_auto_makes_a_bfloat16_copy_where_the_forward_passes_run_in_bfloat16(overrides, expected):
    options = make_config(overrides=overrides).generation_options()
    assert (options.copy() if hasattr(options, "copy") else "") == expected


def test_fsdp_makes_no_copy_and_refuses_one_asked_for():
    assert make_config(overrides={"bf16": "true"}).generation_options(sharded=True).copy() == ""
    with pytest.raises(ValueError, match="^generation_dtype: the generation copy is not supported with FSDP"):
        make_config(overrides={"generation_dtype": "float32"}).generation_options(sharded=True).check()


@pytest.mark.parametrize("overrides, copied", [(dict(generation_dtype="float32", lora_rank=4), True),
                                               (dict(bf16=True), True), ({}, False)])
def test_a_run_with_the_copy_trains_and_records_its_refresh_time(random_model_dir, tmp_path, overrides, copied):
    result = train(quick(random_model_dir, tmp_path / "run", **overrides))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "weight_sync_seconds" in r]
    assert result.steps == 2
    if not copied:  # no copy, no new field: the main job's metrics keep their fields
        assert not steps
        return
    assert len(steps) == 2 and all(r["weight_sync_seconds"] >= 0 for r in steps)
    assert steps[0]["weight_sync_seconds"] > 0  # step 1 builds and fills the copy

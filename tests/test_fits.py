"""The bounds no constant gives (podsrl.trainer.fits): the train split's size, the model's width and
context, and the machine's memory, checked at set-up before anything is generated; each refusal
one line naming the field. The memory check against its own arithmetic, by brute force."""

import itertools
import os

import pytest
import torch

from podsrl.rollout.memory import generation_memory_bytes
from podsrl.trainer import train
from podsrl.trainer.config import Config
from podsrl.trainer.fits import available_bytes, check_fits
from tests.conftest import quick

GIB = 2**30


@pytest.fixture(scope="module")
def model_config(tiny):
    return tiny.model.config


def fits(cfg: Config, model_config, available: int = 64 * GIB, longest: int = 20, train_prompts: int = 10**6,
         world_size: int = 1) -> list[str]:
    return check_fits(cfg, cfg.generation_options(world_size), model_config, longest, train_prompts, world_size,
                      available)


def test_available_memory_is_a_positive_amount_this_machine_has():
    found = available_bytes(torch.device("cpu"))
    assert 0 < found <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.parametrize("engine, micro_group, batch_size, n, prompts, extra", [
    (engine, g, b, n, p, x) for engine, g, b, n, p, x in itertools.product(
        ["hf", "slots"], [0, 32], [0, 32], [4, 64], [4, 16], [0, 8])
    if not (engine == "hf" and (g or x)) and not (engine == "slots" and b)])
def test_a_run_is_refused_exactly_when_what_it_decodes_at_once_exceeds_the_memory(model_config, engine, micro_group,
                                                                                   batch_size, n, prompts, extra):
    """Brute force: the rows an engine call decodes at once (whole groups on hf, up to
    generation_batch_size; micro_group slots or every sample in flight on slots), at full length,
    against the available memory; the evaluation's eval_batch_size likewise."""
    cfg = Config(generation_engine=engine, generation_micro_group=micro_group, generation_batch_size=batch_size,
                 num_generations=n, num_kept=2, prompts_per_step=prompts, partial_rollouts=bool(extra),
                 partial_extra_prompts=extra or 2, eval_batch_size=64, eval_prompts=300, eval_samples=4)
    longest, seq_len = 20, 20 + cfg.max_completion_length
    samples = (prompts + extra) * n
    if engine == "slots":
        rows = micro_group if micro_group and micro_group < samples else samples
        need = generation_memory_bytes(model_config, rows, seq_len, prompts + extra, longest)  # prefills: prompts
    else:
        rows = min(samples, max(n, batch_size or samples))
        need = generation_memory_bytes(model_config, rows, seq_len)
    need = max(need, generation_memory_bytes(model_config, 64, seq_len))  # evaluation: eval_batch_size rows
    assert fits(cfg, model_config, available=need, longest=longest) == []
    with pytest.raises(ValueError) as refused:
        fits(cfg, model_config, available=need - 1, longest=longest)
    message = str(refused.value)
    assert "\n" not in message and "GiB available" in message
    assert "sequences of up to" in message or "prefills of up to" in message
    assert message.split(":")[0] in {"num_generations", "prompts_per_step", "partial_extra_prompts",
                                     "generation_micro_group", "generation_batch_size", "eval_batch_size"}


def test_the_refusal_names_the_setting_that_asks_too_much(model_config):
    small = 2 * GIB
    cases = {
        "partial_extra_prompts": dict(generation_engine="slots", partial_rollouts=True, partial_extra_prompts=900,
                                      num_generations=64),
        "num_generations": dict(num_generations=200_000),
        "max_completion_length": dict(max_completion_length=200_000),
        "generation_micro_group": dict(generation_engine="slots", generation_micro_group=2_000_000,
                                       num_generations=2000, prompts_per_step=2000),
        "eval_batch_size": dict(eval_batch_size=100_000, eval_prompts=100_000, eval_samples=64,
                                max_completion_length=4000),
    }
    for field, values in cases.items():
        with pytest.raises(ValueError, match=f"^{field}: "):
            fits(Config(**values), model_config, available=small)


def test_prompts_per_step_is_bounded_by_the_train_split_and_named_where_its_prefills_take_the_memory(model_config):
    """#80: 30,000 of 20,000 chain prompts ran a 21-minute step at 3 GB; at 100,000 the memory refusal
    blamed generation_micro_group's 16 slots, which the user had not set."""
    with pytest.raises(ValueError) as refused:
        fits(Config(prompts_per_step=30_000), model_config, train_prompts=20_000)
    assert str(refused.value) == ("prompts_per_step: 30000 prompts a step, and the train split has 20000 usable "
                                  "prompts; use at most 20000")
    assert fits(Config(prompts_per_step=20_000), model_config, train_prompts=20_000) == []
    slots = Config(generation_engine="slots", generation_micro_group=16, prompts_per_step=100_000,
                   max_completion_length=256)
    with pytest.raises(ValueError, match=r"^prompts_per_step: 100000 prompts' prefills of up to 20 tokens would "
                                         r"be stored at once beside 16 decoding sequences \(generation_micro_group "
                                         r"16\), an estimated .* GiB available; lower prompts_per_step$"):
        fits(slots, model_config, available=GIB // 4)


def test_no_memory_check_where_the_engine_sizes_its_own(model_config):
    """Under generation_memory_mb the engines decode what fits the cap, or refuse (their own check)."""
    assert fits(Config(num_generations=200_000, generation_memory_mb=64.0), model_config, available=GIB) == []


def test_groups_in_flight_beyond_the_train_split_are_refused():
    cfg = Config(generation_engine="slots", partial_rollouts=True, partial_extra_prompts=990)
    with pytest.raises(ValueError, match=r"^partial_extra_prompts: 990 groups in flight beyond this process's 16 "
                                         r"would need 1006 distinct train prompts at once; the train split has "
                                         r"1000 \(at most 984\)$"):
        check_fits(cfg, cfg.generation_options(), None, 20, 1000, 1, GIB)


def test_a_lora_rank_above_the_models_width_is_refused_and_a_context_overrun_warned(model_config):
    width = model_config.hidden_size
    assert fits(Config(lora_rank=width), model_config) == []
    with pytest.raises(ValueError, match=f"^lora_rank: {width + 1} exceeds the model's hidden size {width}"):
        fits(Config(lora_rank=width + 1), model_config)
    context = model_config.max_position_embeddings
    assert fits(Config(max_completion_length=context - 20), model_config) == []
    assert fits(Config(max_completion_length=context - 19), model_config) == [
        f"max_completion_length: the longest prompt (20 tokens) plus max_completion_length {context - 19} pass the "
        f"model's {context} positions (max_position_embeddings): positions beyond them were never trained"]


def test_train_refuses_before_generating_and_writes_no_run(random_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("podsrl.trainer.setup.available_bytes", lambda device: 1)  # as if no memory were left
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="^num_generations: .* more than the 0.0 GiB available"):
        train(quick(random_model_dir, out))
    assert not out.exists()

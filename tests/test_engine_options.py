"""Engines take their own options (#59 item 2): each engine's options class in its module, set
by a spec's arguments (``generation_engine: {name: slots, micro_group: 8}``) or by the flat
``generation_*`` / ``vllm_*`` names, each declared by the config field that spells it
(podsrl.options.flat_names), checked at validation before any model loads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from podsrl.config_checks import validate
from podsrl.options import flat_names
from podsrl.rollout import ENGINES, EngineOptions, HFOptions, SlotsOptions, VLLMOptions, options_class
from podsrl.trainer.config import FIELDS, Config, make_config
from podsrl.trainer.setup import set_up
from tests.conftest import quick

BUILT_IN_OPTIONS = (HFOptions, SlotsOptions, VLLMOptions)


def option_fields(options_type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(options_type)}


def test_each_flat_name_sets_an_option_of_a_built_in_engine_with_the_same_default():
    for flat, option in flat_names(Config, EngineOptions).items():
        owners = [kind for kind in BUILT_IN_OPTIONS if option in option_fields(kind)]
        assert owners, f"{flat} -> {option}: no engine has it"
        for kind in owners:
            assert option_fields(kind)[option].default == FIELDS[flat].default, (flat, kind.__name__)
            assert option not in kind.run_fields, (flat, kind.__name__)


def test_the_run_sets_sampling_and_the_spec_cannot():
    for kind in BUILT_IN_OPTIONS:
        assert {"max_completion_length", "temperature", "top_p"} <= kind.run_fields
        assert options_class(ENGINES[{"HFOptions": "hf", "SlotsOptions": "slots", "VLLMOptions": "vllm"}[
            kind.__name__]]) is kind
    cfg = Config(max_completion_length=17, temperature=0.7, top_p=0.9, generation_engine="slots")
    options = cfg.generation_options()
    assert (options.max_completion_length, options.temperature, options.top_p) == (17, 0.7, 0.9)


@pytest.mark.parametrize("spec, flat, expected", [
    ({"name": "slots", "micro_group": 8}, {"generation_micro_group": 4}, 8),  # the spec's argument wins
    ("slots", {"generation_micro_group": 4}, 4),  # the flat name, mapped
    ({"name": "slots", "schedule": "round_robin"}, {"generation_micro_group": 4}, 4),  # others keep the flat value
])
def test_a_specs_argument_sets_the_option_over_the_flat_name(spec, flat, expected):
    cfg = Config(generation_engine=spec, **flat)
    validate(cfg)
    assert cfg.generation_options().micro_group == expected


def test_trls_vllm_names_reach_the_vllm_options():
    # built without vLLM: the options are plain values (the engine itself needs vLLM)
    cfg = Config(generation_engine="vllm", vllm_gpu_memory_utilization=0.5, vllm_enforce_eager=True,
                 max_prompt_tokens=100, max_completion_length=28, bf16=True, seed=3)
    options = cfg.generation_options(processes=2)
    assert isinstance(options, VLLMOptions)
    assert (options.gpu_memory_utilization, options.enforce_eager, options.compute_dtype, options.seed,
            options.processes) == (0.5, True, "bfloat16", 3, 2)
    assert options.planned_length() == 128  # 0: max_prompt_tokens + max_completion_length
    spec = Config(generation_engine={"name": "vllm", "gpu_memory_utilization": 0.7}, vllm_gpu_memory_utilization=0.5)
    assert spec.generation_options().gpu_memory_utilization == 0.7


@pytest.mark.parametrize("spec, line", [
    ('{"name": "slots", "micro_group": -1}', "generation_engine: slots: argument micro_group = -1: must be >= 0"),
    ('{"name": "slots", "micro_group": 2.5}',
     "generation_engine: slots: argument micro_group: expected an integer like its default 0, got 2.5"),
    ('{"name": "slots", "micro_group": "8"}',
     "generation_engine: slots: argument micro_group: expected a number like its default 0, got '8' (YAML reads "
     "1e-6 as text: write 1.0e-6)"),
    ('{"name": "slots", "slots": 8}', "generation_engine: slots takes no argument 'slots' (it takes: decode_path, "
                                      "memory_mb, micro_group, probe_tokens, refill, schedule)"),
    ('{"name": "slots", "max_completion_length": 8}',
     "generation_engine: slots takes no argument 'max_completion_length' (it takes: "
                                               "decode_path, memory_mb, micro_group, probe_tokens, refill, schedule)"),
    ('{"name": "hf", "micro_group": 8}', "generation_engine: hf takes no argument 'micro_group' (it takes: "
                                         "copy_dtype, memory_mb, share_prefill, static_cache)"),
    ('{"name": "hf", "compute_dtype": "bfloat16"}', "generation_engine: hf takes no argument 'compute_dtype' (it "
                                                    "takes: copy_dtype, memory_mb, share_prefill, static_cache)"),
    ('{"name": "slots", "refill": "eager"}', "generation_refill: unknown 'eager'; use one of continuous, group"),
    ('{"name": "slots", "schedule": "length_aware", "refill": "group"}',
     "generation_schedule length_aware needs generation_refill continuous and generation_probe_tokens >= 2 (got "
     "generation_refill group, generation_probe_tokens 4)"),
])
def test_a_bad_engine_argument_is_one_line_at_validation(spec, line):
    with pytest.raises(ValueError) as refused:
        make_config(overrides={"generation_engine": spec})
    assert str(refused.value) == line


def test_the_yaml_form_and_the_command_line_agree(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("generation_engine: {name: slots, micro_group: 8, refill: group}\ngeneration_micro_group: 2\n")
    from_yaml = make_config(path)
    from_cli = make_config(overrides={"generation_engine": json.dumps({"name": "slots", "micro_group": 8,
                                                                         "refill": "group"}),
                                      "generation_micro_group": "2"})
    assert from_yaml.generation_options() == from_cli.generation_options()
    assert (from_yaml.generation_options().micro_group, from_yaml.generation_options().refill) == (8, "group")


def test_an_engines_own_rules_come_from_its_options_not_its_name(tmp_path):
    """A user's engine subclassing the slots engine inherits its options class and so its checks."""
    path = tmp_path / "engines.py"
    path.write_text("from podsrl.rollout import SlotsEngine\nclass MySlots(SlotsEngine):\n    pass\n")
    with pytest.raises(ValueError, match=r"^generation_refill: unknown 'eager'"):
        make_config(overrides={"generation_engine": f"{path}:MySlots", "generation_refill": "eager"})
    assert make_config(overrides={"generation_engine": json.dumps({"name": f"{path}:MySlots", "micro_group": 3})}
                       ).generation_options().micro_group == 3


def test_a_users_engine_declares_its_own_options_class(tmp_path):
    path = tmp_path / "engines.py"
    path.write_text(
        "from dataclasses import dataclass\nfrom podsrl.options import POSITIVE, option\n"
        "from podsrl.rollout import EngineOptions, HFEngine\n\n"
        "@dataclass(frozen=True)\nclass BeamOptions(EngineOptions):\n"
        "    beams: int = option(2, 'beams', POSITIVE)\n    memory_mb: float = 0.0\n\n"
        "class Beams(HFEngine):\n    options_type = BeamOptions\n")
    cfg = make_config(overrides={"generation_engine": json.dumps({"name": f"{path}:Beams", "beams": 4}),
                                 "generation_memory_mb": "64"})
    options = cfg.generation_options()
    assert (type(options).__name__, options.beams, options.memory_mb) == ("BeamOptions", 4, 64.0)
    with pytest.raises(ValueError, match=r"argument beams = 0: must be positive$"):
        make_config(overrides={"generation_engine": json.dumps({"name": f"{path}:Beams", "beams": 0})})
    assert isinstance(options, EngineOptions)


def test_a_run_builds_its_engine_from_the_spec(random_model_dir, tmp_path):
    cfg = quick(random_model_dir, tmp_path / "run", generation_engine=json.dumps({"name": "slots", "micro_group": 5}),
                generation_micro_group=2)
    run = set_up(cfg)
    try:
        engine = run.engine
        assert (type(engine.options), engine.options.micro_group,
                engine.options.max_completion_length) == (SlotsOptions, 5, 6)
    finally:
        run.lock.release()

"""Numbers are numbers: every numeric config field, found by introspection, is of its type,
finite and within the range its field declares (podsrl.options), whichever way it is given (command line,
YAML, Python); a group of one rollout is refused for every method; float16 weights are refused.
Each error is one line that names the field (and, from YAML, the file and line), raised
before anything loads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from podsrl import cli
from podsrl.methods import METHODS
from podsrl.models import loading
from podsrl.options import check_numbers
from podsrl.trainer.config import FIELDS, Config, make_config, validate

ROOT = Path(__file__).parents[1]
FLOAT_FIELDS = sorted(name for name, f in FIELDS.items() if type(f.default) is float)
INT_FIELDS = sorted(name for name, f in FIELDS.items() if type(f.default) is int)
RANGES = {name: f.metadata["range"] for name, f in FIELDS.items() if "range" in f.metadata}
UNCHECKED = {name: f.metadata["unchecked"] for name, f in FIELDS.items() if "unchecked" in f.metadata}
NON_FINITE = [math.nan, math.inf, -math.inf]
YAML_NON_FINITE = {".nan": "nan", ".inf": "inf", "-.inf": "-inf"}


def refused(message: str, field: str, where: str = "") -> None:
    """One line, starting with ``where`` (a YAML file and line) and the field."""
    assert "\n" not in message, message
    assert message.startswith(f"{where}{field}: "), message


def error_of(**kwargs) -> str:
    with pytest.raises(ValueError) as err:
        make_config(**kwargs)
    return str(err.value)


def test_every_numeric_field_has_a_range_or_a_reason():
    assert FLOAT_FIELDS and INT_FIELDS
    numeric = set(FLOAT_FIELDS) | set(INT_FIELDS)
    assert set(RANGES) | set(UNCHECKED) == numeric
    assert not set(RANGES) & set(UNCHECKED)
    assert all(UNCHECKED.values())
    assert set(FLOAT_FIELDS) <= set(RANGES)  # every float has a range, and no float accepts infinity


# --- finite numbers ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", NON_FINITE, ids=str)
def test_float_fields_refuse_non_finite_values_from_every_source(name, value):
    expected = f"{name}: must be a finite number, got {value}"
    assert error_of(overrides={name: str(value)}) == expected  # the command line's text: float("nan")
    assert error_of(overrides={name: value}) == expected  # a Python float
    with pytest.raises(ValueError) as err:
        validate(Config(**{name: value}))  # Config built directly
    assert str(err.value) == expected


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("text", sorted(YAML_NON_FINITE))
def test_float_fields_refuse_non_finite_yaml_values_with_file_and_line(tmp_path, name, text):
    path = tmp_path / "run.yaml"
    path.write_text(f"method: pods\n\n{name}: {text}\n")
    message = error_of(yaml_path=path)
    refused(message, name, f"{path} line 3: ")
    assert message.endswith(f"must be a finite number, got {YAML_NON_FINITE[text]}")


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_the_command_line_refuses_nan_before_anything_loads(name, monkeypatch, capsys):
    def never(*args, **kwargs):
        raise AssertionError("validation must come before any loading")

    monkeypatch.setattr(cli, "train", never)
    monkeypatch.setattr(loading, "load_model", never)
    assert cli.main(["train", f"--{name}", "nan"]) == 2
    err = capsys.readouterr().err
    assert err == f"podsrl train: error: {name}: must be a finite number, got nan\n"


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("value", NON_FINITE + [1.5, True, "3"], ids=repr)
def test_int_fields_take_only_integers(name, value):
    if isinstance(value, float):  # command line: int("nan") fails; YAML and Python floats too
        refused(error_of(overrides={name: str(value)}), name)
    with pytest.raises(ValueError) as err:
        validate(Config(**{name: value}))
    assert str(err.value) == f"{name}: expected int, got {value!r}"


@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_float_fields_take_numbers_not_text_or_bools(name):
    for value in ("0.5", True, None):
        with pytest.raises(ValueError) as err:
            validate(Config(**{name: value}))
        assert str(err.value) == f"{name}: expected float, got {value!r}"
    assert make_config(overrides={name: FIELDS[name].default}) == Config()  # ints and floats both do


def test_a_float_too_large_for_a_float_names_the_field(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(f"learning_rate: {10**400}\n")  # YAML reads an int that float() cannot convert
    assert error_of(yaml_path=path).startswith(f"{path} line 1: learning_rate: expected float")
    assert error_of(overrides={"learning_rate": "1e400"}) == "learning_rate: must be a finite number, got inf"


# --- ranges --------------------------------------------------------------------------------------
def _step(name: str, value, direction: float):
    """The next value of the field's type from ``value`` towards ``direction``."""
    if type(FIELDS[name].default) is int:
        return value + (1 if direction > 0 else -1)
    return math.nextafter(value, direction)


def outside(name: str) -> list:
    """The values nearest the range that it refuses, of the field's type."""
    r, values = RANGES[name], []
    if r.low != -math.inf:
        values.append(_step(name, r.low, -math.inf) if r.low_closed else r.low)
    if r.high != math.inf:
        values.append(_step(name, r.high, math.inf) if r.high_closed else r.high)
    return [type(FIELDS[name].default)(value) for value in values]


def inside(name: str) -> list:
    """The values nearest the bounds that it accepts."""
    r, values = RANGES[name], []
    if r.low != -math.inf:
        values.append(r.low if r.low_closed else _step(name, r.low, math.inf))
    if r.high != math.inf:
        values.append(r.high if r.high_closed else _step(name, r.high, -math.inf))
    return values


EDGES = [(name, value) for name in sorted(RANGES) for value in outside(name)]


def test_every_range_is_bounded_somewhere():
    assert all(outside(name) for name in RANGES)


@pytest.mark.parametrize("name, value", EDGES)
def test_values_just_outside_a_range_are_refused_naming_the_field(name, value):
    message = error_of(overrides={name: str(value)})
    refused(message, name)
    assert f": must be {RANGES[name].describe()}" in message and message.endswith(f"got {value}")
    if RANGES[name].why:
        assert f"({RANGES[name].why})" in message


@pytest.mark.parametrize("name, value", EDGES)
def test_range_errors_from_yaml_name_file_and_line(tmp_path, name, value):
    path = tmp_path / "run.yaml"
    path.write_text(f"method: pods\n{name}: {value}\n")
    refused(error_of(yaml_path=path), name, f"{path} line 2: ")


@pytest.mark.parametrize("name", sorted(RANGES))
def test_values_at_the_edges_of_a_range_pass_the_range_check(name):
    for value in inside(name):
        check_numbers(Config(**{name: value}))


@pytest.mark.parametrize("name, low, high, closed", [
    ("learning_rate", 0, math.inf, "()"), ("temperature", 0, math.inf, "()"), ("top_p", 0, 1, "(]"),
    ("lora_dropout", 0, 1, "[)"), ("adam_beta1", 0, 1, "[)"), ("adam_beta2", 0, 1, "[)"),
    ("weight_decay", 0, math.inf, "[)"), ("max_grad_norm", 0, math.inf, "[)"), ("epsilon", 0, 1, "[)"),
    ("beta", 0, math.inf, "[)"), ("warmup_steps", 0, math.inf, "[)"), ("seed", 0, 2**32 - 1, "[]"),
    ("data_seed", 0, 2**32 - 1, "[]"), ("prompts_per_step", 0, math.inf, "()"),
    ("num_generations", 0, math.inf, "()"), ("max_completion_length", 0, math.inf, "[)"),  # 0 = the task's budget
    ("micro_batch_size", 0, math.inf, "()"), ("eval_prompts", 1, 100_000, "[]"), ("reward_timeout", 0, 86400, "[]"),
    ("reasoning_gym_size", 1, 1_000_000, "[]"),
])
def test_the_ranges_the_issue_asks_for(name, low, high, closed):
    r = RANGES[name]
    assert (r.low, r.high, r.low_closed) == (low, high, closed[0] == "[")
    assert high == math.inf or r.high_closed == (closed[1] == "]")  # an infinite bound is never reached


def test_seed_range_is_what_numpy_and_torch_accept():
    top = RANGES["seed"].high
    np.random.RandomState(top)
    torch.Generator().manual_seed(top + 10_007 + 7)  # the run's derived streams (seed + 1, evaluation's offset)
    with pytest.raises(ValueError):
        np.random.RandomState(top + 1)
    with pytest.raises(ValueError):
        np.random.RandomState(-1)


@pytest.mark.parametrize("name", sorted(n for n, r in RANGES.items() if r.why.startswith("0 =")))
def test_fields_where_0_means_off_document_it(name):
    assert "0 =" in FIELDS[name].metadata["help"]


# --- reward_weights: each value a finite number ---------------------------------------------------
FUNCS = "arithmetic_correct,arithmetic_format"


@pytest.mark.parametrize("weights", ["nan,1", "1,inf", "-inf,1", " 1 , -Infinity", "1,NaN"])
def test_each_reward_weight_is_finite(weights):
    message = error_of(overrides={"reward_funcs": FUNCS, "reward_weights": weights})
    refused(message, "reward_weights")
    assert "must be finite numbers" in message
    refused(error_of(overrides={"reward_weights": weights}), "reward_weights")  # weights of train()'s functions


def test_reward_weights_from_yaml_name_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(f"reward_funcs: {FUNCS}\nreward_weights: [1, .nan]\n")
    refused(error_of(yaml_path=path), "reward_weights", f"{path} line 2: ")


def test_negative_reward_weights_are_numbers_too():
    cfg = make_config(overrides={"reward_funcs": FUNCS, "reward_weights": "1, -0.5"})
    assert cfg.reward_weight_values == [1.0, -0.5]


# --- a group of one rollout has no advantage, whatever the method ----------------------------------
@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("n, m", [(n, m) for n in (1, 2, 4) for m in (1, 2, 4)])
def test_a_group_of_one_trained_rollout_is_refused(method, n, m):
    spec = METHODS[method]
    overrides = {"method": method, "num_generations": str(n), "num_kept": str(m)}
    if spec.trained_per_prompt(n, m) < 2:
        group = "num_kept" if spec.trained_per_prompt(0, 1) == 1 else "num_generations"
        message = error_of(overrides=overrides)
        refused(message, group)
        assert f"must be at least 2 for method {method}" in message and "advantage" in message
    elif m > n and spec.generates_n:
        refused(error_of(overrides=overrides), "num_kept")
    else:
        cfg = make_config(overrides=overrides)
        assert cfg.trained_per_prompt >= 2


def test_a_group_of_one_from_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("method: grpo\nnum_kept: 1\n")
    refused(error_of(yaml_path=path), "num_kept", f"{path} line 2: ")
    # the command line's value replaces the file's: its error has no file and line
    refused(error_of(yaml_path=path, overrides={"num_kept": "1"}), "num_kept")
    assert make_config(path, {"num_kept": "2"}).num_kept == 2


# --- float16 weights -------------------------------------------------------------------------------
def test_float16_weights_are_refused_with_what_to_use_instead(monkeypatch):
    message = error_of(overrides={"dtype": "float16"})
    refused(message, "dtype")
    assert "bf16" in message and "bfloat16" in message and "float32" in message
    assert "float32 or bfloat16." in FIELDS["dtype"].metadata["help"]  # the documented choices, then why not float16
    assert "float16 is refused" in FIELDS["dtype"].metadata["help"]
    for dtype in ("float32", "bfloat16"):
        assert make_config(overrides={"dtype": dtype}).dtype == dtype

    def never(*args, **kwargs):
        raise AssertionError("load_model must refuse float16 before loading")

    monkeypatch.setattr(loading, "_load_with_fallback", never)
    with pytest.raises(ValueError, match="^dtype: float16 weights are not supported"):
        loading.load_model("tiny", dtype="float16")  # also for callers that skip validate


# --- shipped configs -------------------------------------------------------------------------------
SHIPPED = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if "accelerate" not in p.parts)


def test_shipped_configs_include_the_paper_ones():
    assert {"tiny-lora.yaml", "smollm2-arith.yaml"} <= {p.name for p in SHIPPED}
    assert {p.name for p in SHIPPED if p.parent.name == "paper-8gpu"} == {"pods.yaml", "grpo-ga.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_configs_pass_every_number_check(path):
    cfg = make_config(path)
    check_numbers(cfg)
    assert cfg.trained_per_prompt >= 2 and cfg.dtype != "float16"

"""Settings declared beside their readers (podsrl.options): an owner's options class is
composed into the config under the same names, checked by the range its field declares, and
handed back to the owner by name; evaluation's settings live in trainer/evaluate.py only."""

from __future__ import annotations

import ast
import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from podsrl.options import NON_NEGATIVE, POSITIVE, Range, bind, check_numbers, option
from podsrl.trainer.checkpoints import CheckpointOptions, CheckpointSchedule
from podsrl.trainer.config import FIELDS, Config, ConfigFields, make_config
from podsrl.trainer.evaluate import EvalOptions
from podsrl.trainer.limits import Limits, StopOptions
from podsrl.trainer.logging import LogOptions
from podsrl.trainer.state import RunState
from podsrl.update import OptimizerOptions

# each declared in the module that reads it
OWNERS = [EvalOptions, CheckpointOptions, StopOptions, LogOptions, OptimizerOptions]

SRC = Path(__file__).resolve().parents[1] / "src" / "podsrl"


@dataclasses.dataclass(frozen=True)
class Sample:
    count: int = option(3, "how many", POSITIVE)
    share: float = option(0.5, "a share", Range(0, 1, why="a share"))
    label: str = option("x", "a name")


def test_bind_takes_every_field_by_name_and_values_replace_them():
    source = Sample(count=7, share=0.25, label="y")
    assert bind(Sample, source) == source
    assert bind(Sample, source, label="z") == Sample(count=7, share=0.25, label="z")
    cfg = make_config(None, {"eval_prompts": "40", "eval_greedy": "false"})
    options = bind(EvalOptions, cfg)
    assert type(options) is EvalOptions
    assert {f.name: getattr(options, f.name) for f in dataclasses.fields(EvalOptions)} == \
        {f.name: getattr(cfg, f.name) for f in dataclasses.fields(EvalOptions)}


@pytest.mark.parametrize("values,message", [
    ({"count": 0}, "count: must be positive, got 0"),
    ({"count": True}, "count: expected int, got True"),
    ({"share": float("nan")}, "share: must be a finite number, got nan"),
    ({"share": 1.5}, "share: must be in [0, 1] (a share), got 1.5"),
])
def test_check_numbers_reads_each_fields_declared_range(values, message):
    check_numbers(Sample())
    with pytest.raises(ValueError) as err:
        check_numbers(Sample(**values))
    assert str(err.value) == message


@pytest.mark.parametrize("owner", OWNERS, ids=lambda owner: owner.__name__)
def test_the_config_composes_each_owners_options_under_their_names(owner):
    """Config is each owner's options class: its fields are the owner's own (default, help,
    range), ConfigFields declares none of them, and a bad value is refused naming the field."""
    assert issubclass(Config, owner)
    own = {f.name for f in dataclasses.fields(ConfigFields)}
    for f in dataclasses.fields(owner):
        assert f.name not in own
        assert FIELDS[f.name].metadata == f.metadata and FIELDS[f.name].default == f.default
        if "range" in f.metadata:
            with pytest.raises(ValueError, match=rf"^{f.name}: must be "):
                make_config(None, {f.name: str(f.metadata["range"].low - 1)})
    assert next(iter(FIELDS)) == "model"  # config.json begins as every earlier one did (run_folder/ownership.py)


@pytest.mark.parametrize("seed", range(6))
def test_limits_give_up_after_max_consecutive_skips_in_a_row(seed):
    """Against a brute-force count: the run gives up exactly when the last ``limit`` steps were
    all skipped, and says how many."""
    rng = random.Random(seed)
    limit = rng.randint(1, 4)
    limits, history = Limits(StopOptions(max_consecutive_skips=limit)), []
    for _ in range(40):
        history.append(rng.random() < 0.6)
        in_a_row = len(history) - max((i + 1 for i, skipped in enumerate(history) if not skipped), default=0)
        why = limits.give_up(SimpleNamespace(update=SimpleNamespace(skipped_step=history[-1])))
        assert bool(why) == (in_a_row >= limit)
        if why:
            assert why.startswith(f"{in_a_row} consecutive steps had a non-finite loss or gradient")
            break


def test_limits_and_checkpoint_schedule_read_their_own_options():
    limits = Limits(StopOptions(max_steps=3, max_minutes=0.5))
    assert limits.more_steps(RunState({}, step=2, train_seconds=29.0))
    assert not limits.more_steps(RunState({}, step=3, train_seconds=0.0))
    assert not limits.more_steps(RunState({}, step=1, train_seconds=30.0))  # the time budget is spent
    assert Limits(StopOptions(max_minutes=0.0)).more_steps(RunState({}, step=1, train_seconds=1e9))  # 0 = none
    schedule = CheckpointSchedule(CheckpointOptions(save_steps=4, checkpoint_minutes=0.0))
    assert [step for step in range(1, 13) if schedule.due_by_steps(step)] == [4, 8, 12]
    assert not schedule.due_by_time()  # 0 = no time-based checkpoints
    timed = CheckpointSchedule(CheckpointOptions(save_steps=0, checkpoint_minutes=1.0))
    timed.last_time -= 61
    assert timed.due_by_time() and not timed.due_by_steps(4)
    timed.restart_clock()
    assert not timed.due_by_time()


# eval_* settings with a reader besides evaluation, declared once beside both (EvalOptions inherits
# it): the held-out split's size, which the procedural tasks generate
SHARED_EVAL_SETTINGS = {("tasks/__init__.py", "eval_prompts")}


def test_evaluation_settings_are_declared_in_trainer_evaluate_only():
    """No class body outside trainer/evaluate.py declares an ``eval_*`` setting (an option
    field) but the shared ones: a new evaluation setting is one field of EvalOptions (the
    command line, YAML, range check and docs follow)."""
    declared = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                declared += [(path.relative_to(SRC).as_posix(), item.target.id) for item in node.body
                             if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", "").startswith("eval_")
                             and isinstance(item.value, ast.Call) and _called(item.value) in ("option", "_f")]
    assert declared and {where for where, name in declared
                         if (where, name) not in SHARED_EVAL_SETTINGS} == {"trainer/evaluate.py"}, declared
    assert SHARED_EVAL_SETTINGS <= set(declared)  # each declared where it is said to be


def _called(call: ast.Call) -> str:
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")


@pytest.mark.parametrize("field,value,message", [
    ("optim", "adam", "optim: unknown optimizer 'adam'; known: adamw_torch, sgd"),
    ("lr_scheduler_type", "warmup", "lr_scheduler_type: unknown schedule 'warmup'; known: "),
])
def test_an_owner_checks_its_own_rules_at_validation(field, value, message):
    """OptimizerOptions.check() runs on the config's values before anything loads."""
    with pytest.raises(ValueError) as err:
        make_config(None, {field: value})
    assert str(err.value).startswith(message)
    with pytest.raises(ValueError):
        OptimizerOptions(**{field: value}).check()


def test_a_new_reason_to_stop_is_a_field_of_its_owner_and_a_few_lines_of_limits():
    """What adding a reason to stop takes, in a temporary subclass: one field beside the limits
    (composed into a config like Config's, checked by its declared range, bound by name) and
    the lines that act on it, which see every finished step."""

    @dataclasses.dataclass(frozen=True)
    class MoreStops(StopOptions):
        max_flat_steps: int = option(0, "Give up after this many steps in a row with every advantage 0 (0 = never).",
                                     Range(0, why="0 = never"))

    class MoreLimits(Limits):
        def __init__(self, options: MoreStops) -> None:
            super().__init__(options)
            self.flat_steps = 0  # its own count

        def give_up(self, outcome) -> str:
            self.flat_steps = 0 if outcome.advantages.any() else self.flat_steps + 1
            if self.options.max_flat_steps and self.flat_steps >= self.options.max_flat_steps:
                return f"{self.flat_steps} steps in a row had every advantage 0 (max_flat_steps)"
            return super().give_up(outcome)

    bases = tuple(MoreStops if base is StopOptions else base for base in Config.__bases__)
    WiderConfig = dataclasses.dataclass(frozen=True)(type("WiderConfig", bases, {}))
    assert "max_flat_steps" in {f.name for f in dataclasses.fields(WiderConfig)}
    with pytest.raises(ValueError, match=r"^max_flat_steps: must be >= 0 \(0 = never\), got -1$"):
        check_numbers(WiderConfig(max_flat_steps=-1))
    limits = MoreLimits(bind(MoreStops, WiderConfig(max_flat_steps=2)))
    flat = SimpleNamespace(advantages=torch.zeros(2, 4), update=SimpleNamespace(skipped_step=False))
    moving = SimpleNamespace(advantages=torch.ones(2, 4), update=SimpleNamespace(skipped_step=False))
    assert [limits.give_up(step) for step in (flat, moving, flat)] == ["", "", ""]
    assert limits.give_up(flat) == "2 steps in a row had every advantage 0 (max_flat_steps)"


def test_a_new_stop_reason_is_one_field_and_one_check_in_its_owner(monkeypatch, random_model_dir, tmp_path):
    """What a new reason to stop takes (#59): a field on StopOptions and a check in Limits.give_up,
    both in trainer/limits.py, here a subclass of each. The config composes the field (its default,
    help and range come with it), validation checks its range, set-up binds it by name, and the
    run stops on it; nothing else changes."""
    from podsrl.config_checks import validate
    from podsrl.trainer import setup, train
    from podsrl.trainer.limits import Limits, StopOptions
    from podsrl.trainer.stops import TrainingStopped
    from tests.conftest import quick

    @dataclasses.dataclass(frozen=True)
    class MoreStops(StopOptions):
        max_constant_steps: int = option(0, "Stop after this many steps in a row with every advantage 0.",
                                         NON_NEGATIVE)

    class MoreLimits(Limits):
        constant_steps = 0

        def give_up(self, outcome) -> str:
            self.constant_steps = 0 if bool(outcome.advantages.any()) else self.constant_steps + 1
            if self.options.max_constant_steps and self.constant_steps >= self.options.max_constant_steps:
                return f"{self.constant_steps} steps in a row had every advantage 0 (max_constant_steps)"
            return super().give_up(outcome)

    @dataclasses.dataclass(frozen=True)
    class MoreConfig(Config, MoreStops):
        pass

    base = quick(random_model_dir, tmp_path / "run", max_steps=6)
    cfg = MoreConfig(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Config)}, max_constant_steps=2)
    assert bind(MoreStops, cfg).max_constant_steps == 2 and "max_constant_steps" in cfg.to_dict()  # configured
    with pytest.raises(ValueError, match=r"^max_constant_steps: must be >= 0, got -1$"):  # validated
        validate(dataclasses.replace(cfg, max_constant_steps=-1))
    monkeypatch.setattr(setup, "StopOptions", MoreStops)  # where limits.py's own classes would be
    monkeypatch.setattr(setup, "Limits", MoreLimits)
    constant = tmp_path / "constant.py"
    constant.write_text("def constant(prompts, completions, **columns):\n    return [1.0] * len(completions)\n")
    with pytest.raises(TrainingStopped, match=r"stopped at step 2: 2 steps in a row had every advantage 0"):
        train(dataclasses.replace(cfg, reward_funcs=f"{constant}:constant"))  # acted on

"""Experiment tracking: trackers get every number of every metrics record at its step, the
config and rollout tables; rollouts.jsonl samples each step's rollouts with the selection's
kept flags; resume keeps both consistent; a missing tracker package is refused up front."""

import importlib.util
import itertools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from podsrl import cli
from podsrl.metrics import read_metrics
from podsrl.tracking import markdown_table, tracker_names
from podsrl.trainer import train
from podsrl.trainer.config import make_config
from tests.conftest import quick

NUMBERS = (int, float)


def quick_config(model_dir, output_dir, **overrides):
    """conftest's two-step run, without checkpoints."""
    return quick(model_dir, output_dir, **{"save_steps": 0, **overrides})


def logged_numbers(run_dir: Path) -> dict[tuple[str, int], float]:
    """(field, step) -> value of every number metrics.jsonl holds (nulls are not numbers)."""
    return {(key, record["step"]): value for record in read_metrics(run_dir / "metrics.jsonl")
            for key, value in record.items() if key != "step" and isinstance(value, NUMBERS)}


def tensorboard_scalars(log_dir: Path) -> dict[tuple[str, int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    out: dict[tuple[str, int], list[float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            out.setdefault((tag, event.step), []).append(event.value)
    return out


def rollout_records(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir / "rollouts.jsonl")


def skip_unless_installed(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{package} is not installed (pip install '.[{package}]' in a podsrl clone)")


# --- TensorBoard ----------------------------------------------------------------------------------
@skip_unless_installed("tensorboard")
def test_tensorboard_holds_every_number_of_metrics_jsonl_at_its_step(random_model_dir, tmp_path):
    run_dir = train(quick_config(random_model_dir, tmp_path / "run", eval_steps=1, report_to="tensorboard")).run_dir
    expected = logged_numbers(run_dir)
    scalars = tensorboard_scalars(run_dir / "tracking" / "tensorboard")
    assert scalars.keys() == expected.keys()
    assert {step for _, step in expected} == {0, 1, 2}
    for key, value in expected.items():
        assert scalars[key] == [pytest.approx(value, rel=1e-6, abs=1e-12)], key  # float32 in the event file
    hparams = next((run_dir / "tracking" / "tensorboard").glob("*/hparams.yml")).read_text()
    assert "num_generations: 6" in hparams and "report_to: tensorboard" in hparams


@skip_unless_installed("tensorboard")
def test_tensorboard_shows_the_rollout_sample_as_text(random_model_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = train(quick_config(random_model_dir, tmp_path / "run", report_to="tensorboard")).run_dir
    events = EventAccumulator(str(run_dir / "tracking" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("rollouts/text_summary")}
    assert sorted(texts) == [1, 2]
    first = [r for r in rollout_records(run_dir) if r["step"] == 1]
    columns = list(first[0])
    assert texts[1] == markdown_table(columns, [[r[c] for c in columns] for r in first])


def test_markdown_cells_keep_pipes_and_newlines_inside_their_cell():
    table = markdown_table(["prompt", "completion"], [["a | b", "line 1\nline 2"]])
    assert table.splitlines() == ["| prompt | completion |", "| --- | --- |", "| a \\| b | line 1<br>line 2 |"]


# --- rollouts.jsonl --------------------------------------------------------------------------------
def population_variance(values):
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def test_rollouts_jsonl_records_each_group_with_the_kept_flags_the_update_used(random_model_dir, tmp_path):
    cfg = quick_config(random_model_dir, tmp_path / "run", log_rollouts=4)  # every group of the step
    run_dir = train(cfg).run_dir
    rows = rollout_records(run_dir)
    assert len(rows) == cfg.max_steps * cfg.prompts_per_step * cfg.num_generations
    assert set(rows[0]) == {"step", "group", "index", "prompt", "answer", "completion", "reward", "correct", "kept"}
    metrics = {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl")}
    for (step, group), members in itertools.groupby(rows, key=lambda r: (r["step"], r["group"])):
        members = list(members)
        assert [r["index"] for r in members] == list(range(cfg.num_generations))
        assert len({r["prompt"] for r in members}) == 1
        kept = [r["reward"] for r in members if r["kept"]]
        assert len(kept) == cfg.num_kept
        # max_variance: no other subset of num_kept rewards varies more
        best = max(population_variance(c) for c in itertools.combinations([r["reward"] for r in members], cfg.num_kept))
        assert population_variance(kept) == pytest.approx(best, abs=1e-9), (step, group)
    for step in (1, 2):  # the same rollouts as the step's metrics
        of_step = [r for r in rows if r["step"] == step]
        assert sum(r["reward"] for r in of_step) / len(of_step) == pytest.approx(metrics[step]["reward_mean"])
        kept = [r["reward"] for r in of_step if r["kept"]]
        assert sum(kept) / len(kept) == pytest.approx(metrics[step]["kept_reward_mean"])
    assert not (run_dir / "tracking").exists()  # report_to none: no tracker files


@pytest.mark.slow
def test_rollout_sample_size_follows_log_rollouts_and_grpo_ga_keeps_all(random_model_dir, tmp_path):
    ga = train(quick_config(random_model_dir, tmp_path / "ga", method="grpo-ga", log_rollouts=1)).run_dir
    rows = rollout_records(ga)
    assert [(r["step"], r["group"]) for r in rows] == [(1, 0)] * 6 + [(2, 0)] * 6
    assert all(r["kept"] for r in rows)  # grpo-ga trains on every rollout
    off = train(quick_config(random_model_dir, tmp_path / "off", log_rollouts=0)).run_dir
    assert not (off / "rollouts.jsonl").exists()


# --- resume ----------------------------------------------------------------------------------------
@pytest.mark.slow
@skip_unless_installed("tensorboard")
def test_resume_drops_the_redone_steps_from_rollouts_and_tensorboard(random_model_dir, tmp_path):
    out = tmp_path / "run"
    train(quick_config(random_model_dir, out, max_steps=3, save_steps=2, report_to="tensorboard"))
    first_attempt = rollout_records(out)
    shutil.rmtree(out / "checkpoints" / "step_0000003")  # as if killed after step 3, before its checkpoint
    train(quick_config(random_model_dir, out, max_steps=4, resume=True, report_to="tensorboard"))
    rows = rollout_records(out)
    assert [r["step"] for r in rows] == [s for s in (1, 2, 3, 4) for _ in range(6)]  # step 3 once
    assert [r for r in rows if r["step"] <= 3] == first_attempt  # redone exactly
    scalars = tensorboard_scalars(out / "tracking" / "tensorboard")
    assert sorted(step for (tag, step), values in scalars.items() if tag == "loss" for _ in values) == [1, 2, 3, 4]
    expected = logged_numbers(out)
    assert scalars.keys() == expected.keys()
    for key, value in expected.items():  # one value per step: the first attempt's step 3 is hidden
        assert scalars[key] == [pytest.approx(value, rel=1e-6, abs=1e-12)], key


# --- two processes ---------------------------------------------------------------------------------
ACCELERATE = shutil.which("accelerate", path=str(Path(sys.executable).parent))


@pytest.mark.slow
@skip_unless_installed("tensorboard")
def test_under_two_processes_only_the_main_process_logs(tmp_path):
    out = tmp_path / "run"
    options = dict(model="tiny", max_steps=2, prompts_per_step=4, num_generations=4, num_kept=2,
                   max_completion_length=5, eval_prompts=4, eval_samples=1, eval_steps=0, save_steps=0, progress=False,
                   report_to="tensorboard", log_rollouts=2, output_dir=out)
    done = subprocess.run([ACCELERATE or "accelerate", "launch", "--multi_gpu", "--mixed_precision", "no",
                           "--dynamo_backend", "no", "--num_processes", "2", "--num_machines", "1",
                           "--main_process_port", "0", "-m", "podsrl.cli", "train",
                           *[f"--{k}={v}" for k, v in options.items()]],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((out / "tracking" / "tensorboard").glob("events.out.tfevents.*"))) == 1  # one writer
    scalars = tensorboard_scalars(out / "tracking" / "tensorboard")
    assert scalars == {key: [pytest.approx(value, rel=1e-6, abs=1e-12)] for key, value in logged_numbers(out).items()}
    rows = rollout_records(out)  # the main process's 2 groups of each step, once
    assert [(r["step"], r["group"]) for r in rows] == [(s, g) for s in (1, 2) for g in (0, 1) for _ in range(4)]


# --- W&B and trackio, in a subprocess (they hook the interpreter's output and exit) -----------
def train_in_subprocess(model_dir, out, env, *args):
    """``podsrl train`` on a tiny run; ``env`` entries set to None are removed. ``model_dir``: one that
    earns rewards (the shipped tiny model), or the run learns nothing and exits 1."""
    command = [sys.executable, "-m", "podsrl.cli", "train", "--model", model_dir, "--max_steps", "2",
               "--prompts_per_step", "2", "--num_generations", "4", "--num_kept", "2", "--max_completion_length", "6",
               "--eval_prompts", "4", "--eval_samples", "1", "--save_steps", "0", "--progress", "false",
               "--output_dir", str(out), *args]
    env = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("held-out accuracy")  # the trackers' own messages go to stderr
    return done


def wandb_records(path: Path) -> list:
    """The records of an offline run's .wandb file (LevelDB-style log: 32 KiB blocks, each
    chunk a 7-byte header - crc, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, position = path.read_bytes(), [], b"", 7  # 7: the file's own header
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.mark.slow
@skip_unless_installed("wandb")
def test_wandb_logs_offline_without_an_api_key(tmp_path):
    env = {"WANDB_API_KEY": None, "WANDB_MODE": None, "NETRC": str(tmp_path / "no-netrc"), "WANDB_SILENT": "true"}
    out = tmp_path / "run"
    done = train_in_subprocess("tiny", out, env, "--report_to", "wandb", "--eval_steps", "1")
    assert "logging offline" in done.stderr
    [run_file] = (out / "tracking" / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[tuple[str, int], float] = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = items.pop("_step")
            history.update({(key, step): value for key, value in items.items() if not key.startswith("_")})
    table_steps = sorted(step for key, step in history if key == "rollouts._type")  # a table: nested keys
    assert table_steps == [1, 2]
    numbers = {(key, step): value for (key, step), value in history.items() if not key.startswith("rollouts.")}
    assert numbers == pytest.approx(logged_numbers(out))
    [table_file] = (out / "tracking" / "wandb").glob("offline-run-*/files/media/table/rollouts_1_*.table.json")
    table = json.loads(table_file.read_text())
    first = [r for r in rollout_records(out) if r["step"] == 1]
    assert table["columns"] == list(first[0]) and table["data"] == [list(r.values()) for r in first]


@pytest.mark.slow
@skip_unless_installed("trackio")
def test_trackio_logs_the_metrics_and_the_rollout_table(tmp_path):
    store = tmp_path / "trackio"
    out = tmp_path / "run"
    train_in_subprocess("tiny", out, {"TRACKIO_DIR": str(store), "TRACKIO_PROJECT": "test"},
                        "--report_to", "trackio", "--eval_steps", "1")
    with sqlite3.connect(store / "test.db") as db:
        logged = [(step, json.loads(values)) for step, values in db.execute("select step, metrics from metrics")]
    numbers = {(key, step): value for step, values in logged for key, value in values.items()
               if isinstance(value, NUMBERS)}
    assert numbers == pytest.approx(logged_numbers(out))
    tables = [(step, values["rollouts"]) for step, values in logged if "rollouts" in values]
    assert [step for step, _ in tables] == [1, 2]
    assert tables[0][1]["_type"] == "trackio.table"


# --- configuration ---------------------------------------------------------------------------------
def hide(monkeypatch, *packages):
    """Make ``packages`` look uninstalled (find_spec returns None for a None entry in sys.modules)."""
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)


def test_a_missing_tracker_is_refused_at_validation_naming_report_to_and_the_extra(monkeypatch):
    hide(monkeypatch, "wandb")
    with pytest.raises(ValueError,
                       match=r"report_to: 'wandb' needs the wandb package.*install '\.\[wandb\]' in a podsrl clone"):
        make_config(overrides={"report_to": "wandb"})
    hide(monkeypatch, "tensorboard", "tensorboardX", "trackio")
    with pytest.raises(ValueError, match="report_to: 'all', but none of tensorboard, wandb, trackio is installed"):
        make_config(overrides={"report_to": "all"})


def test_the_cli_refuses_a_missing_tracker_before_any_work(monkeypatch, capsys, tmp_path):
    hide(monkeypatch, "wandb")
    assert cli.main(["train", "--report_to", "wandb", "--output_dir", str(tmp_path / "run")]) == 2
    assert "podsrl train: error: report_to: 'wandb' needs the wandb package" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value, message", [("tensorbord", "unknown tracker 'tensorbord'"),
                                            ("none,wandb", "'none' and 'all' stand alone"),
                                            ("all,tensorboard", "'none' and 'all' stand alone")])
def test_bad_report_to_values_are_refused(value, message):
    with pytest.raises(ValueError, match=f"report_to: .*{message}"):
        make_config(overrides={"report_to": value})


def test_report_to_reads_as_trl_reads_it(monkeypatch):
    assert tracker_names("none") == tracker_names("") == []
    hide(monkeypatch, "wandb", "trackio")
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is not installed")
    assert tracker_names("all") == ["tensorboard"]  # every installed one
    assert tracker_names(" TensorBoard , tensorboard") == ["tensorboard"]


def test_log_rollouts_must_not_be_negative():
    with pytest.raises(ValueError, match="log_rollouts: must be >= 0"):
        make_config(overrides={"log_rollouts": "-1"})


@pytest.mark.slow
@skip_unless_installed("tensorboard")
def test_trackers_and_rollout_samples_change_nothing_in_metrics_jsonl(random_model_dir, tmp_path):
    """Logging reads the step's results and draws no random numbers: the same records, with
    the same fields, with or without trackers and rollout samples."""
    def untimed(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "train_seconds"}
                for r in read_metrics(run_dir / "metrics.jsonl")]

    plain = train(quick_config(random_model_dir, tmp_path / "plain", log_rollouts=0)).run_dir
    tracked = train(quick_config(random_model_dir, tmp_path / "tracked", report_to="tensorboard",
                                 log_rollouts=4)).run_dir
    assert untimed(tracked) == untimed(plain)
    assert [sorted(r) for r in read_metrics(tracked / "metrics.jsonl")] == \
        [sorted(r) for r in read_metrics(plain / "metrics.jsonl")]

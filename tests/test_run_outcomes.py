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

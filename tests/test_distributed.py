"""Two CPU processes (gloo) under `accelerate launch`: the tiny model trains a few steps."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from podsrl.config import make_config
from podsrl.metrics import read_metrics
from podsrl.trainer import train

ACCELERATE = shutil.which("accelerate", path=str(Path(sys.executable).parent))
# 4 prompts per step, generated in chunks of 2 prompts (2 x 8 rollouts): each process owns one chunk
OPTIONS = dict(model="tiny", method="pods", steps=3, prompts_per_step=4, n=8, m=2, generation_batch_size=16,
               lr=1e-3, warmup_steps=0, eval_prompts=16, eval_samples=2, eval_every=0, checkpoint_every=0,
               progress=False)

pytestmark = pytest.mark.skipif(ACCELERATE is None, reason="the accelerate launcher is not installed")


def launch(output_dir: Path, processes: int = 2, **overrides) -> subprocess.CompletedProcess:
    options = {**OPTIONS, **overrides, "output_dir": str(output_dir)}
    argv = [f"--{k}={v}" for k, v in options.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([ACCELERATE, "launch", "--multi_gpu", "--num_processes", str(processes),
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           "--main_process_port", "0", "-m", "podsrl.cli", "train", *argv],
                          capture_output=True, text=True, env=env, timeout=300)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model" / "model.safetensors"))


def sampled_batch_stats(run_dir: Path) -> list[tuple]:
    return [(r["reward_mean"], r["kept_reward_mean"], r["completion_len"])
            for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    done = launch(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, done


def test_two_processes_stay_in_sync_and_write_once(two_process_run):
    run_dir, done = two_process_run
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3]  # one writer: no duplicated lines
    assert all(r["rank_param_spread"] == 0.0 for r in records)  # identical parameters after every step
    assert json.loads((run_dir / "data.json").read_text())["processes"] == 2
    assert done.stdout.count("run directory:") == 1


def test_two_processes_match_one_process_over_the_same_prompts(two_process_run, tmp_path):
    run_dir, _ = two_process_run
    single = train(make_config(overrides={k: str(v) for k, v in {**OPTIONS, "output_dir": tmp_path / "one"}.items()}))
    # the same rollouts (sampling is seeded per chunk of prompts, not per process) ...
    assert sampled_batch_stats(run_dir) == sampled_batch_stats(single.run_dir)
    # ... and the same parameters, up to the order of float additions in the gradient average
    start = load_file(str(Path(__file__).parents[1] / "src/podsrl/assets/tiny/model.safetensors"))
    two, one = weights(run_dir), weights(single.run_dir)
    assert max(float((two[k] - start[k]).abs().max()) for k in start) > 1e-3  # it trained
    for key in two:
        assert torch.allclose(two[key], one[key], atol=1e-4), key


def test_two_process_resume_matches_the_uninterrupted_run(two_process_run, tmp_path):
    run_dir, _ = two_process_run
    part = tmp_path / "part"
    done = launch(part, steps=2, checkpoint_every=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (part / "checkpoints").iterdir()) == ["step_0000002"]
    done = launch(part, steps=3, resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sampled_batch_stats(part) == sampled_batch_stats(run_dir)
    resumed, uninterrupted = weights(part), weights(run_dir)
    assert all(torch.allclose(resumed[k], uninterrupted[k], atol=1e-6) for k in resumed)


def test_prompts_must_split_evenly_over_processes(tmp_path):
    done = launch(tmp_path / "odd", prompts_per_step=3, generation_batch_size=0)
    assert done.returncode != 0
    assert "prompts_per_step: 3 prompts cannot be split evenly over 2 processes" in done.stderr

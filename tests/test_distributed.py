"""Two CPU processes (gloo) under `accelerate launch`: the tiny model trains a few steps,
replicated (DDP) and sharded (FSDP2, fully and ZeRO-2 style), against one process."""

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
CONFIGS = Path(__file__).parents[1] / "configs" / "accelerate"
DDP = ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
# 4 prompts per step, generated in chunks of 2 prompts (2 x 8 rollouts): each process owns one chunk
OPTIONS = dict(model="tiny", method="pods", steps=3, prompts_per_step=4, n=8, m=2, generation_batch_size=16,
               lr=1e-3, warmup_steps=0, eval_prompts=16, eval_samples=2, eval_every=0, checkpoint_every=0,
               progress=False)

pytestmark = pytest.mark.skipif(ACCELERATE is None, reason="the accelerate launcher is not installed")


def launch(output_dir: Path, processes: int = 2, setup: tuple[str, ...] = tuple(DDP),
           **overrides) -> subprocess.CompletedProcess:
    """`accelerate launch` podsrl; ``setup``: DDP flags or ``--config_file`` of a shipped config."""
    options = {**OPTIONS, **overrides, "output_dir": str(output_dir)}
    argv = [f"--{k}={v}" for k, v in options.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([ACCELERATE, "launch", *setup, "--num_processes", str(processes), "--num_machines", "1",
                           "--main_process_port", "0", "-m", "podsrl.cli", "train", *argv],
                          capture_output=True, text=True, env=env, timeout=300)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The saved model's weights: the whole model, or the LoRA adapter."""
    full = run_dir / "model" / "model.safetensors"
    return load_file(str(full if full.exists() else run_dir / "model" / "adapter_model.safetensors"))


def sampled_batch_stats(run_dir: Path) -> list[tuple]:
    return [(r["reward_mean"], r["kept_reward_mean"], r["completion_len"])
            for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    overrides = {k: str(v) for k, v in {**OPTIONS, "output_dir": tmp_path_factory.mktemp("one") / "run"}.items()}
    return train(make_config(overrides=overrides)).run_dir


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


def assert_same_training(run_dir: Path, reference_dir: Path) -> None:
    # the same rollouts (sampling is seeded per chunk of prompts, not per process) ...
    assert sampled_batch_stats(run_dir) == sampled_batch_stats(reference_dir)
    # ... and the same parameters, up to the order of float additions in the gradient average
    two, one = weights(run_dir), weights(reference_dir)
    assert set(two) == set(one)
    if (run_dir / "model" / "model.safetensors").exists():
        start = load_file(str(Path(__file__).parents[1] / "src/podsrl/assets/tiny/model.safetensors"))
    else:  # LoRA: B starts at zero
        start = {k: torch.zeros_like(v) for k, v in one.items() if "lora_B" in k}
    assert max(float((two[k] - start[k]).abs().max()) for k in start) > 1e-4  # it trained
    for key in two:
        assert torch.allclose(two[key], one[key], atol=1e-4), key  # B after 3 steps: ~3e-3


def test_two_processes_match_one_process_over_the_same_prompts(two_process_run, one_process_run):
    assert_same_training(two_process_run[0], one_process_run)


@pytest.mark.parametrize("config", ["fsdp.yaml", "fsdp-zero2.yaml"])
def test_sharded_processes_match_one_process(config, one_process_run, tmp_path):
    done = launch(tmp_path / "run", setup=("--config_file", str(CONFIGS / config)))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert "rank_param_spread" not in records[0]  # sharded: no replicas to compare
    assert_same_training(tmp_path / "run", one_process_run)


def test_sharded_lora_matches_one_process(tmp_path):
    # slots decoding takes a different number of steps on each process: without gathering
    # the whole model first, the per-layer all-gathers fall out of step and hang (checked)
    lora = dict(lora_rank=4, generation_engine="slots", generation_micro_group=4)
    done = launch(tmp_path / "run", setup=("--config_file", str(CONFIGS / "fsdp-zero2.yaml")), **lora)
    assert done.returncode == 0, done.stderr[-3000:]
    train(make_config(overrides={k: str(v) for k, v in {**OPTIONS, **lora, "output_dir": tmp_path / "one"}.items()}))
    assert_same_training(tmp_path / "run", tmp_path / "one")


def test_sharded_run_resumes_a_one_process_checkpoint(one_process_run, tmp_path):
    # checkpoints hold whole tensors, so they move between process layouts
    part = tmp_path / "part"
    train(make_config(overrides={k: str(v) for k, v in {**OPTIONS, "output_dir": part, "steps": 2,
                                                         "checkpoint_every": 2}.items()}))
    done = launch(part, resume=True, setup=("--config_file", str(CONFIGS / "fsdp.yaml")))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_training(part, one_process_run)


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_asking_for_a_missing_gpu_names_the_field():
    from podsrl.distributed import Processes

    assert Processes().device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device: 'cuda:1', but torch sees no CUDA GPU"):
        Processes().device("cuda:1")

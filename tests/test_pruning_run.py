"""prune_running in a run (#72): configured, refused where it cannot apply, acted on, and part of
the run (the quality head checkpointed and restored: a resumed run repeats an uninterrupted one)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from podsrl.trainer import train
from podsrl.trainer.config import Config, validate

PRUNING = dict(generation_engine="slots", generation_schedule="round_robin", generation_micro_group=32,
               group_early_stop=True, correct_weight=1.0, format_weight=0.0, prompts_per_step=8, num_generations=8,
               eval_steps=0, eval_prompts=16, eval_samples=1, save_steps=3, progress=False, prune_running=True,
               prune_warmup_steps=1, prune_points="0.25,0.5,1")


@pytest.mark.parametrize("change, line", [
    (dict(group_early_stop=False), "prune_running: needs group_early_stop true"),
    (dict(prune_points="0.5,0.25"), "prune_points: distinct ascending fractions"),
    (dict(prune_rule="bold"), "prune_rule: unknown 'bold'; use one of finished, sure"),
    (dict(prune_threshold=0.5), "prune_threshold: must be"),
])
def test_it_is_refused_in_one_line_where_it_cannot_apply(change, line):
    with pytest.raises(ValueError) as refused:
        validate(Config(**{**PRUNING, **change}))
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)


def records(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("partial", [dict(), dict(partial_rollouts=True, partial_extra_prompts=2, prune_threshold=0.6),
                                     dict(dynamic_sampling=True, dynamic_sampling_rounds=2, prune_threshold=0.6)],
                         ids=["whole-steps", "partial-rollouts", "dynamic-sampling"])
def test_a_run_prunes_logs_it_and_resumes_to_the_same_steps(tmp_path, partial):
    """With partial rollouts and with dynamic sampling too (a pruned carried sample is dropped; a
    refill round gets its own pruner); the head learns the complete groups' judged samples."""
    cfg = Config(**PRUNING, **partial, max_steps=6, output_dir=str(tmp_path / "run"))
    train(cfg)
    steps = [r for r in records(tmp_path / "run") if "rollouts_generated" in r]
    assert len(steps) == 6 and all("pruned_samples" in r and "prune_auc_0" in r for r in steps)
    assert steps[0]["pruned_samples"] == 0  # the warm-up step only watches
    assert sum(r["pruned_samples"] for r in steps) > 0  # and later steps prune
    train(dataclasses.replace(cfg, max_steps=3, output_dir=str(tmp_path / "resumed")))
    train(dataclasses.replace(cfg, output_dir=str(tmp_path / "resumed"), resume=True))

    def late(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "train_seconds"}
                for r in rows if r["step"] > 3]
    assert late(records(tmp_path / "resumed")) == late(records(tmp_path / "run")) and len(late(steps)) == 3


PRUNING_ARGS = ["--generation_engine", "slots", "--generation_schedule", "round_robin", "--generation_micro_group",
                "32", "--group_early_stop", "true", "--correct_weight", "1", "--format_weight", "0",
                "--prompts_per_step", "8", "--num_generations", "8", "--prune_running", "true",
                "--prune_warmup_steps", "1", "--prune_points", "0.25,0.5,1", "--max_steps", "6", "--save_steps", "1",
                "--eval_steps", "0", "--eval_prompts", "16", "--eval_samples", "1", "--progress", "false"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_a_pruning_run_killed_at_a_random_step_resumes_to_the_uninterrupted_run(tmp_path, seed):
    """SIGKILL once the head has learned (its sums in the checkpoint's parts), at a step drawn from
    the seed; the resumed run's records and weights are the uninterrupted run's."""
    import random
    import signal
    import subprocess
    import sys

    import torch

    from tests.test_reliability import CHILD, REPO, start, training_records, wait_for_step, weights

    def run(out, *extra):
        return subprocess.run([sys.executable, "-c", CHILD, "train", *PRUNING_ARGS, "--output_dir", str(out), *extra],
                              cwd=REPO, capture_output=True, text=True, timeout=600)

    whole = run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    assert sum(r.get("pruned_samples", 0) for r in records(tmp_path / "whole")) > 0
    out = tmp_path / "killed"
    process = start(["train", *PRUNING_ARGS, "--output_dir", str(out)])
    wait_for_step(out, random.Random(seed).randint(2, 4), process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    resumed = run(out, "--resume", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert training_records(out) == training_records(tmp_path / "whole")
    a, b = weights(out), weights(tmp_path / "whole")
    assert all(torch.equal(a[k], b[k]) for k in a)

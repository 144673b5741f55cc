"""podsrl's trainer on the vllm engine (vLLM's CPU backend), end to end: a seeded run repeats,
a resumed run matches the uninterrupted one (the engine is rebuilt from the restored
weights), a run learns as on the hf engine, the step logs the engine's log-prob gap and
weight pushes, a signal stops it leaving no engine process, and the refusals."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: scripts/test_vllm.sh runs these in .venv-vllm")

from podsrl.metrics import read_metrics  # noqa: E402
from podsrl.rollout import Sampling
from podsrl.trainer import train  # noqa: E402
from podsrl.trainer.config import make_config  # noqa: E402
from tests.conftest import default_signals  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def quick_config(output_dir, **overrides):
    values = dict(model="tiny", generation_engine="vllm", vllm_enforce_eager=True, max_steps=4, prompts_per_step=4,
                  num_generations=8,
                  num_kept=4, eval_prompts=16, eval_samples=2, eval_steps=0, save_steps=0, progress=False,
                  output_dir=str(output_dir))
    values.update(overrides)
    return make_config(overrides={k: str(v) for k, v in values.items()})


def training_records(run_dir):
    """Every field but timings (the weight-push seconds are a timing too)."""
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k not in ("train_seconds",
                                                                                   "weight_sync_seconds")}
            for r in read_metrics(Path(run_dir) / "metrics.jsonl")]


def final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return train(quick_config(tmp_path_factory.mktemp("full") / "run")).run_dir


def test_a_seeded_run_repeats_and_logs_the_engines_numbers(full_run, tmp_path):
    again = train(quick_config(tmp_path / "again")).run_dir
    assert training_records(again) == training_records(full_run)
    steps = [r for r in read_metrics(full_run / "metrics.jsonl") if r["step"] > 0]
    assert all(r["sampling_logp_difference_mean"] < 1e-4 for r in steps)  # float32: the same numerics
    assert all(0.9 < r["importance_sampling_weight_mean"] <= 1.1 for r in steps)
    assert all(r["weight_sync_seconds"] > 0 for r in steps[1:])  # a push after every optimizer step


def test_a_resumed_run_matches_the_uninterrupted_one(full_run, tmp_path):
    part = tmp_path / "part"
    train(quick_config(part, max_steps=2, save_steps=2))
    (part / "model").rename(part / "model_at_2")
    resumed = train(quick_config(part, resume=True)).run_dir
    records, expected = training_records(resumed), training_records(full_run)

    def without_eval(rows):
        return [{k: v for k, v in r.items() if not k.startswith("eval_")} for r in rows]

    assert without_eval(records) == without_eval(expected)
    assert records[-1] == expected[-1]  # the final evaluation too
    a, b = final_weights(resumed), final_weights(full_run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_main_jobs_settings_learn_on_the_vllm_engine(tmp_path):
    """The main job (tiny model, arithmetic level 3, PODS 16 -> 4, 16 prompts per step) for 40
    steps: sampled held-out accuracy rises from ~59% as on the hf engine, and so does the
    training reward (docs/generation.md has the full 150-step run on both engines)."""
    result = train(quick_config(tmp_path / "main", max_steps=40, prompts_per_step=16, num_generations=16,
                                eval_prompts=300, eval_samples=4, eval_steps=0, learning_rate=2e-4))
    records = read_metrics(result.run_dir / "metrics.jsonl")
    rewards = [r["reward_mean"] for r in records if r["step"] > 0]
    assert result.initial["eval_accuracy"] < 0.65
    assert result.final["eval_accuracy"] > result.initial["eval_accuracy"] + 0.15
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.05


def test_partial_rollouts_train_on_the_vllm_engine_and_resume_exactly(tmp_path):
    """Partial rollouts with the vllm engine: groups carried between steps (cut-off samples
    resumed as new requests), staleness within the bound, every token weighed by pi / pi_vLLM
    (importance weights near 1: float32 numerics, and a stale token's ratio is its staleness);
    a resumed run repeats the uninterrupted one with the groups in flight in the checkpoint."""
    partial = dict(partial_rollouts=True, max_completion_length=12, generation_batch_size=0)
    straight = train(quick_config(tmp_path / "straight", save_steps=2, **partial)).run_dir
    steps = [r for r in read_metrics(straight / "metrics.jsonl") if r["step"] > 0]
    assert len(steps) == 4 and all(r["partial_groups_carried"] >= 2 for r in steps)
    assert sum(r["partial_samples_resumed"] for r in steps) > 0
    assert all(r["staleness_max"] <= 2 for r in steps) and any(r["off_policy_token_frac"] > 0 for r in steps)
    assert all(0.5 < r["importance_sampling_weight_mean"] < 1.5 for r in steps)
    part = tmp_path / "part"
    train(quick_config(part, max_steps=2, save_steps=2, **partial))
    resumed = train(quick_config(part, resume=True, save_steps=2, **partial)).run_dir

    def without_eval(rows):
        return [{k: v for k, v in r.items() if not k.startswith("eval_")} for r in rows]

    assert without_eval(training_records(resumed)) == without_eval(training_records(straight))
    with pytest.raises(ValueError, match="^partial_stale_correction: 'mask' leaves out"):
        make_config(overrides={"generation_engine": "vllm", "partial_rollouts": "true",
                               "partial_stale_correction": "mask"})


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="^generation_memory_mb: .*vllm_kv_cache_memory_mb"):
        make_config(overrides={"generation_engine": "vllm", "generation_memory_mb": "100"})
    with pytest.raises(ValueError, match="^vllm_enable_sleep_mode: .*refused on the CPU"):
        make_config(overrides={"generation_engine": "vllm", "vllm_enable_sleep_mode": "true"})
    with pytest.raises(ValueError, match="^vllm_importance_sampling_clip_min: 4.0 is above"):
        make_config(overrides={"generation_engine": "vllm", "vllm_importance_sampling_clip_min": "4"})
    with pytest.raises(ValueError, match="^group_early_stop: generation_engine vllm does not stop groups early"):
        make_config(overrides={"generation_engine": "vllm", "group_early_stop": "true"})


def test_a_sequence_length_that_would_cut_completions_short_is_refused_before_anything_is_written(tmp_path):
    """vLLM cuts a sequence at max_model_len without a word (every completion 4 tokens long, a
    run at 0% that 'succeeds'), and refuses a longer prompt with a long traceback: refused at
    set-up over every prompt, and by the engine for any call that does not fit."""
    from podsrl.models import load_model
    from podsrl.rollout import VLLMEngine, VLLMOptions

    for length in (24, 8):  # below prompt + completion; below the prompt itself
        with pytest.raises(ValueError, match=r"^vllm_max_model_length: the longest prompt \(\d+ tokens\) plus "
                                             rf"max_completion_length \(16\) needs \d+ tokens, but "
                                             rf"vllm_max_model_length is {length}"):
            train(quick_config(tmp_path / f"run{length}", vllm_max_model_length=length,
                               max_completion_length=16))
        assert not (tmp_path / f"run{length}").exists()
    bundle = load_model("tiny")
    engine = VLLMEngine(VLLMOptions(max_completion_length=16, max_model_length=24))
    with pytest.raises(ValueError, match="^vllm_max_model_length: .* needs"):
        engine.generate(bundle.model, bundle.tokenizer, ["What is 12 + 30? Answer in format: 'Answer: {result}'"], 2,
                        Sampling(max_completion_length=16))
    assert engine.llm is None  # refused before the engine was built


CHILD = "import sys; from podsrl.cli import main; raise SystemExit(main(sys.argv[1:]))"


def engine_processes() -> set[int]:
    done = subprocess.run(["pgrep", "-f", "EngineCore"], capture_output=True, text=True)
    return {int(pid) for pid in done.stdout.split()}


def test_sigterm_stops_the_run_with_a_checkpoint_and_leaves_no_engine_process(tmp_path):
    out = tmp_path / "run"
    before = engine_processes()
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, "train", "--generation_engine", "vllm", "--vllm_enforce_eager", "true",
         "--max_steps", "200", "--save_steps",
         "0", "--eval_prompts", "16", "--eval_steps", "0", "--progress", "false", "--output_dir", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    deadline = time.time() + 240
    while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < 3:
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, "no step within the time limit"
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert "stopped by SIGTERM" in stderr and "--resume true" in stderr
    # vLLM's log goes to stderr (stdout carries podsrl's results), without the warnings podsrl's
    # way of running it makes expected (a chat-template warm-up traceback, a tied head not pushed)
    assert "INFO" not in stdout and "WARNING" not in stdout, stdout[-2000:]
    assert "vLLM" in stderr or "vllm" in stderr
    for expected in ("Traceback", "Chat template warmup failed", "Using None for EOS", "Failed to load weights"):
        assert expected not in stderr, expected
    assert (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir())
    assert engine_processes() <= before  # the engine ran in the trainer's process and went with it
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] < 200


def test_two_processes_each_with_an_engine_match_one_process(tmp_path):
    """DDP under `accelerate launch` (two gloo processes): each process builds its own engine
    beside torch.distributed (vLLM's external_launcher) and pushes the weights every step. The
    rollouts are seeded per chunk of prompts, so two processes sample what one samples, and the
    parameters stay identical across processes."""
    from tests.test_distributed import OPTIONS, SharedLaunch, one_process, steps, weights

    engine = dict(generation_engine="vllm", vllm_enforce_eager=True)
    launch = SharedLaunch(tmp_path)
    launch.add("two", tmp_path / "two", **engine)
    done = launch.run().result("two")
    assert done.returncode == 0, done.stderr[-3000:]
    two, one = steps(tmp_path / "two"), steps(one_process(tmp_path / "one", **engine))
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, OPTIONS["max_steps"] + 1))
    for a, b in zip(two, one):
        assert a["rank_param_spread"] == 0.0 and a["sampling_logp_difference_mean"] < 1e-4
        for key in ("reward_mean", "kept_reward_mean", "kept_reward_std", "completion_len", "correct_rate"):
            assert a[key] == b[key], (a["step"], key)  # the same rollouts
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4) and b["grad_norm"] > 1e-3
        # the loss is ~0 (advantages sum to zero per group) times importance weights 1 +- 1e-7
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    w2, w1 = weights(tmp_path / "two"), weights(tmp_path / "one")
    assert w2.keys() == w1.keys() and all(torch.allclose(w2[k], w1[k], atol=1e-5) for k in w1)


def test_a_killed_runs_engine_config_folder_is_removed_by_the_next_engine(tmp_path):
    """SIGKILL gives a run no chance to remove its engine's config folder (tempdir/podsrl-vllm-*);
    the next engine to start removes it (its owner file names a process that is gone)."""
    import tempfile

    from podsrl.models import load_model
    from podsrl.rollout import VLLMEngine, VLLMOptions
    from podsrl.rollout.vllm_folders import CONFIG_FOLDER_PREFIX

    def folders() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob(f"{CONFIG_FOLDER_PREFIX}*"))

    before, out = folders(), tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, "train", "--generation_engine", "vllm", "--vllm_enforce_eager", "true",
         "--max_steps", "200", "--eval_prompts", "16", "--progress", "false", "--output_dir", str(out)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (out / "metrics.jsonl").exists():  # the step-0 evaluation ran: the engine was built
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, "no evaluation within the time limit"
        time.sleep(0.2)
    process.kill()
    process.communicate(timeout=60)
    left = folders() - before
    assert len(left) == 1, "a killed run leaves its engine's config folder"
    bundle = load_model("tiny")
    engine = VLLMEngine(VLLMOptions(max_completion_length=4, enforce_eager=True))
    try:
        engine.generate(bundle.model, bundle.tokenizer, ["What is 1 + 2?"], 1, Sampling(max_completion_length=4))
        assert not left & folders(), "the next engine removes it"
    finally:
        engine.close()

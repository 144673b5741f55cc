"""Reliability: exact resume after SIGKILL, clean stop on SIGINT/SIGTERM, corrupt
checkpoints, non-finite steps, degenerate groups, tokenizers without a pad token."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from podsrl import update
from podsrl.metrics import read_metrics
from podsrl.models import load_model
from podsrl.trainer import train
from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.trainer.config import make_config
from podsrl.trainer.stops import Signals, TrainingStopped
from tests.conftest import default_signals

REPO = Path(__file__).resolve().parents[1]


def run_args(model_dir, out, steps, *extra):
    return ["train", "--model", model_dir, "--task", "parity", "--max_steps", str(steps), "--prompts_per_step", "4",
            "--num_generations", "6", "--num_kept", "3", "--max_completion_length", "6", "--eval_prompts", "8",
            "--eval_samples", "1", "--eval_steps", "0", "--save_steps", "1", "--learning_rate", "1e-3",
            "--warmup_steps", "0", "--progress", "false", "--output_dir", str(out), *extra]


CHILD = "import sys, tests.conftest; from podsrl.cli import main; raise SystemExit(main(sys.argv[1:]))"


def start(args):
    """``podsrl`` with ``args`` in a child that the tests' signals reach (:func:`default_signals`)."""
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)


def wait_for_step(run_dir, step, process, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and any(json.loads(line)["step"] >= step for line in path.read_text().splitlines() if line):
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise TimeoutError(f"step {step} not reached")


def weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def training_records(run_dir, evaluations=False):
    """The metrics records without their timings (and, unless ``evaluations``, their evaluations)."""
    left_out = ("time_",) if evaluations else ("time_", "eval_")
    return [{k: v for k, v in r.items() if not k.startswith(left_out) and k != "train_seconds"}
            for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def uninterrupted(random_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "run"
    done = subprocess.run([sys.executable, "-c", CHILD, *run_args(random_model_dir, out, 6)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.slow
def test_sigkill_then_resume_is_exact(random_model_dir, tmp_path, uninterrupted):
    out = tmp_path / "run"
    process = start(run_args(random_model_dir, out, 6))
    wait_for_step(out, 3, process)
    process.send_signal(signal.SIGSTOP)  # freeze it, then check the kill lands mid-run
    assert process.poll() is None, "the run finished before it could be killed"
    killed_at = read_metrics(out / "metrics.jsonl")[-1]["step"]
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL and killed_at < 6
    assert not (out / "summary.json").exists() and not (out / "model").exists()
    assert list_checkpoints(out / "checkpoints"), "a checkpoint existed before the kill"
    resumed = subprocess.run([sys.executable, "-c", CHILD, *run_args(random_model_dir, out, 6, "--resume", "true")],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    assert training_records(out) == training_records(uninterrupted)
    a, b = weights(out), weights(uninterrupted)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # elapsed training time continues from the checkpoint instead of restarting at 0
    times = [r["train_seconds"] for r in read_metrics(out / "metrics.jsonl")]
    assert times == sorted(times)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_cleanly_with_a_checkpoint_then_resumes_exactly(random_model_dir, tmp_path, uninterrupted,
                                                                     sig, code):
    out = tmp_path / "run"
    process = start(run_args(random_model_dir, out, 6, "--save_steps", "0"))
    wait_for_step(out, 2, process)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == code
    assert "--resume true" in stderr and signal.Signals(sig).name in stderr
    stopped_at = read_metrics(out / "metrics.jsonl")[-1]["step"]
    assert stopped_at < 6 and [int(p.name.split("_")[1]) for p in list_checkpoints(out / "checkpoints")] == [stopped_at]
    resumed = subprocess.run([sys.executable, "-c", CHILD, *run_args(random_model_dir, out, 6, "--resume", "true")],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert training_records(out) == training_records(uninterrupted)
    a, b = weights(out), weights(uninterrupted)
    assert all(torch.equal(a[k], b[k]) for k in a)


def kill_mid_run(process):
    """SIGKILL, as a preempted machine ends a job, known to land before the run's end."""
    process.send_signal(signal.SIGSTOP)  # freeze it, then check the kill lands mid-run
    assert process.poll() is None, "the run finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    return process.communicate()[1]


@pytest.mark.slow
def test_resume_auto_starts_a_new_run_then_after_a_kill_resumes_it_exactly(random_model_dir, tmp_path,
                                                                           uninterrupted):
    """A job script that always passes --resume auto (preemptible machines; verl's resume_mode
    auto): the first start finds no run and starts one; killed after a checkpoint, the same
    command resumes it and ends as the uninterrupted run."""
    out = tmp_path / "run"
    args = run_args(random_model_dir, out, 6, "--resume", "auto")
    process = start(args)
    wait_for_step(out, 3, process)
    first = kill_mid_run(process)
    assert f"resume auto: {out} holds no run yet (nothing to resume); starting a new run there" in first
    assert list_checkpoints(out / "checkpoints") and not (out / "summary.json").exists()
    again = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"resume auto: {out} holds a checkpoint; resuming the run from the newest that loads" in again.stderr
    assert "resumed from" in again.stderr and json.loads((out / "config.json").read_text())["resume"] is False
    assert training_records(out) == training_records(uninterrupted)
    a, b = weights(out), weights(uninterrupted)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_resume_auto_after_a_kill_before_the_first_checkpoint_starts_the_run_afresh(random_model_dir, tmp_path,
                                                                                     uninterrupted):
    """--resume true refuses a run killed before its first checkpoint (nothing to resume), so a
    job script that always passes it failed there; --resume auto starts it afresh in its folder."""
    from podsrl.run_folder.claim import stopped_before_first_checkpoint

    out = tmp_path / "run"
    args = run_args(random_model_dir, out, 6, "--save_steps", "0", "--resume", "auto")
    process = start(args)
    wait_for_step(out, 1, process)
    kill_mid_run(process)
    assert stopped_before_first_checkpoint(out) and not list_checkpoints(out / "checkpoints")
    again = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    assert (f"resume auto: {out} holds a run that stopped before its first checkpoint (nothing to resume); "
            f"starting it afresh") in again.stderr and "resumed from" not in again.stderr
    assert training_records(out) == training_records(uninterrupted)
    a, b = weights(out), weights(uninterrupted)
    assert all(torch.equal(a[k], b[k]) for k in a)

def test_a_second_ctrl_c_interrupts_at_once():
    """The first SIGINT asks for a clean stop after the step; the second raises
    KeyboardInterrupt immediately; the previous handlers come back afterwards."""
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with Signals() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before os.kill returns (same thread)
        assert stop.signum == signal.SIGINT  # a request, no exception
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    with Signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # a Ctrl-C after a SIGTERM does not wait either
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == previous


# a Ctrl-C while the command starts: the config's modules import torch and transformers, which
# take seconds (here: a minute)
SLOW_IMPORT = """import sys, time
class SlowCli:
    def find_spec(self, name, path=None, target=None):
        if name == "podsrl.trainer.config":
            print("importing", flush=True)
            time.sleep(60)
sys.meta_path.insert(0, SlowCli())
from podsrl.entry import main
raise SystemExit(main(sys.argv[1:]))
"""
STOPPED_STARTING = ("podsrl train: stopped by SIGINT; the run had not begun, nothing was written: run the same "
                    "command again")
# a Ctrl-C while the model loads (here: 2 s longer), after the run folder is claimed
SLOW_LOAD = """import sys, time, tests.conftest
import podsrl.trainer.setup as setup
real = setup.load_model
def slow(*args, **kwargs):
    print("loading", flush=True)
    time.sleep(2)
    return real(*args, **kwargs)
setup.load_model = slow
from podsrl.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["importing", "loading"])
def test_a_ctrl_c_during_start_up_is_one_line_exit_130_and_leaves_what_a_stopped_run_leaves(
        random_model_dir, tmp_path, moment):
    """Before the first step: while podsrl's libraries import, nothing is written; while the
    model loads, the run stops once set up, without evaluating, its folder as a run stopped
    before its first checkpoint leaves it, which the same command starts afresh."""
    from podsrl.run_folder.claim import stopped_before_first_checkpoint

    out = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", SLOW_IMPORT if moment == "importing" else SLOW_LOAD,
                                *run_args(random_model_dir, out, 2)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    assert process.stdout.readline().strip() == moment
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    if moment == "importing":
        assert lines == [STOPPED_STARTING]
        assert not out.exists()
        return
    assert lines[-2:] == ["SIGINT: stopping once the run is set up, before its first step ... (again: stop at once)",
                          "podsrl train: stopped by SIGINT during set-up; last checkpoint: none; nothing to resume: "
                          "run the same command again to start afresh (podsrl reuses the folder)"]
    assert stopped_before_first_checkpoint(out) and not (out / "metrics.jsonl").exists()
    assert train(quick(random_model_dir, out, max_steps=1)).steps == 1



def ignoring_sigint() -> None:
    """For preexec_fn: the child starts as a shell script's ``podsrl train ... &`` does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_a_run_started_ignoring_sigint_still_stops_on_one_while_it_starts(random_model_dir, tmp_path):
    """Python keeps an inherited SIG_IGN, so a background job's podsrl lost a SIGINT during its
    imports, though the trainer takes one as a clean stop from set-up on: podsrl takes SIGINT
    from its start (podsrl.entry.take_sigint)."""
    process = subprocess.Popen([sys.executable, "-c", SLOW_IMPORT, *run_args(random_model_dir, tmp_path / "run", 2)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ignoring_sigint)
    assert process.stdout.readline().strip() == "importing"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == [STOPPED_STARTING]


def quick(model_dir, out, **overrides):
    values = dict(model=model_dir, task="parity", max_steps=3, prompts_per_step=4, num_generations=6, num_kept=3,
                  max_completion_length=6,
                  eval_prompts=8, eval_samples=1, eval_steps=0, save_steps=1, progress=False,
                  output_dir=str(out), learning_rate=1e-3, warmup_steps=0, save_total_limit=3)
    values.update(overrides)
    return make_config(overrides={k: str(v) for k, v in values.items()})


@pytest.mark.slow
def test_corrupt_checkpoint_is_skipped_for_the_previous(random_model_dir, tmp_path, capfd):
    full = train(quick(random_model_dir, tmp_path / "full", max_steps=4)).run_dir
    out = tmp_path / "run"
    train(quick(random_model_dir, out, max_steps=3))
    newest = list_checkpoints(out / "checkpoints")[-1]
    (newest / "trainable.pt").write_bytes((newest / "trainable.pt").read_bytes()[:100])  # truncated
    train(quick(random_model_dir, out, max_steps=4, resume=True))
    err = capfd.readouterr().err
    assert f"checkpoint {newest} is unreadable" in err and "step_0000002" in err
    assert training_records(out) == training_records(full)


@pytest.mark.slow
def test_a_checkpoint_holding_another_prompt_selectors_state_does_not_fit_and_is_skipped_or_refused(
        random_model_dir, tmp_path, capfd):
    """A selector's load_state_dict that meets another selector's state (KeyError: 'posterior')
    is the checkpoint not fitting, like a model's: skipped for the previous one with a warning,
    or, none fitting, the resume refused in one line with nothing changed."""
    from podsrl.run_folder.claim import RunDirError

    full = train(quick(random_model_dir, tmp_path / "full", max_steps=4)).run_dir
    out = tmp_path / "run"
    train(quick(random_model_dir, out, max_steps=3))
    newest = list_checkpoints(out / "checkpoints")[-1]
    parts = torch.load(newest / "parts.pt", weights_only=True)
    torch.save([{**parts[0], "prompt_selector": {"posterior": {}, "rng": {}}}], newest / "parts.pt")
    train(quick(random_model_dir, out, max_steps=4, resume=True))
    err = capfd.readouterr().err
    assert (f"warning: checkpoint {newest} does not fit this run: its prompt_selector state is not shuffled's "
            f"(KeyError: 'epoch'; written with another prompt_selector?); trying the previous one") in err
    assert "resumed from" in err and "step_0000002" in err and "Traceback" not in err
    assert training_records(out) == training_records(full)

    config = json.loads((out / "config.json").read_text())  # as if the run had been started with pass_rate
    (out / "config.json").write_text(json.dumps({**config, "prompt_selector": "pass_rate"}))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(RunDirError, match=r"^resume: no usable checkpoint .* none loads into this model and config"):
        train(quick(random_model_dir, out, max_steps=5, resume=True, prompt_selector="pass_rate"))
    assert "its prompt_selector state is not pass_rate's (KeyError: 'posterior'" in capfd.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".podsrl.lock"} == {
        p: data for p, data in before.items() if p.name != ".podsrl.lock"}


def evaluations_that(monkeypatch, misbehave):
    """Patch the held-out evaluation the run's Evaluator calls: ``misbehave(call)`` runs first
    at each call (0 = the run's start); returns the calls made."""
    from podsrl.trainer import evaluate as run_module

    real, calls = run_module.evaluate, []

    def evaluate(*args, **kwargs):
        calls.append(len(calls))
        misbehave(calls[-1])
        return real(*args, **kwargs)
    monkeypatch.setattr(run_module, "evaluate", evaluate)
    return calls


def sigterm_then(sleep: bool) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # a first signal, as a scheduler sends it
    if sleep:
        time.sleep(600)  # an evaluation that goes on far longer than the grace


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "during"])
def test_a_signal_does_not_wait_for_an_evaluation_and_the_resumed_run_evaluates_that_step(
        random_model_dir, tmp_path, monkeypatch, when):
    """A SIGTERM that comes while the step runs (the evaluation due after it is then not
    begun) or while the evaluation runs (it gets the grace, then is cut short) stops the run
    within seconds with the step checkpointed; the resumed run evaluates that step first, so
    its metrics (evaluations included) and weights equal an uninterrupted run's."""
    from podsrl.trainer.jobs import RunLog

    settings = dict(max_steps=4, eval_steps=2, save_steps=0, log_rollouts=2)
    full = train(quick(random_model_dir, tmp_path / "full", **settings)).run_dir
    if when == "before":
        step_record = RunLog.step_record

        def signal_in_step_2(run, *args):
            if run.state.step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # a first signal: a stop after the step
            return step_record(run, *args)
        monkeypatch.setattr(RunLog, "step_record", signal_in_step_2)
    calls = evaluations_that(monkeypatch, lambda call: call == 1 and when == "during" and sigterm_then(sleep=True))
    out, start = tmp_path / "run", time.monotonic()
    with pytest.raises(TrainingStopped) as stopped:
        train(quick(random_model_dir, out, **settings))
    assert time.monotonic() - start < 60 and stopped.value.signum == signal.SIGTERM
    assert str(stopped.value).startswith("stopped by SIGTERM after step 2, before its evaluation; checkpoint ")
    assert calls == ([0] if when == "before" else [0, 1])  # the start's, and step 2's cut short
    assert [c.name for c in list_checkpoints(out / "checkpoints")] == ["step_0000002"]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1]  # step 2's record is held back
    monkeypatch.undo()
    # resumed to step 2 only, then again from the same checkpoint to step 4: step 2 is logged once
    train(quick(random_model_dir, out, **{**settings, "max_steps": 2}, resume=True))
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2]
    train(quick(random_model_dir, out, **settings, resume=True))
    assert training_records(out, evaluations=True) == training_records(full, evaluations=True)
    assert "eval_accuracy" in read_metrics(out / "metrics.jsonl")[2]
    assert (out / "rollouts.jsonl").read_text() == (full / "rollouts.jsonl").read_text()
    a, b = weights(out), weights(full)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("evaluation", ["hangs", "returns"])
def test_a_signal_during_the_first_evaluation_stops_before_any_step(random_model_dir, tmp_path, monkeypatch,
                                                                    evaluation):
    """A SIGTERM while the run evaluates its start: an evaluation that goes on is cut short
    after the grace, one that returns is followed by no step; either way nothing is
    checkpointed, the line says to run the same command again, and that run is a whole one."""
    evaluations_that(monkeypatch, lambda call: sigterm_then(sleep=evaluation == "hangs"))
    out, start = tmp_path / "run", time.monotonic()
    with pytest.raises(TrainingStopped) as stopped:
        train(quick(random_model_dir, out))
    assert time.monotonic() - start < 60 and stopped.value.signum == signal.SIGTERM
    where = "in evaluation after step 0" if evaluation == "hangs" else "before step 1"
    assert str(stopped.value) == (f"stopped by SIGTERM {where}; last checkpoint: none; nothing to resume: run the "
                                  f"same command again to start afresh (podsrl reuses the folder)")
    assert not list_checkpoints(out / "checkpoints")
    monkeypatch.undo()
    full = train(quick(random_model_dir, tmp_path / "full")).run_dir
    train(quick(random_model_dir, out))
    assert training_records(out, evaluations=True) == training_records(full, evaluations=True)


def test_non_finite_steps_are_skipped_then_stop_the_run(random_model_dir, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = update.policy_loss

    def poisoned(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        calls["n"] += 1
        # one micro-batch per step here (12 sequences <= micro_batch_size): steps 1-2 stay finite
        return (loss * float("nan") if calls["n"] > 2 else loss), stats

    monkeypatch.setattr(update, "policy_loss", poisoned)
    with pytest.raises(TrainingStopped, match="3 consecutive steps had a non-finite loss"):
        train(quick(random_model_dir, tmp_path / "run", max_steps=10, max_consecutive_skips=3))
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["skipped_step"] for r in records[1:]] == [0, 0, 1, 1, 1]
    last_good = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    saved = torch.load(last_good / "trainable.pt")
    assert all(torch.isfinite(v).all() for v in saved.values())


def test_a_non_finite_gradient_with_a_finite_loss_skips_the_step(random_model_dir, tmp_path, monkeypatch):
    real = update.policy_loss

    def nan_gradient(logp, *args, **kwargs):
        loss, stats = real(logp, *args, **kwargs)
        # value 0, derivative 0 * inf = nan: the loss stays finite, every gradient turns nan
        return loss + torch.sqrt((logp * 0).sum().abs()), stats

    monkeypatch.setattr(update, "policy_loss", nan_gradient)
    run = train(quick(random_model_dir, tmp_path / "run", max_steps=2, max_consecutive_skips=5)).run_dir
    records = read_metrics(run / "metrics.jsonl")[1:]
    assert all(r["skipped_step"] == 1 and r["loss"] is not None and r["grad_norm"] is None for r in records)
    start = load_model(random_model_dir).model.state_dict()
    saved = torch.load(list_checkpoints(run / "checkpoints")[-1] / "trainable.pt", weights_only=True)
    assert all(torch.equal(saved[k], start[k]) for k in saved)  # no step was taken, not even weight decay


def test_accuracy_comes_from_the_task_when_reward_funcs_replace_the_reward(random_model_dir, tmp_path):
    rewards = tmp_path / "constant_rewards.py"
    rewards.write_text("def constant(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    run = train(quick(random_model_dir, tmp_path / "run", reward_funcs=f"{rewards}:constant", max_steps=2)).run_dir
    sys.modules.pop("constant_rewards", None)
    records = read_metrics(run / "metrics.jsonl")
    # the reward is the user's (constant), the accuracy the parity task's own correctness (~50%)
    assert all(r["reward_mean"] == 1.0 and r["kept_reward_std"] == 0.0 for r in records[1:])
    assert all(0.0 < r["correct_rate"] < 1.0 for r in records[1:])
    assert 0.0 < records[-1]["eval_accuracy"] < 1.0


@pytest.mark.parametrize("n, m, method", [(4, 4, "pods"), (2, 2, "pods"), (2, 2, "grpo-ga")])
def test_degenerate_groups_give_finite_losses(random_model_dir, tmp_path, n, m, method):
    result = train(quick(random_model_dir, tmp_path / "run", num_generations=n, num_kept=m, method=method, max_steps=2))
    for record in read_metrics(result.run_dir / "metrics.jsonl")[1:]:
        assert record["loss"] is not None and record["skipped_step"] == 0


@pytest.mark.parametrize("method", ["pods", "grpo", "grpo-ga"])
def test_a_group_of_one_is_refused_from_python_too(random_model_dir, tmp_path, method):
    # a group of one trained rollout has advantage 0 always (the command line refuses it too)
    cfg = dataclasses.replace(quick(random_model_dir, tmp_path / "run"), method=method, num_generations=1,
                              num_kept=1)
    with pytest.raises(ValueError, match="must be at least 2"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_all_none_rewards_are_unverifiable_not_nan(random_model_dir, tmp_path):
    rewards = tmp_path / "none_rewards.py"
    rewards.write_text("def nothing(prompts, completions, **kw):\n    return [None] * len(completions)\n")
    result = train(quick(random_model_dir, tmp_path / "run", reward_funcs=f"{rewards}:nothing", max_steps=2))
    record = read_metrics(result.run_dir / "metrics.jsonl")[-1]
    assert record["unverifiable"] == 4 * 6 and record["loss"] == 0.0 and record["kept_reward_std"] == 0.0
    sys.modules.pop("none_rewards", None)


def test_tokenizer_without_pad_token(random_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    tokenizer.pad_token = None
    path = tmp_path / "no_pad"
    tokenizer.save_pretrained(path)
    AutoModelForCausalLM.from_pretrained(random_model_dir).save_pretrained(path)
    assert AutoTokenizer.from_pretrained(path).pad_token is None
    bundle = load_model(str(path))
    assert bundle.tokenizer.pad_token == bundle.tokenizer.eos_token and bundle.tokenizer.padding_side == "left"
    train(quick(str(path), tmp_path / "run", max_steps=1))

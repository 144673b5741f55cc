"""A run folder belongs to one run, resume never destroys, a reward failure stops with a
checkpoint, a full disk keeps the last good checkpoint, a cut-off metrics line is tolerated
(docs/reliability.md)."""

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from podsrl.metrics import read_metrics
from podsrl.models.loading import TINY_DIR
from podsrl.run_folder.claim import LOCK_FILE, RunDirError, RunLock, check_resume_config
from podsrl.trainer import TrainingStopped, train
from podsrl.trainer import checkpoints as checkpoints_module
from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.trainer.config import make_config
from podsrl.update import update_policy
from tests.conftest import quick

REPO = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the lock file aside) by relative path -> content hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK_FILE}


@pytest.fixture(scope="module")
def finished_run(random_model_dir, tmp_path_factory):
    """A finished 3-step run (a checkpoint every step); tests copy it before touching it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train(quick(random_model_dir, out, max_steps=3))
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(run, target)
    return target


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fails the test if the model or the data would load."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("loaded something before checking the output folder")

    monkeypatch.setattr("podsrl.trainer.setup.load_model", refuse)
    monkeypatch.setattr("podsrl.trainer.setup.build_task", refuse)


# --- output folders ---------------------------------------------------------------------------------
def model_folder(tmp_path):
    target = tmp_path / "a-model"
    shutil.copytree(TINY_DIR, target)
    return target


def adapter_folder(tmp_path):
    target = tmp_path / "an-adapter"
    target.mkdir()
    (target / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "tiny"}))
    return target


def a_file(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("my notes\n")
    return target


def busy_folder(tmp_path):
    target = tmp_path / "work"
    target.mkdir()
    (target / "data.csv").write_text("a,b\n1,2\n")
    return target


def folder_with_a_users_lock_file(tmp_path):
    target = tmp_path / "work"
    target.mkdir()
    (target / LOCK_FILE).write_text("my notes\n")  # not a podsrl holder's line: a run would empty it
    return target


@pytest.mark.parametrize("make", [model_folder, adapter_folder, a_file, busy_folder, folder_with_a_users_lock_file])
@pytest.mark.parametrize("resume", [False, True, "auto"])
def test_a_folder_that_is_not_a_new_run_is_refused_before_anything_loads_and_stays_untouched(
        random_model_dir, tmp_path, nothing_loads, make, resume):
    target = make(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(RunDirError, match=r"^(output_dir|resume): ") as refused:
        train(quick(random_model_dir, target, resume=resume))
    assert "\n" not in str(refused.value) and str(target) in str(refused.value)
    assert snapshot(tmp_path) == before
    if make is folder_with_a_users_lock_file:
        assert (target / LOCK_FILE).read_text() == "my notes\n"


def test_the_empty_name_and_the_current_directorys_files_are_refused(random_model_dir, tmp_path, nothing_loads,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "thesis.tex").write_text("\\documentclass{article}\n")
    for name in ("", ".", "./"):
        with pytest.raises(RunDirError, match="output_dir: "):
            train(quick(random_model_dir, name))
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_a_run_that_fails_before_writing_leaves_no_folder(random_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("podsrl.trainer.setup.load_model", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError):
        train(quick(random_model_dir, tmp_path / "new"))
    assert not (tmp_path / "new").exists()


LOCK_HOLDER = ("import sys, time; from pathlib import Path; from podsrl.run_folder.claim import RunLock; "
               "RunLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(600)")


@pytest.mark.slow
def test_a_second_process_is_refused_at_once_naming_the_holder_and_a_killed_holder_is_reported(
        random_model_dir, tmp_path, nothing_loads, capfd):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        start = time.perf_counter()
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {holder.pid} on "):
            train(quick(random_model_dir, out))
        assert time.perf_counter() - start < 10  # refused at once, not after waiting
    finally:
        holder.kill()
        holder.wait()
    stale = RunLock(out).acquire()  # the killed holder's lock is free, and its trace is reported
    assert f"pid {holder.pid} on " in stale.stale_holder
    stale.release()
    assert RunLock(out).acquire().stale_holder == ""  # a clean release leaves no trace


# --- a run that stopped before its first checkpoint --------------------------------------------------
def same_command(model_dir, out):
    """A run with no checkpoint before it ends, tracked (tracking/) and logging rollouts."""
    return quick(model_dir, out, max_steps=3, save_steps=0, report_to="tensorboard")


@pytest.fixture(scope="module")
def stopped_run(random_model_dir, tmp_path_factory):
    """What a run leaves when a bug stops it in step 2, before its first checkpoint: config.json,
    environment.json, data.json, metrics.jsonl (steps 0-1), rollouts.jsonl, tracking/, the lock."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    calls = []

    def buggy_update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a bug in step 2")
        return update_policy(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("podsrl.trainer.stages.update_policy", buggy_update)
        with pytest.raises(RuntimeError, match="a bug in step 2"):
            train(same_command(random_model_dir, out))
    assert {p.name for p in out.iterdir()} == {LOCK_FILE, "config.json", "environment.json", "data.json",
                                               "metrics.jsonl", "rollouts.jsonl", "tracking"}
    return out


def cut_config(run):
    config = run / "config.json"
    config.write_bytes(config.read_bytes()[:300])


def empty_config(run):
    (run / "config.json").write_bytes(b"")


def logs_cut_by_a_crash(run):
    """The logs as a crash leaves them: a last line cut off mid-record, or NUL bytes in its place."""
    metrics = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(metrics + metrics.splitlines()[-1][:20] + b"\0" * 300)
    with (run / "rollouts.jsonl").open("ab") as fh:
        fh.write(b"\0" * 4096)


def partial_checkpoint(run):
    """A checkpoint cut off while being written: torch archives and trainer_state.json cut short."""
    folder = run / "checkpoints" / "step_0000001.tmp"
    folder.mkdir(parents=True)
    torch.save({"weight": torch.ones(64)}, folder / "trainable.pt")
    (folder / "trainable.pt").write_bytes((folder / "trainable.pt").read_bytes()[:100])
    (folder / "optimizer.pt").write_bytes(b"\0" * 512)
    torch.save([{"prompt_selector": {"epoch": 0, "position": 4}}], folder / "parts.pt")
    (folder / "parts.pt").write_bytes((folder / "parts.pt").read_bytes()[:50])
    (folder / "trainer_state.json").write_text('{\n  "step": 1,\n  "train_sec')


@pytest.mark.slow
@pytest.mark.parametrize("damage", [None, cut_config, empty_config, logs_cut_by_a_crash, partial_checkpoint])
def test_a_run_that_stopped_before_its_first_checkpoint_starts_afresh_with_the_same_command(
        random_model_dir, stopped_run, tmp_path, capfd, damage):
    run = copy_of(stopped_run, tmp_path)
    if damage:
        damage(run)
    train(same_command(random_model_dir, run))
    assert (f"output_dir: {run} holds a run that stopped before its first checkpoint (nothing to resume); "
            f"starting it afresh") in capfd.readouterr().err
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3]  # afresh, not appended
    logged = [r["step"] for r in read_metrics(run / "rollouts.jsonl")]
    assert set(logged) == {1, 2, 3} and logged.count(1) == logged.count(3)  # step 1's once
    assert len(json.loads((run / "environment.json").read_text())) == 1  # this start only
    old_events = {run / p.relative_to(stopped_run) for p in (stopped_run / "tracking").rglob("events.out.tfevents*")}
    new_events = set((run / "tracking").rglob("events.out.tfevents*")) - old_events
    assert old_events <= set((run / "tracking").rglob("*")) and len(new_events) == len(old_events)  # kept, added
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000003"]  # no partial folder left


def test_a_fresh_start_keeps_the_trackers_folder_with_a_users_files_and_says_so(random_model_dir, stopped_run,
                                                                                  tmp_path, capfd):
    """#50: a fresh start removed tracking/ whole, a user's notes and a W&B run folder in it."""
    run = copy_of(stopped_run, tmp_path)
    (run / "tracking" / "notes.txt").write_text("what I tried\n")
    (run / "tracking" / "wandb" / "run-1").mkdir(parents=True)
    (run / "tracking" / "wandb" / "run-1" / "config.yaml").write_text("lr: 1\n")
    before = snapshot(run / "tracking")
    train(same_command(random_model_dir, run))
    assert (f"output_dir: {run} holds a run that stopped before its first checkpoint (nothing to resume); "
            f"starting it afresh; its trackers' folder tracking/ stays as it is (the new run's trackers write "
            f"beside it)") in capfd.readouterr().err
    after = snapshot(run / "tracking")
    assert {name: after[name] for name in before} == before  # every file kept as it was


def user_file(run):
    (run / "notes.txt").write_text("mine\n")
    return "files podsrl did not write \\(notes.txt\\)"


def user_file_in_checkpoints(run):
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "notes.txt").write_text("mine\n")
    return "files podsrl did not write \\(checkpoints/notes.txt\\)"


def linked_log(run):
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(run.parent / "elsewhere.jsonl")
    (run.parent / "elsewhere.jsonl").write_text('{"step": 0}\n')
    return "files podsrl did not write \\(metrics.jsonl\\)"


def users_rollouts(run):
    (run / "rollouts.jsonl").write_text("my notes, not a log\n")
    return "files podsrl did not write \\(rollouts.jsonl\\)"


def users_environment(run):
    (run / "environment.json").write_text(json.dumps({"conda": "my-env"}))
    return "files podsrl did not write \\(environment.json\\)"


def users_data(run):
    (run / "data.json").write_text(json.dumps([{"question": "1 + 1", "answer": 2}]))
    return "files podsrl did not write \\(data.json\\)"


def metrics_damaged_before_the_last_line(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0] + "\n{not json\n" + "\n".join(lines[1:]) + "\n")
    return "files podsrl did not write \\(metrics.jsonl\\)"


def users_lock_file(run):
    (run / LOCK_FILE).write_text("my lock notes\n")
    return f"files podsrl did not write \\({LOCK_FILE}\\)"


def users_file_in_a_partial_checkpoint(run):
    partial_checkpoint(run)
    (run / "checkpoints" / "step_0000001.tmp" / "notes.txt").write_text("mine\n")
    return "files podsrl did not write \\(checkpoints/step_0000001.tmp/notes.txt\\)"


def users_file_named_like_a_checkpoints(run):
    partial_checkpoint(run)
    (run / "checkpoints" / "step_0000001.tmp" / "trainable.pt").write_bytes(b"my own weights")
    return "files podsrl did not write \\(checkpoints/step_0000001.tmp/trainable.pt\\)"


def a_checkpoint(run, finished_run):
    shutil.copytree(list_checkpoints(finished_run / "checkpoints")[0], run / "checkpoints" / "step_0000001")
    return "already holds a run; pass --resume true"


def a_summary(run):
    (run / "summary.json").write_text("{}\n")
    return "already holds a run; pass --resume true"


def a_model_config(run):
    (run / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return "holds a model"


def a_foreign_config(run):
    (run / "config.json").write_text("hello\n")
    return "is not empty"


@pytest.mark.parametrize("spoil", [user_file, user_file_in_checkpoints, linked_log, users_rollouts,
                                   users_environment, users_data, metrics_damaged_before_the_last_line,
                                   users_lock_file, users_file_in_a_partial_checkpoint,
                                   users_file_named_like_a_checkpoints, a_checkpoint, a_summary, a_model_config,
                                   a_foreign_config])
def test_a_stopped_run_beside_anything_podsrl_did_not_write_is_refused_and_untouched(
        random_model_dir, stopped_run, finished_run, tmp_path, nothing_loads, spoil):
    run = copy_of(stopped_run, tmp_path)
    expected = spoil(run, finished_run) if spoil is a_checkpoint else spoil(run)
    before, lock = snapshot(tmp_path), (run / LOCK_FILE).read_bytes()
    with pytest.raises(RunDirError, match=f"^output_dir: {run} .*{expected}") as refused:
        train(same_command(random_model_dir, run))
    assert "\n" not in str(refused.value) and snapshot(tmp_path) == before
    assert (run / LOCK_FILE).read_bytes() == lock


@pytest.mark.slow
def test_a_stopped_run_whose_folder_another_process_holds_is_refused_and_untouched(
        random_model_dir, stopped_run, tmp_path, nothing_loads):
    run = copy_of(stopped_run, tmp_path)
    (run / LOCK_FILE).unlink()
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(run)
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {holder.pid} on "):
            train(same_command(random_model_dir, run))
        assert snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("damage", [None, cut_config])
def test_resume_of_a_run_that_stopped_before_its_first_checkpoint_says_to_run_without_resume(
        random_model_dir, stopped_run, tmp_path, nothing_loads, damage):
    run = copy_of(stopped_run, tmp_path)
    if damage:
        damage(run)
    before = snapshot(run)
    with pytest.raises(RunDirError, match=f"^resume: {run} holds a run that stopped before its first checkpoint, "
                                          f"so there is nothing to resume; run the same command without --resume "
                                          f"true to start it afresh") as refused:
        train(quick(random_model_dir, run, max_steps=3, save_steps=0, report_to="tensorboard", resume=True))
    assert "\n" not in str(refused.value) and snapshot(run) == before


@pytest.mark.parametrize("resume", [True, False])
def test_an_unreadable_config_json_beside_checkpoints_is_one_line_naming_it(random_model_dir, finished_run,
                                                                            tmp_path, nothing_loads, resume):
    run = copy_of(finished_run, tmp_path)
    cut_config(run)
    before = snapshot(run)
    field = "resume" if resume else "output_dir"
    with pytest.raises(RunDirError, match=f"^{field}: {run / 'config.json'} is unreadable \\(JSONDecodeError: .*"
                                          f"restore it from a backup") as refused:
        train(quick(random_model_dir, run, max_steps=4, resume=resume))
    assert "\n" not in str(refused.value) and snapshot(run) == before


# --- resume never destroys ---------------------------------------------------------------------------
def test_resume_without_a_checkpoint_refuses_and_changes_nothing(random_model_dir, finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    shutil.rmtree(run / "checkpoints")
    before = snapshot(run)
    with pytest.raises(RunDirError, match=r"resume: no usable checkpoint .*\(none: the run stopped before"):
        train(quick(random_model_dir, run, max_steps=4, resume=True))
    assert snapshot(run) == before


def test_resume_with_every_checkpoint_unreadable_refuses_and_changes_nothing(random_model_dir, finished_run,
                                                                            tmp_path):
    run = copy_of(finished_run, tmp_path)
    for checkpoint in list_checkpoints(run / "checkpoints"):
        (checkpoint / "trainable.pt").write_bytes(b"not a checkpoint")
    before = snapshot(run)
    with pytest.raises(RunDirError, match=r"resume: no usable checkpoint .*2 found, none loads"):
        train(quick(random_model_dir, run, max_steps=4, resume=True))
    assert snapshot(run) == before


def test_checkpoints_from_before_parts_pt_are_called_an_older_format_that_still_exports(random_model_dir,
                                                                                        finished_run, tmp_path, capfd):
    """#57: an older podsrl's checkpoints (no parts.pt) were 'unreadable (FileNotFoundError ...)'
    with 'resume with the settings that wrote it', which no settings do; podsrl export does."""
    from podsrl.run_folder.export import export_run

    run = copy_of(finished_run, tmp_path)
    found = list_checkpoints(run / "checkpoints")
    for checkpoint in found:
        (checkpoint / "parts.pt").unlink()
    before = snapshot(run)
    with pytest.raises(RunDirError) as refused:
        train(quick(random_model_dir, run, max_steps=4, resume=True))
    assert str(refused.value) == (
        f"resume: the 2 checkpoint(s) in {run / 'checkpoints'} are in an older podsrl's format (no parts.pt), which "
        f"this podsrl cannot resume; nothing was changed. `podsrl export {run} OUTPUT_DIR --checkpoint "
        f"{found[-1].name}` still exports the model, or start a new run in another --output_dir")
    err = capfd.readouterr().err
    assert f"warning: checkpoint {found[-1]} is in an older podsrl's format (no parts.pt), which this podsrl " \
           f"cannot resume; trying the previous one" in err and "FileNotFoundError" not in err
    assert snapshot(run) == before
    export_run(run, tmp_path / "hf", checkpoint=found[-1].name)
    assert (tmp_path / "hf" / "model.safetensors").is_file()

@pytest.mark.parametrize("changed", [{"learning_rate": 0.5}, {"lora_rank": 4}, {"num_kept": 2},
                                     {"method": "grpo"}, {"seed": 7}])
def test_resume_with_another_config_is_refused_naming_the_fields(random_model_dir, finished_run, tmp_path,
                                                                 nothing_loads, changed):
    run = copy_of(finished_run, tmp_path)
    before = snapshot(run)
    with pytest.raises(RunDirError, match=f"resume: the config differs .* in {next(iter(changed))}: run "):
        train(quick(random_model_dir, run, max_steps=4, resume=True, **changed))
    assert snapshot(run) == before


def test_a_field_added_after_the_run_started_reads_as_its_default(tmp_path):
    """A run started by an older podsrl has no advantage_estimator in its config.json: resuming
    with the default is the same run; with another estimator it is not."""
    config = make_config(overrides={"output_dir": str(tmp_path)}).to_dict()
    older = {name: value for name, value in config.items() if name != "advantage_estimator"}
    (tmp_path / "config.json").write_text(json.dumps(older))
    assert check_resume_config(tmp_path, config) == []
    with pytest.raises(RunDirError, match="in advantage_estimator: run 'group', now 'x.py:f'"):
        check_resume_config(tmp_path, {**config, "advantage_estimator": "x.py:f"})


def test_resume_may_change_the_budget_and_config_json_records_it(random_model_dir, finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    train(quick(random_model_dir, run, max_steps=4, resume=True, save_total_limit=3))
    config = json.loads((run / "config.json").read_text())
    assert config["max_steps"] == 4 and config["save_total_limit"] == 3 and config["learning_rate"] == 1e-3
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_a_run_written_by_the_previous_config_layout_resumes_with_its_own_command_or_todays(
        random_model_dir, tmp_path, capfd):
    """#80: a run made before 46aaa97 with generation_engine {name: hf, batch_size: N} was refused
    with its own command (batch_size no longer an option) and with today's spelling (a changed
    config): advice in a circle. Its config.json is written here as 3353d05 wrote it (checked
    against a run of 3353d05: the engine spec with batch_size, generation_batch_size 0)."""
    from podsrl.trainer.config import Config, validate

    made = tmp_path / "made"
    train(quick(random_model_dir, made, max_steps=2, generation_batch_size=12))  # 2 groups of 6 a call
    config = json.loads((made / "config.json").read_text())
    config.update(generation_engine={"name": "hf", "batch_size": 12}, generation_batch_size=0)
    (made / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    capfd.readouterr()
    own, today = copy_of(made, tmp_path / "own"), copy_of(made, tmp_path / "today")
    old_spec = json.dumps({"name": "hf", "batch_size": 12})
    assert train(quick(random_model_dir, own, max_steps=3, resume=True, generation_engine=old_spec)).steps == 3
    assert ('note: generation_engine {"name": "hf", "batch_size": 12} is podsrl\'s spelling before 46aaa97 (the hf '
            'engine\'s own batch_size went; generation_batch_size bounds what a call decodes): read as '
            'generation_engine "hf", generation_batch_size 12\n') in capfd.readouterr().err
    assert train(quick(random_model_dir, today, max_steps=3, resume=True, generation_batch_size=12)).steps == 3
    for run in (own, today):
        assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3]
        resumed = json.loads((run / "config.json").read_text())  # rewritten in today's spelling
        assert (resumed["generation_engine"], resumed["generation_batch_size"]) == ("hf", 12)
    with pytest.raises(RunDirError, match=r"in generation_batch_size: run 12, now 18"):  # a change is still one
        train(quick(random_model_dir, copy_of(made, tmp_path / "other"), max_steps=3, resume=True,
                    generation_batch_size=18))
    with pytest.raises(ValueError, match=r'^generation_engine {"name": "hf", "batch_size": 12} is podsrl\'s spelling '
                                         r'before 46aaa97 .*: read as generation_engine "hf", generation_batch_size '
                                         r'16; set that instead'):
        validate(Config(generation_engine={"name": "hf", "batch_size": 12}))  # in Python: named, not mapped


def test_resuming_a_finished_run_changes_nothing(random_model_dir, finished_run, tmp_path, capfd):
    run = copy_of(finished_run, tmp_path)
    before = snapshot(run)
    result = train(quick(random_model_dir, run, max_steps=3, resume=True))
    assert result.steps == 3 and "finished earlier at step 3; nothing to do" in capfd.readouterr().err
    changed = {name for name in set(before) | set(snapshot(run)) if before.get(name) != snapshot(run).get(name)}
    assert changed <= {"config.json", "environment.json"}  # the start is recorded; nothing of the run changes
    config, original = (json.loads((path / "config.json").read_text()) for path in (run, finished_run))
    assert {**config, "output_dir": ""} == {**original, "output_dir": ""}  # the copy lives elsewhere


# --- metrics.jsonl cut off mid-write ------------------------------------------------------------------
@pytest.mark.parametrize("cut", [1, 10, 40])
def test_a_cut_off_last_line_is_dropped_with_a_warning_everywhere(random_model_dir, finished_run, tmp_path, capfd,
                                                                  cut):
    run = copy_of(finished_run, tmp_path)
    metrics = run / "metrics.jsonl"
    whole = read_metrics(metrics)
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines) + "\n" + json.dumps(whole[-1])[:cut])  # a crash mid-write
    assert read_metrics(metrics) == whole
    assert f"{metrics}, line {len(lines) + 1}: cut off" in capfd.readouterr().err
    from podsrl.cli import main

    assert main(["plot", str(run), "--output_dir", str(tmp_path / "plots")]) == 0
    assert main(["export", str(run), str(tmp_path / "exported")]) == 0
    train(quick(random_model_dir, run, max_steps=4, resume=True))  # resume rewrites the log whole
    assert [r["step"] for r in read_metrics(metrics)] == [0, 1, 2, 3, 4]


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0}\n{"step": 1\n{"step": 2}\n')
    with pytest.raises(ValueError, match=f"{metrics}, line 2: not a JSON record"):
        read_metrics(metrics)


# --- a full disk during a checkpoint ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("failing_write", [1, 2])
def test_a_full_disk_during_a_checkpoint_keeps_the_last_good_one(random_model_dir, tmp_path, monkeypatch,
                                                                  failing_write):
    out = tmp_path / "run"
    train(quick(random_model_dir, out, max_steps=2))
    good = snapshot(out / "checkpoints")
    real_save, calls = torch.save, []

    def full_disk(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == failing_write:
            Path(path).write_bytes(b"partial")
            raise OSError(28, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoints_module.torch, "save", full_disk)
    with pytest.raises(OSError, match=r"checkpoint: could not write .*step_0000003 \(OSError: \[Errno 28\] No space "
                                      r"left on device\); removed the partial folder; once there is room, go on: "
                                      r"last checkpoint: .*step_0000002; continue with the same command plus "
                                      r"--resume true$"):
        train(quick(random_model_dir, out, max_steps=3, resume=True))
    assert snapshot(out / "checkpoints") == good  # no partial folder, the good ones untouched


def test_resume_on_a_folder_without_a_run_gives_advice_that_works(tmp_path):
    """--resume on a folder with a user's file: "drop --resume" would be refused too (not empty)."""
    from podsrl.run_folder.claim import check_output_dir

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError) as refused:
        check_output_dir(str(tmp_path), resume=True)
    assert str(refused.value) == (f"resume: {tmp_path} holds no podsrl run to resume (no metrics.jsonl and "
                                  f"config.json); it holds notes.txt, so no new run starts there either: name the "
                                  f"run's folder, or start a new run in another --output_dir")
    with pytest.raises(RunDirError, match="is not empty"):  # what the old advice led to
        check_output_dir(str(tmp_path), resume=False)
    with pytest.raises(RunDirError, match="drop --resume to start a new run there"):
        check_output_dir(str(tmp_path / "empty"), resume=True)
    assert check_output_dir(str(tmp_path / "empty"), resume=False) == tmp_path / "empty"  # as that advice says


def test_a_checkpoint_that_does_not_fit_says_why_where_torch_does_not(tmp_path, monkeypatch):
    """torch.save reports a full disk as "[enforce fail at inline_container.cc] unexpected pos": the
    message adds the cause (free space against the checkpoint's size, or the file size limit)."""
    from podsrl.trainer.checkpoints import tensor_bytes, write_cause

    weights = {"w": torch.zeros(1024, 256)}  # 1 MiB
    assert tensor_bytes([weights, {"state": {0: {"exp_avg": torch.zeros(256)}}}, [{"x": 1}]]) == 2**20 + 1024
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 32")
    assert write_cause(OSError(28, "No space left on device"), tmp_path, 2**20) == ""  # it says so itself
    assert write_cause(torch_error, tmp_path, 2**20) == ""  # room and no limit: nothing to add
    monkeypatch.setattr(checkpoints_module.shutil, "disk_usage", lambda path: SimpleNamespace(free=2**19))
    assert write_cause(torch_error, tmp_path, 2**20) == (": no space left on the device, 0 MiB free, the checkpoint "
                                                         "needs about 1 MiB")
    monkeypatch.setattr(checkpoints_module.shutil, "disk_usage", lambda path: SimpleNamespace(free=2**30))
    monkeypatch.setattr(checkpoints_module.resource, "getrlimit", lambda which: (2**18, 2**18))
    assert write_cause(torch_error, tmp_path, 2**20) == (": a file would pass this process's file size limit of "
                                                         "0.2 MiB (ulimit -f), the checkpoint needs about 1 MiB")


# --- a reward function that fails under the 'raise' policy --------------------------------------------
@pytest.mark.slow
def test_a_reward_failure_stops_with_a_checkpoint_of_the_last_finished_step_and_resumes_exactly(
        random_model_dir, tmp_path):
    from tests.conftest import crc_parity

    failing = {"at": 3}

    def flaky(prompts, completions, trainer_state, **columns):
        if trainer_state.global_step + 1 == failing["at"]:  # global_step: steps completed before this one
            raise RuntimeError("the grading server is down")
        return crc_parity(prompts, completions)

    full = train(quick(random_model_dir, tmp_path / "full", max_steps=5, save_steps=0),
                 reward_funcs=[crc_parity]).run_dir
    out = tmp_path / "run"
    with pytest.raises(TrainingStopped, match=r"stopped in step 3: reward function flaky.*the grading "
                                              r"server is down.*checkpoint of step 2 in") as stopped:
        train(quick(random_model_dir, out, max_steps=5, save_steps=0), reward_funcs=[flaky])
    assert "\n" not in str(stopped.value)
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step_0000002"]
    failing["at"] = None
    train(quick(random_model_dir, out, max_steps=5, save_steps=0, resume=True), reward_funcs=[flaky])
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("time_") and k != "train_seconds"}  # noqa: E731
    assert [strip(r) for r in read_metrics(out / "metrics.jsonl")] == \
           [strip(r) for r in read_metrics(full / "metrics.jsonl")]


# --- model folders that cannot load -------------------------------------------------------------------
def truncated_at(fraction):
    def damage(folder):
        weights = folder / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[:int(len(data) * fraction)])
        return weights
    return damage


def without_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    return folder


def pickled_only(folder):
    from safetensors.torch import load_file

    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder / "pytorch_model.bin"


@pytest.mark.parametrize("damage", [truncated_at(0.0005), truncated_at(0.5), truncated_at(0.999), without_tokenizer,
                                    pickled_only])
def test_a_model_folder_that_cannot_load_is_one_line_naming_the_file(tmp_path, damage):
    folder = tmp_path / "model"
    shutil.copytree(TINY_DIR, folder)
    named = damage(folder)
    with pytest.raises(OSError, match=r"^model: ") as refused:
        train(quick(str(folder), tmp_path / "run"))
    assert str(named) in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()  # nothing was written for the failed run


@pytest.mark.slow
def test_a_lora_adapter_saved_only_as_a_pickle_is_refused(random_model_dir, tmp_path):
    run = tmp_path / "lora"
    train(quick(random_model_dir, run, max_steps=1, lora_rank=4))
    adapter = run / "model" / "adapter_model.safetensors"
    adapter.rename(adapter.with_name("adapter_model.bin"))
    with pytest.raises(OSError, match=r"adapter_model.bin is a pickled weights file, refused for safety"):
        train(quick(str(run / "model"), tmp_path / "again"))

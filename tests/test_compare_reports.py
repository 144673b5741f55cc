"""The reports of podsrl compare and plot (#57): they overwrite only report files podsrl can prove
it wrote, refuse what they cannot read or mix, and say true things about what they show."""

import hashlib
import json
import os
import stat

import pytest

from podsrl import cli
from podsrl.experiments.compare import analyze, format_table, write_report
from podsrl.experiments.report_files import REPORT_MARKER, ReportFolderError
from tests.test_compare import fake_run

EVALS = [(0, 0.5), (10, 0.6), (20, 0.8)]


def two_arms(root):
    return [fake_run(root, "grpo", "grpo", 0, EVALS),
            fake_run(root, "pods", "pods", 0, [(0, 0.5), (5, 0.8), (20, 0.9)])]


@pytest.fixture(autouse=True)
def quick_figures(request, monkeypatch):
    """Figures as a few bytes that differ between reports (matplotlib takes seconds), except in
    tests marked slow."""
    if "slow" not in request.keywords:
        monkeypatch.setattr("podsrl.experiments.report._accuracy_figure", lambda result, title: repr(
            sorted(result["arms"])).encode())
        monkeypatch.setattr("podsrl.experiments.report._step_time_figure", lambda rows: repr(rows).encode())


def contents(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# --- 1. reports overwrite only what podsrl wrote ---------------------------------------------------
@pytest.mark.slow
def test_a_report_overwrites_its_own_earlier_report(tmp_path):
    result = analyze(two_arms(tmp_path / "runs"))
    out = tmp_path / "report"
    write_report(result, out)
    recorded = json.loads((out / REPORT_MARKER).read_text())["files"]
    assert sorted(recorded) == ["accuracy.png", "compare.json", "compare.md", "step_time.png"]
    write_report(result, out)  # podsrl's own files, proven by their digests: replaced
    assert contents(out)["compare.md"] == recorded["compare.md"][0]


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_report_files_get_the_umasks_permissions(tmp_path, mask):
    """They are written through a private temporary file (mkstemp's 0600), renamed into place."""
    before = os.umask(mask)
    try:
        write_report(analyze(two_arms(tmp_path / "runs")), tmp_path / "report")
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "report").iterdir()}
    assert modes == dict.fromkeys(modes, 0o666 & ~mask) and len(modes) == 5


@pytest.mark.parametrize("name", ["compare.md", "compare.json", "accuracy.png", "step_time.png"])
def test_a_users_file_or_an_edited_report_is_refused_and_nothing_changes(tmp_path, name):
    result = analyze(two_arms(tmp_path / "runs"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / name).write_text("# mine\n")  # no record of it: the user's
    edited = tmp_path / "edited"
    write_report(result, edited)
    with (edited / name).open("a") as fh:  # an earlier report, edited since: the user's now
        fh.write("my notes\n")
    for folder in (mine, edited):
        before = contents(folder)
        with pytest.raises(ReportFolderError, match=f"output_dir: {folder / name} would be overwritten by the report, "
                                                    f"but podsrl cannot prove it wrote it"):
            write_report(result, folder)
        assert contents(folder) == before


def test_reports_of_a_podsrl_before_the_record_and_a_foreign_record_are_refused(tmp_path):
    result = analyze(two_arms(tmp_path / "runs"))
    out = tmp_path / "report"
    write_report(result, out)
    (out / REPORT_MARKER).unlink()  # as podsrl before #57 left them
    with pytest.raises(ReportFolderError, match="records no such content: .* written by podsrl before #57"):
        write_report(result, out)
    (out / REPORT_MARKER).write_text('{"files": {"compare.md": "not a digest"}}')
    with pytest.raises(ReportFolderError, match=f"{REPORT_MARKER}.*it is not the record podsrl writes"):
        write_report(result, out)


def test_a_crash_between_two_report_files_leaves_a_folder_podsrl_still_proves(tmp_path, monkeypatch):
    from podsrl.experiments import report_files

    runs = two_arms(tmp_path / "runs")
    out = tmp_path / "report"
    write_report(analyze(runs), out)
    replace = report_files._replace

    def full_disk_after_the_first_file(path, data):
        if path.name != REPORT_MARKER and any(p.name == "accuracy.png" for p in written):
            raise OSError("No space left on device")
        replace(path, data)
        written.append(path)

    written = []
    with monkeypatch.context() as patch, pytest.raises(OSError):
        patch.setattr(report_files, "_replace", full_disk_after_the_first_file)
        write_report(analyze(runs[:1]), out)  # another report: accuracy.png new, the rest old
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    write_report(analyze(runs[:1]), out)  # every file, old or new, is still proven podsrl's


def test_compare_refuses_a_users_report_file_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("podsrl.experiments.compare.train", lambda cfg: pytest.fail("a run started"))
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.md").write_text("# mine\n")
    code = cli.main(["compare", "--methods", "pods", "--seeds", "1", "--budget_steps", "2", "--output_dir", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"podsrl compare: error: output_dir: {out / 'compare.md'} would be overwritten")
    assert (out / "compare.md").read_text() == "# mine\n" and sorted(p.name for p in out.iterdir()) == ["compare.md"]


def test_plot_refuses_a_users_report_file_in_its_output_folder(tmp_path, capsys):
    two_arms(tmp_path / "runs")
    out = tmp_path / "plots"
    out.mkdir()
    (out / "accuracy.png").write_bytes(b"my figure")
    assert cli.main(["plot", str(tmp_path / "runs"), "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"podsrl plot: error: output_dir: {out / 'accuracy.png'} would be overwritten"), err
    assert (out / "accuracy.png").read_bytes() == b"my figure" and len(list(out.iterdir())) == 1


# --- 4. reports say true things --------------------------------------------------------------------
def test_plot_leaves_out_a_run_without_evaluations_and_plots_the_others(tmp_path, capsys):
    """One run without an evaluation made plot refuse every run, saying 'no training steps or
    evaluations' of a log with 7 steps (#57)."""
    two_arms(tmp_path / "runs")
    silent = tmp_path / "runs" / "grpo" / "seed1"
    silent.mkdir()
    (silent / "config.json").write_text(json.dumps({"method": "grpo", "num_generations": 16, "num_kept": 4,
                                                    "seed": 1}))
    (silent / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "train_seconds": float(i)}) + "\n"
                                                  for i in range(1, 8)))
    assert cli.main(["plot", str(tmp_path / "runs"), "--output_dir", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"podsrl plot: left out {silent}: no evaluation in its metrics.jsonl (7 training "
                                    f"steps logged, none with eval_accuracy)")
    assert "| grpo 4/4 | 1 |" in captured.out  # the grpo arm has its other seed alone
    assert str(silent) not in (tmp_path / "out" / "compare.json").read_text()
    (tmp_path / "runs" / "grpo" / "seed0" / "metrics.jsonl").write_text('{"step": 0, "train_seconds": 0.0}\n')
    (tmp_path / "runs" / "pods" / "seed0" / "metrics.jsonl").unlink()
    assert cli.main(["plot", str(tmp_path / "runs"), "--output_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "podsrl plot: error: none of the 2 runs found has training steps and evaluations to compare")


def test_plot_of_one_run_under_two_names_counts_it_once_and_says_so(tmp_path, capsys):
    """A run given as a folder and again through a link (or inside its parent) was two seeds of one arm."""
    two_arms(tmp_path / "runs")
    seed = tmp_path / "runs" / "grpo" / "seed0"
    (tmp_path / "again").symlink_to(seed)
    assert cli.main(["plot", str(tmp_path / "runs"), str(tmp_path / "again"), "--output_dir",
                     str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == f"podsrl plot: {tmp_path / 'again'} is the run {seed} again: counted once"
    assert "| grpo 4/4 | 1 |" in captured.out


def test_plot_tells_a_copied_run_folder_from_a_second_seed_by_the_runs_start(tmp_path, capsys):
    """#80: a copy of a run folder (cp -r) was plotted as two seeds of its arm. A run is its first
    start (environment.json: time and command line); a second run of the same config and seed is
    another start, and counts."""
    import shutil

    start = [{"date": "2026-12-07T10:00:00+00:00", "unix_time": 1796637600.25, "argv": ["podsrl", "train"],
              "commit": "05a6bca", "machine": "AMD EPYC (AVX2)", "torch": "2.13.0", "torch_threads": 2}]
    again = [{**start[0], "date": "2026-12-07T10:05:00+00:00", "unix_time": 1796637900.5}]
    first = fake_run(tmp_path / "runs", "grpo", "grpo", 0, EVALS, environment=start)
    fake_run(tmp_path / "runs", "pods", "pods", 0, [(0, 0.5), (5, 0.8), (20, 0.9)])
    shutil.copytree(first, tmp_path / "copied")
    assert cli.main(["plot", str(tmp_path / "runs"), str(tmp_path / "copied"), "--output_dir",
                     str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"podsrl plot: {tmp_path / 'copied'} is a copy of the run {first} (the same "
                                    f"start in environment.json): counted once")
    assert "| grpo 4/4 | 1 |" in captured.out
    (tmp_path / "copied" / "environment.json").write_text(json.dumps(again))  # the same command, run again
    assert cli.main(["plot", str(tmp_path / "runs"), str(tmp_path / "copied"), "--output_dir",
                     str(tmp_path / "out2")]) == 0
    captured = capsys.readouterr()
    assert "copy" not in captured.err and "| grpo 4/4 | 2 |" in captured.out


def test_compare_json_is_strict_and_the_tables_print_no_nan_or_inf(tmp_path):
    """A single seed (no interval) and a statistic that one dropped evaluation sends to infinity
    wrote bare NaN tokens into compare.json and 'nan%', '11.58x (inf%)' into compare.md (#57)."""
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.5), (10, 0.55), (20, 0.8)]),
            fake_run(tmp_path, "pods", "pods", 0, [(0, 0.6), (10, 0.9), (20, 0.9)]),
            fake_run(tmp_path, "pods", "pods", 1, [(0, 0.6), (10, 0.9), (20, 0.9)])]  # no baseline seed 1
    out = tmp_path / "report"
    result = analyze(runs)
    write_report(result, out)

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    summary = json.loads((out / "compare.json").read_text(), parse_constant=refuse)
    assert summary["rows"][0]["speedup_per_seed_ci95"] is None
    table = (out / "compare.md").read_text()
    assert not {"nan", "inf"} & set(table.lower().replace("|", " ").replace("%", " ").replace("(", " ").split())
    assert "(unbounded)" in table  # the paper's statistic: dropping grpo's last evaluation puts pods at its target


def test_an_evaluation_logged_as_nan_is_no_point_of_the_curve(tmp_path):
    """An evaluation that gave no number (NaN in metrics.jsonl) printed 'nan%' in compare.md and cut
    the curve: it is left out, and the arm is judged on its other evaluations (#69)."""
    nan = float("nan")
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.5), (10, nan), (20, 0.8)]),
            fake_run(tmp_path, "pods", "pods", 0, [(0, 0.6), (10, 0.9), (20, nan)])]
    table = format_table(analyze(runs))
    assert "nan" not in table.lower()
    main_table = table.split("| arm | headline")[0]
    peaks = {line.split("|")[1].split()[0]: line.split("|")[6].strip() for line in main_table.splitlines()
             if line.startswith(("| grpo", "| pods"))}
    assert peaks == {"grpo": "80.0%", "pods": "90.0%"}  # each arm's best finite evaluation


def test_a_run_evaluated_only_at_its_start_is_named_instead_of_a_common_budget_of_0_s(tmp_path):
    start_only = fake_run(tmp_path, "pods", "pods", 0, [(0, 0.5), (10, 0.9)])
    records = [json.loads(line) for line in (start_only / "metrics.jsonl").read_text().splitlines()]
    records[1].pop("eval_accuracy")  # 1 step, evaluated at step 0 only
    (start_only / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = analyze([fake_run(tmp_path, "grpo", "grpo", 0, EVALS), start_only])
    first = format_table(result).splitlines()[0]
    assert "common budget: 0 s" not in first
    assert first.endswith(f"no common budget: {start_only} has no evaluation after its start, so the runs share no "
                          f"training time (accuracy 'at the budget' is the initial model's); plot the runs without it")


def test_a_standard_error_logged_as_null_is_not_blamed_on_an_old_podsrl(tmp_path):
    """eval_accuracy_se is null when an evaluation had fewer than two prompts; the report said
    '(podsrl before #51)' of current runs (#57)."""
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, EVALS)]
    records = [{**json.loads(line), "eval_accuracy_se": None}
               for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    (runs[0] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = format_table(analyze(runs))
    assert "before #51" not in table
    assert ("One evaluation's standard error: not measured, logged as null: a standard error over prompts needs at "
            "least two held-out prompts per evaluation") in table


# --- 5. runs of two SmolLM2 conversions are not compared ---------------------------------------------
def smollm2_run(root, name, method, seed, eos=None):
    """A run of SmolLM2; ``eos``: the EOS id its environment.json records (None: a run of podsrl before
    #57, which recorded none)."""
    run = fake_run(root, name, method, seed, EVALS, environment=[{"date": "2026-11-25T00:00:00+00:00",
                                                                   "commit": "abc1234", "machine": "m",
                                                                   "torch": "2", "torch_threads": 1,
                                                                   **({"eos_token_id": eos} if eos else {})}])
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "model": "smollm2-135m-instruct"}))
    return run


def test_runs_of_the_old_and_the_new_smollm2_conversion_are_not_compared(tmp_path):
    old = [smollm2_run(tmp_path / "old", "grpo", "grpo", 0), smollm2_run(tmp_path / "old", "pods", "pods", 0)]
    new = [smollm2_run(tmp_path / "new", "grpo", "grpo", 0, eos=2), smollm2_run(tmp_path / "new", "pods", "pods", 0,
                                                                                 eos=2)]
    analyze(old), analyze(new)  # one conversion each: compared as ever
    with pytest.raises(ValueError) as refused:
        analyze([old[0], new[1]])
    message = str(refused.value)
    assert message.startswith("runs of SmolLM2 that end completions on different tokens cannot be compared: EOS id 1 "
                              "(<|im_start|>: podsrl's old SmolLM2 conversion")
    assert f"before #57, counts as it) in {old[0]}; EOS id 2 in {new[1]}; compare runs of one conversion" in message
    tiny = fake_run(tmp_path / "tiny", "pods", "pods", 0, EVALS)  # another model, no record: not checked
    analyze([old[0], tiny]), analyze([new[0], tiny])


def test_a_run_resumed_across_conversions_is_on_both_sides(tmp_path):
    run = smollm2_run(tmp_path, "grpo", "grpo", 0, eos=1)
    entries = json.loads((run / "environment.json").read_text())
    (run / "environment.json").write_text(json.dumps(entries + [{**entries[0], "eos_token_id": 2}]))
    with pytest.raises(ValueError, match=f"EOS id 1 .* in {run}; EOS id 2 in {run};"):
        analyze([run])


def test_compare_stops_at_the_first_run_of_another_conversion_than_the_runs_it_reuses(tmp_path, monkeypatch):
    from podsrl.experiments.compare import _run_config, arm_configs, arm_dir_name, run_comparison
    from podsrl.trainer.config import make_config

    base = make_config(overrides={"prompts_per_step": "2", "num_generations": "4", "num_kept": "2"})
    arms = arm_configs(base, ["grpo", "pods"], ["max_variance"], [4], [2])
    reused = tmp_path / arm_dir_name(arms[0]) / f"seed{base.seed}"
    reused.mkdir(parents=True)  # a finished run of the same command, of podsrl before #57 on SmolLM2
    (reused / "config.json").write_text(json.dumps(_run_config(base, arms[0], base.seed, 0, reused, 2).to_dict()))
    (reused / "summary.json").write_text("{}")
    (reused / "environment.json").write_text('[{"date": "2026-11-25T00:00:00+00:00", "commit": "abc1234"}]')
    monkeypatch.setattr("podsrl.experiments.conversions.model_family", lambda config: "SmolLM2")
    trained = []

    def train(cfg):  # a run of the new conversion
        trained.append(cfg)
        run_dir = tmp_path / cfg.output_dir
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
        (run_dir / "environment.json").write_text('[{"date": "2026-11-28T00:00:00+00:00", "eos_token_id": 2}]')
        return type("Result", (), {"steps": 2, "initial": {"eval_accuracy": 0.5}, "final": {"eval_accuracy": 0.5}})

    monkeypatch.setattr("podsrl.experiments.compare.train", train)
    with pytest.raises(ValueError, match=f"EOS id 1 .* in {reused}; EOS id 2 in "):
        run_comparison(base, arms, 2, 0, tmp_path, log=lambda line: None, budget_steps=2)
    assert len(trained) == 1  # not the seed after it


def test_a_run_records_its_tokenizers_end_of_turn_in_a_file_podsrl_still_proves_its_own(tmp_path):
    from types import SimpleNamespace

    from podsrl.provenance import record_environment
    from podsrl.run_folder.ownership import is_podsrls

    record_environment(tmp_path, SimpleNamespace(eos_token_id=2, eos_token="<|im_end|>"))
    record_environment(tmp_path)  # a start without a tokenizer (benchmarks' TRL runs) records none
    entries = json.loads((tmp_path / "environment.json").read_text())
    assert (entries[0]["eos_token_id"], entries[0]["eos_token"]) == (2, "<|im_end|>")
    assert "eos_token_id" not in entries[1]
    assert is_podsrls(tmp_path / "environment.json")  # a stopped run's folder can still start afresh

"""podsrl compare: the speedup metric against hand-made curves, censoring, pairing by seed,
the interleaved run order, provenance, and an end-to-end run."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from podsrl.experiments.compare import (
    analyze,
    arm_configs,
    arm_dir_name,
    format_table,
    planned_arm_names,
    run_plan,
    write_report,
)
from podsrl.experiments.runs import load_run
from podsrl.trainer.config import make_config


def fake_run(root, name, method, seed, evals, n=16, m=4, rule="max_variance", step_times=(0.1, 0.05, 0.2),
             environment=None):
    """A run directory with the given (seconds, accuracy) evaluations."""
    run = root / name / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": method, "num_generations": n, "num_kept": m,
                                                 "downsampling_rule": rule, "seed": seed}))
    if environment is not None:
        (run / "environment.json").write_text(json.dumps(environment))
    generate, reward, update = step_times
    records = [{"step": 0, "train_seconds": 0.0, "eval_accuracy": evals[0][1]}]
    for i, (t, acc) in enumerate(evals[1:], start=1):
        records.append({"step": i, "train_seconds": t, "eval_accuracy": acc, "time_generate": generate,
                        "time_reward": reward, "time_update": update, "time_select": 0.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.mark.slow
def test_speedup_matches_hand_computation(tmp_path):
    runs = []
    for seed in (0, 1):
        # baseline: best 0.8 -> target 0.792, reached at t = 10 + 10 * (0.792 - 0.6) / 0.2 = 19.6
        runs.append(fake_run(tmp_path, "grpo", "grpo", seed, [(0, 0.5), (10, 0.6), (20, 0.8), (30, 0.8)]))
        # pods reaches 0.792 at t = 5 + 5 * (0.792 - 0.7) / 0.2 = 7.3 (same both seeds)
        runs.append(fake_run(tmp_path, "pods", "pods", seed, [(0, 0.5), (5, 0.7), (10, 0.9), (30, 0.9)]))
    result = analyze(runs)
    assert result["baseline"] == "grpo 4/4"
    assert result["target_accuracy"] == pytest.approx(0.792)
    rows = {r["arm"]: r for r in result["rows"]}
    pods = rows["pods 16->4 max_variance"]
    assert pods["speedup_per_seed_mean"] == pytest.approx(19.6 / 7.3)
    assert pods["speedup_per_seed_ci95"] == pytest.approx(0.0)
    assert pods["speedup_vs_baseline"] == pytest.approx(19.6 / 7.3, rel=0.03)  # on the 200-point grid
    assert rows["grpo 4/4"]["speedup_per_seed_mean"] == pytest.approx(1.0)
    assert pods["inference_seconds_per_step"] == pytest.approx(0.15)
    assert pods["update_seconds_per_step"] == pytest.approx(0.2)
    assert pods["peak_accuracy"] == pytest.approx(0.9)
    paths = write_report(result, tmp_path / "report")
    assert paths["accuracy"].stat().st_size > 0 and paths["step_time"].stat().st_size > 0
    assert "pods 16->4 max_variance" in paths["table"].read_text()


def test_band_stays_within_accuracy_bounds_and_holds_the_mean(tmp_path):
    rng = random.Random(0)
    # 2 seeds of noisy curves: the raw t-interval (t = 12.7) crosses 0 and 1
    runs = [fake_run(tmp_path, "grpo", "grpo", seed, [(10 * k, rng.random()) for k in range(8)]) for seed in (0, 1)]
    arm = analyze(runs)["arms"]["grpo 4/4"]
    lower, upper = arm.band()
    assert any(m - h < 0 or m + h > 1 for m, h in zip(arm.mean, arm.half_width))  # the case the clip is for
    assert all(0.0 <= lo <= m <= hi <= 1.0 for lo, m, hi in zip(lower, arm.mean, upper))


def test_arm_that_never_reaches_target_is_reported(tmp_path):
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.5), (10, 0.9)]),
            fake_run(tmp_path, "ga", "grpo-ga", 0, [(0, 0.5), (10, 0.6)])]
    rows = {r["arm"]: r for r in analyze(runs)["rows"]}
    assert rows["grpo-ga 16"]["time_to_target"] is None
    assert rows["grpo-ga 16"]["seeds_reaching_target"] == 0


def test_a_seed_that_misses_the_target_is_censored_at_its_budget_not_dropped(tmp_path):
    baseline = [[(0, 0.5), (10, 0.6), (20, 0.8), (40, 0.8)],  # reaches 0.792 at 19.6 s
                [(0, 0.5), (10, 0.6), (20, 0.8), (40, 0.8)],
                [(0, 0.5), (10, 0.6), (20, 0.7), (40, 0.7)]]  # never: censored at 40 s
    pods = [[(0, 0.5), (5, 0.7), (10, 0.9), (40, 0.9)],  # 7.3 s
            [(0, 0.5), (10, 0.6), (20, 0.7), (30, 0.7)],  # never: censored at 30 s
            [(0, 0.5), (5, 0.7), (10, 0.9), (40, 0.9)]]  # 7.3 s
    runs = [fake_run(tmp_path, "grpo", "grpo", seed, evals) for seed, evals in enumerate(baseline)]
    runs += [fake_run(tmp_path, "pods", "pods", seed, evals) for seed, evals in enumerate(pods)]
    result = analyze(runs)
    assert result["target_accuracy"] == pytest.approx(0.99 * (0.8 + 0.8 + 0.7) / 3)
    target = result["target_accuracy"]
    row = {r["arm"]: r for r in result["rows"]}["pods 16->4 max_variance"]
    pairs = {p["seed"]: p for p in row["seed_pairs"]}
    assert len(pairs) == 3 and row["censored_pairs"] == 2
    base_time = 10 + 10 * (target - 0.6) / 0.2
    pods_time = 5 + 5 * (target - 0.7) / 0.2
    assert pairs[0] == pytest.approx({"seed": 0, "ratio": base_time / pods_time, "baseline_seconds": base_time,
                                      "arm_seconds": pods_time, "censored": ""})
    assert pairs[1]["censored"] == "arm" and pairs[1]["ratio"] == pytest.approx(base_time / 30)  # upper bound
    assert pairs[2]["censored"] == "baseline" and pairs[2]["ratio"] == pytest.approx(40 / pods_time)  # lower bound
    ratios = [pairs[s]["ratio"] for s in (0, 1, 2)]
    assert row["speedup_per_seed_mean"] == pytest.approx(sum(ratios) / 3)
    assert row["seeds_reaching_target"] == 2
    table = format_table(result)
    assert "(3 pairs, 2 censored)" in table and "seed 1: ratio" in table and "an upper bound" in table
    assert "seed 2: ratio" in table and "a lower bound" in table


def test_runs_are_paired_by_seed_not_by_position(tmp_path):
    fast = [(0, 0.5), (10, 0.9)]  # reaches 0.891 at 9.775 s
    slow = [(0, 0.5), (20, 0.9)]  # at 19.55 s
    runs = [fake_run(tmp_path, "grpo", "grpo", 1, slow), fake_run(tmp_path, "grpo", "grpo", 0, fast),
            fake_run(tmp_path, "pods", "pods", 0, fast), fake_run(tmp_path, "pods", "pods", 1, fast),
            fake_run(tmp_path, "pods", "pods", 2, fast)]  # seed 2 has no baseline run: no pair
    row = {r["arm"]: r for r in analyze(runs)["rows"]}["pods 16->4 max_variance"]
    assert [(p["seed"], round(p["ratio"], 6)) for p in row["seed_pairs"]] == [(0, 1.0), (1, 2.0)]


def test_accuracy_at_fractions_of_the_common_budget(tmp_path):
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.2), (40, 0.6)]),
            fake_run(tmp_path, "pods", "pods", 0, [(0, 0.2), (20, 0.6), (80, 0.8)])]
    result = analyze(runs)
    assert result["budget_seconds"] == 40  # the shortest run sets the common budget
    rows = {r["arm"]: r for r in result["rows"]}
    assert rows["grpo 4/4"]["accuracy_at_budget"] == pytest.approx({"0.25": 0.3, "0.5": 0.4, "1.0": 0.6})
    assert rows["pods 16->4 max_variance"]["accuracy_at_budget"] == pytest.approx(
        {"0.25": 0.4, "0.5": 0.6, "1.0": 0.6 + 0.2 * 20 / 60})


def test_report_states_the_runs_own_commit_dates_machine_and_order(tmp_path):
    def env(date, commit="abc1234"):
        return [{"date": date, "commit": commit, "machine": "CPU X, 2 cores, no GPU, Linux x86_64", "torch": "2.13.0",
                 "torch_threads": 2}]

    evals = [(0, 0.5), (10, 0.9)]
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, evals, environment=env("2026-11-23T10:00:00+00:00")),
            fake_run(tmp_path, "pods", "pods", 0, evals, environment=env("2026-11-23T10:02:00+00:00")),
            fake_run(tmp_path, "pods", "pods", 1, evals, environment=env("2026-11-23T10:04:00+00:00", "def5678")),
            fake_run(tmp_path, "grpo", "grpo", 1, evals, environment=env("2026-11-23T10:06:00+00:00", "def5678"))]
    result = analyze(runs)
    assert result["provenance"]["order"] == ["grpo 4/4", "pods 16->4 max_variance", "pods 16->4 max_variance",
                                             "grpo 4/4"]
    table = format_table(result)
    assert "runs started 2026-11-23T10:00:00+00:00 to 2026-11-23T10:06:00+00:00" in table
    assert "code abc1234, def5678" in table and "machine: CPU X, 2 cores" in table
    assert "run order (by start time): A B B A (A = grpo 4/4, B = pods 16->4 max_variance)" in table


def test_runs_are_interleaved_seed_by_seed_alternating_the_arm_order():
    plan = run_plan(["A", "B", "C"], [0, 1, 2])
    assert plan == [("A", 0), ("B", 0), ("C", 0), ("C", 1), ("B", 1), ("A", 1), ("A", 2), ("B", 2), ("C", 2)]


def test_arms_cover_methods_rules_and_sweeps():
    base = make_config()
    arms = arm_configs(base, ["grpo", "grpo-ga", "pods"], ["max_variance", "random"], [8, 16], [4])
    names = [(a["method"], a.get("num_generations"), a.get("num_kept"), a.get("downsampling_rule")) for a in arms]
    assert ("grpo", 16, 4, None) in names and ("grpo-ga", 8, 4, None) in names
    assert ("pods", 16, 4, "random") in names and len(arms) == 1 + 2 + 4
    with pytest.raises(ValueError, match="methods: unknown method"):
        arm_configs(base, ["ppo"], [], [16], [4])


@pytest.mark.slow
def test_compare_end_to_end(random_model_dir, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "cmp"
    args = ["compare", "--model", random_model_dir, "--task", "parity", "--methods", "grpo,pods", "--seeds", "2",
            "--budget_minutes", "0.01", "--prompts_per_step", "2", "--num_generations", "4", "--num_kept", "2",
            "--eval_steps", "2",
            "--eval_prompts", "4", "--eval_samples", "1", "--output_dir", str(out)]
    # the parity task is registered by conftest: import it in the child process too
    code = "import sys, tests.conftest; from podsrl.cli import main; raise SystemExit(main(sys.argv[1:]))"
    repo = Path(__file__).resolve().parents[1]

    def compare():
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600,
                              cwd=repo)

    result = compare()
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "compare.json").read_text())
    assert {r["arm"] for r in summary["rows"]} == {"grpo 2/2", "pods 4->2 max_variance"}
    assert all(r["seeds"] == 2 for r in summary["rows"])
    assert (out / "accuracy.png").exists() and (out / "pods-n4-m2-max_variance" / "seed1" / "summary.json").exists()
    # interleaved: seed 0 grpo then pods, seed 1 pods then grpo; each run recorded its environment
    started = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("[")]
    assert [Path(p).parent.name + "/" + Path(p).name for p in started] == [
        "grpo-m2/seed0:", "pods-n4-m2-max_variance/seed0:", "pods-n4-m2-max_variance/seed1:", "grpo-m2/seed1:"]
    assert summary["provenance"]["order"] == ["grpo 2/2", "pods 4->2 max_variance", "pods 4->2 max_variance",
                                              "grpo 2/2"]
    again = compare()  # finished runs are reused, not retrained
    assert again.returncode == 0 and again.stdout.count("done earlier, reused") == 4


def test_benchmarks_write_their_own_blocks_into_results_md(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results_md.py"
    spec = importlib.util.spec_from_file_location("results_md", path)
    results_md = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results_md)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nhand-written text\n")
    results_md.record("tta-methods", "| a | b |", results)
    results_md.record("other", "second", results)
    results_md.record("tta-methods", "| c | d |", results)  # replaces its own block only
    text = results.read_text()
    assert text.startswith("# Results\n\nhand-written text\n")
    assert "| a | b |" not in text and text.count("| c | d |") == 1 and "second" in text
    block = text.split("<!-- begin generated: tta-methods -->")[1].split("<!-- end generated: tta-methods -->")[0]
    assert "Generated by `python " in block and "code " in block and "cores" in block and "| c | d |" in block
    with pytest.raises(ValueError, match="--record"):
        results_md.record("bad name", "x", results)


@pytest.mark.parametrize("field, values", [("learning_rate", (1e-3, 2e-3)), ("max_minutes", (1.0, 2.0)),
                                           ("task_level", (1, 3)), ("model", ("tiny", "smollm2-135m-instruct"))])
def test_seeds_of_one_arm_that_differ_in_more_than_the_seed_are_warned_about(tmp_path, capsys, field, values):
    runs = [fake_run(tmp_path, "pods", "pods", seed, [(0, 0.5), (10, 0.9)]) for seed in (0, 1)]
    for run, value in zip(runs, values):
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, field: value, "output_dir": str(run)}))
    analyze(runs)
    warning = capsys.readouterr().err
    assert f"averages {runs[0]} and {runs[1]} as seeds, but they differ in {field} ({values[0]!r} vs " in warning
    assert "output_dir" not in warning.split("differ in")[1]  # where a run was written is no difference


def test_seeds_that_differ_only_in_the_seed_give_no_warning(tmp_path, capsys):
    analyze([fake_run(tmp_path, "pods", "pods", seed, [(0, 0.5), (10, 0.9)]) for seed in (0, 1, 2)])
    assert "warning" not in capsys.readouterr().err


def test_update_memory_column_only_for_runs_that_logged_it(tmp_path):
    """Runs from before the memory measure keep their table; runs that logged it get the
    largest logged value per arm (NaN, as off CUDA, read as not logged)."""
    old = [fake_run(tmp_path / "old", "grpo", "grpo", 0, [(0, 0.1), (10, 0.2)])]
    assert "update memory" not in format_table(analyze(old))
    runs = []
    for seed, (activation, cuda) in enumerate([(10.0, None), (12.0, None)]):
        run = fake_run(tmp_path / "new", "grpo-ga", "grpo-ga", seed, [(0, 0.1), (10, 0.2), (20, 0.3)])
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for k, r in enumerate(records[1:], start=1):
            r.update(update_activation_mb=activation - k, update_peak_cuda_mb=cuda)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        runs.append(run)
    result = analyze(runs)
    row = result["rows"][0]
    assert row["update_activation_mb"] == 11.0 and row["update_peak_cuda_mb"] is None
    table = format_table(result)
    assert "update memory, MiB (activations / CUDA peak)" in table and "| 11 / n/a |" in table


def test_partial_rollouts_numbers_are_reported_per_arm_only_for_runs_that_logged_them(tmp_path):
    """Per-step means over seeds of the off-policy share, staleness (its largest), resumed and
    restarted samples and idle slots; runs that logged none keep their report."""
    plain = fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.1), (10, 0.2)])
    assert "Partial rollouts" not in format_table(analyze([plain]))
    runs = []
    for seed, staleness in enumerate(([0.1, 0.3], [0.2, 0.4])):
        run = fake_run(tmp_path, "pods", "pods", seed, [(0, 0.1), (10, 0.2), (20, 0.3)])
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for r, value in zip(records[1:], staleness):
            r.update(off_policy_token_frac=value, staleness_mean=value, staleness_max=1 + seed,
                     partial_samples_resumed=4, partial_samples_restarted=seed, idle_slot_frac=0.5)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        runs.append(run)
    numbers = analyze(runs)["rows"][0]["off_policy"]
    assert numbers["off_policy_token_frac"] == pytest.approx(0.25) and numbers["staleness_max"] == 2
    assert numbers["partial_samples_restarted"] == pytest.approx(0.5)
    assert ("off-policy tokens 25.0%, staleness 0.25 (max 2), 4.0 samples resumed and 0.5 restarted a step; "
            "idle slots 50.0%") in format_table(analyze(runs))


def test_ms_per_generated_rollout_divides_by_the_rollouts_the_steps_generated(tmp_path):
    """Early stop generates fewer than n x prompts: 196 of 256 here, so a generated rollout costs
    the inference seconds over 196 (#80 item 7; it divided by 256); a trained one, the update seconds
    over prompts x m. Dynamic sampling's rounds count their prompts x n; a run that logged neither
    generated n x prompts."""
    def run(name, logged):
        folder = fake_run(tmp_path, name, "pods", 0, [(0, 0.1), (10, 0.2), (20, 0.3)], step_times=(1.0, 0.176, 0.64))
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "prompts_per_step": 16}))
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for r, fields in zip(records[1:], logged):
            r.update(fields)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return folder

    early_stop = load_run(run("early-stop", [{"rollouts_generated": 190}, {"rollouts_generated": 202}]))
    assert early_stop.rollout_milliseconds() == pytest.approx((1000 * 1.176 / 196, 1000 * 0.64 / 64))
    rows = {r["arm"]: r for r in analyze([early_stop.path])["rows"]}
    assert rows["pods 16->4 max_variance"]["rollout_ms"] == pytest.approx([1000 * 1.176 / 196, 10.0])
    grpo = fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.1), (10, 0.15), (20, 0.2)])
    assert "pods 16->4 max_variance 6.0 / 10.0" in format_table(analyze([grpo, early_stop.path]))  # 4.6 over 256
    rounds = load_run(run("dynamic", [{"prompts_generated": 16, "rollouts_generated": 200},
                                      {"prompts_generated": 32, "rollouts_generated": 190}]))
    assert rounds.rollout_milliseconds()[0] == pytest.approx(1000 * 1.176 / (24 * 16))
    assert load_run(run("plain", [{}, {}])).rollout_milliseconds()[0] == pytest.approx(1000 * 1.176 / 256)


def test_each_arm_runs_once_per_prompt_selector_and_is_named_by_it(monkeypatch):
    base = make_config()
    arms = arm_configs(base, ["grpo", "pods"], ["max_variance"], [16], [4], ["shuffled", "pass_rate"])
    assert [(a["method"], a["prompt_selector"]) for a in arms] == [
        ("grpo", "shuffled"), ("grpo", "pass_rate"), ("pods", "shuffled"), ("pods", "pass_rate")]
    assert [arm_dir_name(a) for a in arms] == ["grpo-m4", "grpo-m4-pass_rate", "pods-n16-m4-max_variance",
                                               "pods-n16-m4-max_variance-pass_rate"]
    # dynamic sampling crosses the selectors: it composes with each
    arms = arm_configs(base, ["pods"], ["max_variance"], [16], [4], ["shuffled", "pass_rate"], [False, True])
    assert [arm_dir_name(a) for a in arms] == [
        "pods-n16-m4-max_variance", "pods-n16-m4-max_variance-dynamic_sampling", "pods-n16-m4-max_variance-pass_rate",
        "pods-n16-m4-max_variance-dynamic_sampling-pass_rate"]
    assert arm_configs(base, ["pods"], ["max_variance"], [16], [4]) == [
        {"method": "pods", "num_generations": 16, "num_kept": 4, "downsampling_rule": "max_variance"}]
    # partial rollouts cross every other arm too, and name theirs with the groups in flight
    arms = arm_configs(base, ["grpo", "pods"], ["max_variance"], [16], [4], (), [False, True], [False, True])
    assert [arm_dir_name(a) for a in arms] == [
        "grpo-m4", "grpo-m4-partial_2", "grpo-m4-dynamic_sampling", "grpo-m4-partial_2-dynamic_sampling",
        "pods-n16-m4-max_variance", "pods-n16-m4-max_variance-partial_2", "pods-n16-m4-max_variance-dynamic_sampling",
        "pods-n16-m4-max_variance-partial_2-dynamic_sampling"]
    assert compared_arms(monkeypatch, "--partial_rollouts", "false,true", "--partial_extra_prompts", "4")[0] == [
        {"method": "pods", "num_generations": 16, "num_kept": 4, "downsampling_rule": "max_variance",
         "partial_rollouts": on} for on in (False, True)]
    with pytest.raises(ValueError, match="prompt_selector: unknown prompt selector 'oracle'"):
        arm_configs(base, ["pods"], ["max_variance"], [16], [4], ["oracle"])


def test_a_learning_rate_sweep_runs_each_arm_once_per_rate_and_names_only_swept_arms_by_it(monkeypatch, tmp_path,
                                                                                          capsys):
    base = make_config()
    arms = arm_configs(base, ["grpo", "pods"], ["max_variance"], [16], [4], learning_rates=[6e-5, 2e-4])
    assert [(a["method"], a["learning_rate"]) for a in arms] == [
        ("grpo", 6e-5), ("grpo", 2e-4), ("pods", 6e-5), ("pods", 2e-4)]
    assert [arm_dir_name(a) for a in arms] == ["grpo-m4-lr6e_05", "grpo-m4-lr0.0002",
                                               "pods-n16-m4-max_variance-lr6e_05", "pods-n16-m4-max_variance-lr0.0002"]
    assert planned_arm_names(base, arms) == ["grpo 4/4 lr 6e-05", "grpo 4/4 lr 0.0002",
                                             "pods 16->4 max_variance lr 6e-05", "pods 16->4 max_variance lr 0.0002"]
    # one rate is no sweep: the arm keeps the name every earlier report gave it
    assert planned_arm_names(base, arm_configs(base, ["pods"], ["max_variance"], [16], [4], learning_rates=[1e-3])) \
        == ["pods 16->4 max_variance"]
    runs = []
    for seed in (0, 1):
        for rate, curve in ((1e-4, [(0, 0.5), (10, 0.6), (20, 0.7)]), (1e-3, [(0, 0.5), (10, 0.7), (20, 0.8)])):
            run = fake_run(tmp_path / f"lr{rate:g}", "pods", "pods", seed, curve)
            config = json.loads((run / "config.json").read_text())
            (run / "config.json").write_text(json.dumps({**config, "learning_rate": rate}))
            runs.append(run)
        runs.append(fake_run(tmp_path, "grpo", "grpo", seed, [(0, 0.5), (10, 0.6), (20, 0.7)]))
    result = analyze(runs, baseline="pods 16->4 max_variance lr 0.0001")
    rows = {r["arm"]: r for r in result["rows"]}
    assert set(rows) == {"pods 16->4 max_variance lr 0.0001", "pods 16->4 max_variance lr 0.001", "grpo 4/4"}
    assert rows["pods 16->4 max_variance lr 0.001"]["seeds"] == 2
    assert rows["pods 16->4 max_variance lr 0.001"]["final_accuracy"] == pytest.approx(0.8)
    assert rows["pods 16->4 max_variance lr 0.001"]["speedup_per_seed_mean"] > 1
    assert compared_arms(monkeypatch, "--learning_rates", "1e-4,1e-3")[0] == [
        {"method": "pods", "num_generations": 16, "num_kept": 4, "downsampling_rule": "max_variance",
         "learning_rate": rate} for rate in (1e-4, 1e-3)]
    from podsrl import cli

    monkeypatch.undo()  # compared_arms's stand-in: the real comparison validates every arm before it runs
    monkeypatch.setattr("podsrl.experiments.compare.train", lambda cfg: pytest.fail("a run started"))
    for rates, error in (("1e-4,fast", "learning_rate: expected float, got 'fast'"), ("1e-4,0", "learning_rate")):
        assert cli.main(["compare", "--budget_steps", "2", "--learning_rates", rates,
                         "--output_dir", str(tmp_path / "cmp")]) == 2
        assert error in capsys.readouterr().err


def compared_arms(monkeypatch, *args):
    """The arms `podsrl compare --methods pods ARGS` would run (nothing runs): their overrides
    and (rule, prompt selector) of each arm's config."""
    from podsrl import cli

    planned = []

    def plan(base, arms, *rest, **kwargs):
        planned.extend((arm, dataclasses.replace(base, **arm)) for arm in arms)
        raise ValueError("planned")
    monkeypatch.setattr(cli, "run_comparison", plan)
    cli.main(["compare", "--budget_minutes", "1", "--methods", "pods", *args])
    return [arm for arm, _ in planned], [(cfg.downsampling_rule, cfg.prompt_selector) for _, cfg in planned]


def test_compare_keeps_the_shared_configs_rule_and_selector_when_no_sweep_names_others(monkeypatch, tmp_path):
    """`--downsampling_rule random` (or a rule with arguments) without --rules is the rule of
    every pods arm, labels and folders included; it was silently replaced by max_variance."""
    for given in ("random", '{"name": "random"}'):
        arms, used = compared_arms(monkeypatch, "--downsampling_rule", given, "--prompt_selector", "pass_rate")
        assert used == [("random", "pass_rate")] and arm_dir_name(arms[0]) == "pods-n16-m4-random"
    path = tmp_path / "rules.py"
    path.write_text("def ranked(rewards, m, generator=None, keep='lowest'):\n"
                    "    return rewards.argsort(dim=1)[:, :m].sort(dim=1).values\n")
    mapping = {"name": f"{path}:ranked", "keep": "a,b"}
    arms, used = compared_arms(monkeypatch, "--downsampling_rule", json.dumps(mapping))
    assert used == [(mapping, "shuffled")] and arm_dir_name(arms[0]).endswith("rules.py_ranked_keep__a_b__")


def test_compare_splits_json_arms_on_top_level_commas_only(monkeypatch, tmp_path):
    path = tmp_path / "rules.py"
    path.write_text("def ranked(rewards, m, generator=None, keep='lowest', by=[0]):\n"
                    "    return rewards.argsort(dim=1)[:, :m].sort(dim=1).values\n")
    mapping = {"name": f"{path}:ranked", "by": [1, 2], "keep": "a,b}"}
    arms, used = compared_arms(monkeypatch, "--rules", f"random, {json.dumps(mapping)},max_reward",
                         "--prompt_selectors", 'shuffled,{"name": "pass_rate"}')
    assert arms[1] == {"method": "pods", "num_generations": 16, "num_kept": 4, "downsampling_rule": "random",
                       "prompt_selector": "pass_rate"}
    assert used == [(rule, selector) for rule in ("random", mapping, "max_reward")
                    for selector in ("shuffled", "pass_rate")]


def test_compare_validates_every_arm_before_the_first_runs(random_model_dir, monkeypatch, tmp_path, capsys):
    from podsrl import cli

    monkeypatch.setattr("podsrl.experiments.compare.train", lambda cfg: pytest.fail("an arm ran"))
    code = cli.main(["compare", "--budget_minutes", "1", "--methods", "pods", "--model", random_model_dir,
                     "--rules", 'max_variance,{"name": "max_variance", "nope": 1}', "--output_dir", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "podsrl compare: error: arm pods-n16-m4-max_variance_nope_1_: downsampling_rule: max_variance takes no "
        "argument 'nope' (it takes: none)")
    assert list(tmp_path.iterdir()) == []
    code = cli.main(["compare", "--budget_minutes", "1", "--methods", "pods", "--rules", "max_variance,{nope",
                     "--output_dir", str(tmp_path)])
    assert code == 2 and "podsrl compare: error: downsampling_rule: not valid JSON" in capsys.readouterr().err


@pytest.mark.slow
def test_a_restarted_comparison_starts_a_run_that_stopped_before_its_first_checkpoint_afresh(random_model_dir,
                                                                                             tmp_path, monkeypatch):
    """compare resumed any run folder holding metrics.jsonl; one with no checkpoint yet has
    nothing to resume, and the restarted comparison stopped there every time (#38)."""
    from podsrl.experiments.compare import run_comparison

    base = make_config(overrides={"model": random_model_dir, "task": "parity", "prompts_per_step": "2",
                                  "num_generations": "4", "num_kept": "2", "max_completion_length": "6",
                                  "eval_prompts": "4", "eval_samples": "1", "eval_steps": "0", "save_steps": "50"})
    arms = arm_configs(base, ["pods"], ["max_variance"], [4], [2])

    def bug(*_args, **_kwargs):
        raise RuntimeError("a bug in step 1")

    with monkeypatch.context() as patch, pytest.raises(RuntimeError, match="a bug in step 1"):
        patch.setattr("podsrl.trainer.stages.update_policy", bug)
        run_comparison(base, arms, 1, 0.01, tmp_path, log=lambda _line: None)
    (run_dir,) = run_comparison(base, arms, 1, 0.01, tmp_path, log=lambda _line: None)
    assert (run_dir / "summary.json").exists()


@pytest.mark.slow
def test_compare_budget_in_steps_gives_every_arm_the_same_steps(random_model_dir, tmp_path, capsys):
    # the paper's per-step comparison: a slower arm (pods generates 2x the rollouts) still gets every step
    from podsrl import cli
    from podsrl.metrics import read_metrics

    out = tmp_path / "steps"
    code = cli.main(["compare", "--budget_steps", "3", "--methods", "grpo,pods", "--seeds", "1", "--model",
                     random_model_dir, "--task", "parity", "--prompts_per_step", "2", "--num_generations", "4",
                     "--num_kept", "2", "--eval_steps", "0", "--eval_prompts", "4", "--eval_samples", "1",
                     "--save_steps", "0", "--output_dir", str(out)])
    assert code == 0, capsys.readouterr().err
    for arm in ("grpo-m2", "pods-n4-m2-max_variance"):
        assert read_metrics(out / arm / "seed0" / "metrics.jsonl")[-1]["step"] == 3
        assert json.loads((out / arm / "seed0" / "config.json").read_text())["max_minutes"] == 0


def test_compare_needs_a_budget(tmp_path, capsys):
    from podsrl import cli

    assert cli.main(["compare", "--methods", "pods", "--output_dir", str(tmp_path / "c")]) == 2
    assert "budget_minutes or budget_steps: give one" in capsys.readouterr().err


def test_a_baseline_that_names_no_arm_is_refused_before_any_run(tmp_path, monkeypatch, capsys):
    """`--baseline bogus` fell back to the first grpo arm, rc 0, without a word (#57)."""
    from podsrl import cli

    monkeypatch.setattr("podsrl.experiments.compare.train", lambda cfg: pytest.fail("a run started"))
    out = tmp_path / "cmp"
    code = cli.main(["compare", "--methods", "grpo,pods", "--seeds", "1", "--budget_steps", "2", "--baseline",
                     "bogus", "--output_dir", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == (
        "podsrl compare: error: baseline: 'bogus' names no arm of this comparison; its arms: grpo 4/4; "
        "pods 16->4 max_variance (give an arm's name or its method)")
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.5), (10, 0.6)]),
            fake_run(tmp_path, "pods", "pods", 0, [(0, 0.5), (10, 0.7)])]
    with pytest.raises(ValueError, match="baseline: 'grpo-ga' names no arm"):
        analyze(runs, baseline="grpo-ga")
    assert analyze(runs, baseline="pods")["baseline"] == "pods 16->4 max_variance"
    assert analyze(runs, baseline="grpo 4/4")["baseline"] == "grpo 4/4"


def planned_runs(tmp_path, monkeypatch, state: str, **changed):
    """A comparison of one pods arm and one seed whose run folder holds a ``state`` run
    ('finished' or 'interrupted') of the same command, then run_comparison with ``changed``
    fields of the shared config; returns the configs train was called with."""
    from podsrl.experiments.compare import _run_config, run_comparison
    from podsrl.trainer.checkpoints import STATE_FILE

    base = make_config(overrides={"prompts_per_step": "2", "num_generations": "4", "num_kept": "2"})
    (arm,) = arm_configs(base, ["pods"], ["max_variance"], [4], [2])
    run_dir = tmp_path / arm_dir_name(arm) / f"seed{base.seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(_run_config(base, arm, base.seed, 0, run_dir, 2).to_dict()))
    if state == "finished":
        (run_dir / "summary.json").write_text("{}")
    else:
        (run_dir / "checkpoints" / "step_0000001").mkdir(parents=True)
        (run_dir / "checkpoints" / "step_0000001" / STATE_FILE).write_text('{"step": 1}')
    trained = []

    def train(cfg):
        trained.append(cfg)
        return type("Result", (), {"steps": 2, "initial": {"eval_accuracy": 0.5}, "final": {"eval_accuracy": 0.5}})

    monkeypatch.setattr("podsrl.experiments.compare.train", train)
    base = dataclasses.replace(base, **{k: v for k, v in changed.items() if k != "budget_steps"})
    run_comparison(base, [arm], 1, 0, tmp_path, log=lambda line: None, budget_steps=changed.get("budget_steps", 2))
    return trained


@pytest.mark.parametrize("state", ["finished", "interrupted"])
def test_a_rerun_reuses_or_resumes_only_runs_of_its_own_config(tmp_path, monkeypatch, state):
    """A re-run with --learning_rate 0.001 or a larger --budget_steps said "done earlier, reused" and
    reported the old runs as the new command's (#57)."""
    trained = planned_runs(tmp_path / "same", monkeypatch, state)
    assert [cfg.resume for cfg in trained] == ([] if state == "finished" else ["auto"])  # the trainer resumes it
    folder = f"pods-n4-m2-max_variance/seed{make_config().seed}"
    for changed, shown in [({"learning_rate": 0.001}, "learning_rate is 0.0002 there, 0.001 in this one"),
                           ({"budget_steps": 3}, "max_steps (--budget_steps) is 2 there, 3 in this one"),
                           ({"budget_steps": 0}, "max_steps (--budget_steps) is 2 there, no step limit in this one")]:
        root = tmp_path / str(changed)
        with pytest.raises(ValueError) as refused:
            planned_runs(root, monkeypatch, state, **changed)
        assert str(refused.value).startswith(f"output_dir: {root / folder} holds a {state} run of another command: "
                                             f"{shown}; compare reuses only runs of the same config: give this "
                                             f"comparison another --output_dir")


def compare_with_a_fake_train(tmp_path, monkeypatch, static_arms: set, finished: set = frozenset()):
    """run_comparison of grpo and pods, 2 seeds, ``static_arms`` (methods) with the static KV cache;
    runs of ``finished`` methods done earlier. Returns the lines said and, per call of train, its
    config and whether its output folder existed then."""
    from podsrl.experiments.compare import _run_config, run_comparison

    base = make_config(overrides={"prompts_per_step": "2", "num_generations": "4", "num_kept": "2",
                                  "generation_dtype": "float32"})
    arms = [{**arm, "generation_static_cache": arm["method"] in static_arms}
            for arm in arm_configs(base, ["grpo", "pods"], ["max_variance"], [4], [2])]
    for arm in arms:
        for seed in (base.seed, base.seed + 1):
            run_dir = tmp_path / "cmp" / arm_dir_name(arm) / f"seed{seed}"
            if arm["method"] in finished:
                run_dir.mkdir(parents=True)
                (run_dir / "config.json").write_text(json.dumps(_run_config(base, arm, seed, 0, run_dir, 2).to_dict()))
                (run_dir / "summary.json").write_text("{}")
    calls, said = [], []

    def train(cfg):
        calls.append((cfg, Path(cfg.output_dir).parent.exists()))
        return type("Result", (), {"steps": 1, "initial": {"eval_accuracy": 0.5}, "final": {"eval_accuracy": 0.5}})

    monkeypatch.setattr("podsrl.experiments.compare.train", train)
    run_comparison(base, arms, 2, 0, tmp_path / "cmp", log=said.append, budget_steps=2)
    return said, calls


def test_compare_warms_the_static_caches_compile_up_untimed_before_its_first_timed_run(tmp_path, monkeypatch):
    """With generation_static_cache the first run of a comparison paid transformers' compile of the
    decode step inside its budget (43.9 s of GRPO's 45 s on an H200), no later run did (#57)."""
    said, calls = compare_with_a_fake_train(tmp_path, monkeypatch, static_arms={"pods"})
    (warm, existed), *timed = calls
    assert len(timed) == 4 and warm.max_steps == 1 and warm.max_minutes == 0 and not warm.resume
    assert existed and not Path(warm.output_dir).parent.exists()  # its own temporary folder, removed afterwards
    assert not Path(warm.output_dir).is_relative_to(tmp_path / "cmp")
    assert warm.method == "pods" and warm.generation_static_cache  # the first run that compiles: pods, after grpo
    assert dataclasses.replace(warm, output_dir=timed[1][0].output_dir, max_steps=2, save_steps=timed[1][0].save_steps,
                               log_rollouts=timed[1][0].log_rollouts, resume=timed[1][0].resume) == timed[1][0]
    # otherwise that run's config
    assert said[0].startswith(f"warm-up: 1 untimed training step of pods-n4-m2-max_variance/seed{warm.seed} in ")
    assert len([line for line in said if line.startswith("warm-up")]) == 1


@pytest.mark.parametrize("static_arms, finished", [(set(), set()), ({"pods"}, {"pods"})])
def test_compare_warms_nothing_up_when_no_run_it_trains_compiles(tmp_path, monkeypatch, static_arms, finished):
    said, calls = compare_with_a_fake_train(tmp_path, monkeypatch, static_arms, finished)
    assert len(calls) == 4 - 2 * len(finished) and all(cfg.max_steps == 2 for cfg, _ in calls)
    assert not [line for line in said if line.startswith("warm-up")]


@pytest.mark.slow
def test_the_warm_up_trains_for_real_and_leaves_nothing(random_model_dir, tmp_path, capsys, monkeypatch):
    import tempfile

    from podsrl import cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    code = cli.main(["compare", "--budget_steps", "1", "--methods", "pods", "--seeds", "1", "--model",
                     random_model_dir, "--task", "parity", "--prompts_per_step", "2", "--num_generations", "4",
                     "--num_kept", "2", "--eval_prompts", "2", "--eval_samples", "1", "--generation_dtype", "float32",
                     "--generation_static_cache", "true", "--output_dir", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("warm-up: 1 untimed training step of pods-n4-m2-max_variance/seed0 in ")
    assert list((tmp_path / "tmp").iterdir()) == []
    assert {p.name for p in (tmp_path / "cmp").iterdir()} == {"pods-n4-m2-max_variance", "accuracy.png", "compare.md",
                                                              "compare.json", "step_time.png", "podsrl_report.json"}

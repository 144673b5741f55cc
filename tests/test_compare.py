"""podsrl compare: the speedup metric against hand-made curves, and an end-to-end run."""

import json
import random

import pytest

from podsrl.compare import analyze, arm_configs, mean_ci, write_report
from podsrl.config import make_config


def fake_run(root, name, method, seed, evals, n=16, m=4, rule="max_variance", step_times=(0.1, 0.05, 0.2)):
    """A run directory with the given (seconds, accuracy) evaluations."""
    run = root / name / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": method, "n": n, "m": m, "rule": rule, "seed": seed}))
    generate, reward, update = step_times
    records = [{"step": 0, "train_seconds": 0.0, "eval_accuracy": evals[0][1]}]
    for i, (t, acc) in enumerate(evals[1:], start=1):
        records.append({"step": i, "train_seconds": t, "eval_accuracy": acc, "time_generate": generate,
                        "time_reward": reward, "time_update": update, "time_select": 0.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


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


def test_confidence_interval():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / 3 ** 0.5, rel=1e-3)


def test_arms_cover_methods_rules_and_sweeps():
    base = make_config()
    arms = arm_configs(base, ["grpo", "grpo-ga", "pods"], ["max_variance", "random"], [8, 16], [4])
    names = [(a["method"], a.get("n"), a.get("m"), a.get("rule")) for a in arms]
    assert ("grpo", 16, 4, None) in names and ("grpo-ga", 8, 4, None) in names
    assert ("pods", 16, 4, "random") in names and len(arms) == 1 + 2 + 4
    with pytest.raises(ValueError, match="methods: unknown method"):
        arm_configs(base, ["ppo"], [], [16], [4])


def test_compare_end_to_end(random_model_dir, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "cmp"
    args = ["compare", "--model", random_model_dir, "--task", "parity", "--methods", "grpo,pods", "--seeds", "2",
            "--budget_minutes", "0.01", "--prompts_per_step", "2", "--n", "4", "--m", "2", "--eval_every", "2",
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
    again = compare()  # finished runs are reused, not retrained
    assert again.returncode == 0 and again.stdout.count("done earlier, reused") == 4

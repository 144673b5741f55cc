"""benchmarks/tuned_rates.py (#81 item 4): the learning-rate sweep's late accuracy and choice,
against hand-computed cases, and the refusals of a sweep too narrow or dearer than the comparison."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
from test_compare import fake_run

from podsrl.experiments.runs import load_run

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("tuned_rates", REPO / "benchmarks" / "tuned_rates.py")
tuned_rates = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tuned_rates)


def swept_run(root, rate, seed, evals):
    run = fake_run(root / f"lr{rate:g}", "pods", "pods", seed, evals)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "learning_rate": rate}))
    return run


def test_the_sweep_chooses_the_rate_of_the_highest_late_accuracy_not_the_best_single_evaluation(tmp_path):
    # budget 100 s: late = the evaluations at 50 s and after
    runs = [swept_run(tmp_path, 1e-4, 0, [(0, 0.2), (25, 0.3), (50, 0.4), (75, 0.5), (100, 0.6)]),
            swept_run(tmp_path, 1e-4, 1, [(0, 0.2), (25, 0.3), (50, 0.5), (75, 0.5), (100, 0.5)]),
            # one lucky evaluation (0.9) but a lower late mean: (0.2 + 0.2 + 0.9) / 3 and 0.3
            swept_run(tmp_path, 1e-3, 0, [(0, 0.2), (25, 0.6), (50, 0.2), (75, 0.2), (100, 0.9)]),
            swept_run(tmp_path, 1e-3, 1, [(0, 0.2), (25, 0.6), (50, 0.3), (75, 0.3), (100, 0.3)])]
    rows = {row["learning_rate"]: row for row in tuned_rates.sweep_rows(list(map(load_run, runs)), 100.0)}
    assert rows[1e-4]["late_accuracy"] == pytest.approx((0.5 + 0.5) / 2)
    assert rows[1e-3]["late_accuracy"] == pytest.approx(((0.2 + 0.2 + 0.9) / 3 + 0.3) / 2)
    assert rows[1e-4]["seeds"] == 2 and rows[1e-4]["evaluations"] == 3
    # dropping seed 0's 0.9 at lr 1e-3: (0.2 + 0.2) / 2 = 0.2 for that seed, so the mean falls by 0.1167
    assert rows[1e-3]["moved_by_one"] == pytest.approx(((0.2 + 0.2 + 0.9) / 3 - 0.2) / 2)
    assert tuned_rates.chosen_rates(list(rows.values())) == {"pods 16->4 max_variance": 1e-4}
    # dropping seed 0's 0.4 at lr 1e-4: that seed's late mean 0.55, the rate's 0.525
    table = tuned_rates.sweep_table(list(rows.values()), {"pods 16->4 max_variance": 1e-4})
    assert "| pods 16->4 max_variance | 0.0001 | 2 | 4.0 | 50.0% +- 0.0 | 3.0 | 2.5 points | yes |" in table


@pytest.mark.parametrize("rates, sweep, error", [
    ([1e-4, 3e-4], (2, 1.0), "at least 3 rates spanning at least 10x"),
    ([1e-4, 3e-4, 6e-4], (2, 1.0), "at least 3 rates spanning at least 10x"),
    ([1e-4, 3e-4, 1e-3], (2, 3.0), "the sweep (54 run-minutes) would cost more than the comparison (45)")])
def test_a_sweep_too_narrow_or_dearer_than_the_comparison_is_refused(rates, sweep, error, capsys):
    args = argparse.Namespace(sweep_seeds=sweep[0], sweep_minutes=sweep[1], seeds=5, budget_minutes=3.0)
    with pytest.raises(SystemExit):
        tuned_rates.check_budgets(argparse.ArgumentParser(prog="tuned_rates"), args, 3, rates)
    assert error in capsys.readouterr().err
    tuned_rates.check_budgets(argparse.ArgumentParser(), argparse.Namespace(
        sweep_seeds=2, sweep_minutes=2.5, seeds=5, budget_minutes=3.0), 3, [6e-5, 2e-4, 6e-4])

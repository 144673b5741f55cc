"""`podsrl plan` (#81 item 1): the cost model's arithmetic against hand-computed cases, the fit of
the probe's steps, the refusals, and a probe of the three methods on a tiny model."""

from __future__ import annotations

import json

import pytest

from podsrl.cli import main
from podsrl.experiments import economics
from podsrl.experiments.economics import (
    RECORDED,
    Recorded,
    StepCosts,
    break_even,
    fit_line,
    grid,
    recommendation,
)
from podsrl.experiments.plan import arm_seconds, plan_rows
from tests.conftest import quick

COSTS = StepCosts(generated=0.01, trained=0.04, fixed=0.5, prompts=8)  # t/g = 4


def test_each_methods_step_is_its_rollouts_at_their_costs_plus_the_fixed_part():
    # by hand: 0.5 + 8 x (n x 0.01 + m x 0.04)
    assert COSTS.step_seconds("pods", 16, 4) == pytest.approx(0.5 + 8 * (16 * 0.01 + 4 * 0.04))  # 3.06
    assert COSTS.step_seconds("grpo", 16, 4) == pytest.approx(0.5 + 8 * (4 * 0.01 + 4 * 0.04))  # 2.1
    assert COSTS.step_seconds("grpo-ga", 16, 4) == pytest.approx(0.5 + 8 * (16 * 0.01 + 16 * 0.04))  # 6.9


def test_the_break_even_is_the_goal_over_the_step_ratio():
    rows = {row.baseline: row for row in break_even(COSTS, 16, 4)}
    assert rows["grpo-ga"].step_ratio == pytest.approx(6.9 / 3.06)
    assert rows["grpo-ga"].for_1x == pytest.approx(3.06 / 6.9) and rows["grpo-ga"].for_1_5x == pytest.approx(
        1.5 * 3.06 / 6.9)
    assert rows["grpo"].step_ratio == pytest.approx(2.1 / 3.06) and rows["grpo"].for_1x == pytest.approx(3.06 / 2.1)
    # where a trained rollout costs what a generated one does: GRPO-GA's 32 rollouts a prompt against PODS's 20
    even = {row.baseline: row for row in break_even(StepCosts(0.01, 0.01, 0.0, 8), 16, 4)}
    assert even["grpo-ga"].step_ratio == pytest.approx(32 / 20)


def test_the_fit_recovers_a_line_and_needs_two_counts():
    assert fit_line([(64.0, 0.5 + 64 * 0.01), (256.0, 0.5 + 256 * 0.01), (256.0, 0.5 + 256 * 0.01)]) == \
        pytest.approx((0.5, 0.01))
    intercept, slope = fit_line([(10.0, 1.0), (20.0, 2.2), (20.0, 1.8)])  # the two at 20 average to 2.0
    assert (intercept, slope) == pytest.approx((0.0, 0.1))
    with pytest.raises(ValueError, match="two different counts"):
        fit_line([(16.0, 1.0), (16.0, 2.0)])


def test_the_grid_surrounds_the_configs_n_and_m_with_m_below_n():
    cells = grid(16, 4)
    assert (16, 4) in cells and (8, 2) in cells and (32, 8) in cells and all(2 <= m < n for n, m in cells)
    assert grid(4, 2) == [(4, 2), (8, 2), (8, 4)]


# recorded intervals against each baseline spanning 1.19-1.40x (grpo) and 0.34-0.92x (grpo-ga)
RULED = (Recorded("a", "grpo", 16, 4, 1.29, 1.19, 1.40, ""), Recorded("a", "grpo-ga", 16, 4, 0.86, 0.81, 0.92, ""),
         Recorded("b", "grpo-ga", 16, 4, 0.57, 0.34, 0.90, ""))


@pytest.mark.parametrize("costs, says", [
    (StepCosts(0.01, 0.04, 0.0, 8), "against grpo-ga 16 PODS 16 -> 4 needs per-step learning >= 0.40x to be as "
                                    "soon (0.60x for 1.5x): depends on your task"),  # 8 x 0.32 s over 8 x 0.8 s
    (StepCosts(0.0001, 1.0, 0.0, 8), "needs per-step learning >= 0.25x to be as soon (0.38x for 1.5x): likely to pay"),
    (StepCosts(1.0, 0.0001, 0.0, 8), "against grpo-ga 16 PODS 16 -> 4 needs per-step learning >= 1.00x to be as "
                                     "soon (1.50x for 1.5x): unlikely to pay"),
])
def test_the_recommendation_weighs_the_break_even_against_the_recorded_intervals(costs, says, monkeypatch):
    monkeypatch.setattr(economics, "RECORDED", RULED)  # the rule, on intervals fixed here (the record grows)
    assert says in recommendation(costs, 16, 4)


def test_the_recorded_ratios_lie_in_their_intervals():
    assert all(r.low <= r.ratio <= r.high and r.baseline in ("grpo", "grpo-ga") and r.m < r.n for r in RECORDED)


def test_an_arms_seconds_drop_the_warm_up_and_count_what_it_generated():
    config = {"method": "pods", "num_generations": 16, "num_kept": 4, "prompts_per_step": 8}
    records = [{"step": 0, "train_seconds": 0.0, "eval_accuracy": 0.5},
               {"step": 1, "train_seconds": 19.5, "time_generate": 9.0, "time_reward": 1.0, "time_update": 9.0,
                "time_select": 0.1},
               {"step": 2, "train_seconds": 21.2, "time_generate": 1.0, "time_reward": 0.1, "time_update": 0.5,
                "time_select": 0.01, "time_advantages": 0.01, "rollouts_generated": 100, "update_activation_mb": 20.0},
               {"step": 3, "train_seconds": 23.5, "time_generate": 1.2, "time_reward": 0.1, "time_update": 0.7,
                "time_logprobs": 0.2, "rollouts_generated": 120, "update_activation_mb": 30.0}]
    got = arm_seconds(config, records, warmup=1)
    assert got == pytest.approx({"step": 2.0, "generation": 1.2, "update": 0.7, "other": 0.01, "generated": 110.0,
                                 "trained": 32.0, "update_mb": 30.0})
    with pytest.raises(ValueError, match="logged no step after its 3 warm-up"):
        arm_seconds(config, records, warmup=3)


def test_the_plan_rows_hold_each_method_once_per_n_and_m():
    from podsrl.experiments.plan import Probe

    rows = plan_rows(Probe(COSTS, 1.0, None, {}, 0.0), 16, 4)
    keys = [(r["method"], r["n"], r["m"]) for r in rows]
    assert len(keys) == len(set(keys)) and ("pods", 16, 4) in keys and ("grpo-ga", 16, 16) in keys
    pods = next(r for r in rows if (r["method"], r["n"], r["m"]) == ("pods", 16, 4))
    assert pods["step_seconds"] == pytest.approx(3.06) and pods["learning_for_1x_vs_grpo-ga"] == pytest.approx(
        3.06 / 6.9)
    # early stop generated 75% of PODS's n in the probe: its rows are predicted at that share
    early = plan_rows(Probe(COSTS, 0.75, None, {}, 0.0), 16, 4)
    assert next(r for r in early if r["method"] == "pods" and r["n"] == 16 and r["m"] == 4)["step_seconds"] == \
        pytest.approx(0.5 + 8 * (12 * 0.01 + 4 * 0.04))


def test_the_plan_refuses_what_it_cannot_measure(capsys, random_model_dir):
    assert main(["plan", "--model", random_model_dir, "--num_generations", "4", "--num_kept", "4"]) == 2
    assert capsys.readouterr().err.strip() == ("podsrl plan: error: num_kept: the probe tells a generated rollout "
                                               "from a trained one by PODS n -> m with m < n; got m = 4, n = 4")
    assert main(["plan", "--model", random_model_dir, "--probe_steps", "0"]) == 2
    assert "probe_steps: at least 1 step" in capsys.readouterr().err
    assert main(["plan", "--num_kept", "-1"]) == 2  # refused as podsrl train refuses it
    assert capsys.readouterr().err.startswith("podsrl plan: error: num_kept:")


@pytest.mark.slow
def test_a_probe_of_the_three_methods_prints_a_row_per_method_and_n_m(capsys, random_model_dir, tmp_path):
    cfg = quick(random_model_dir, tmp_path / "unused")
    argv = ["plan", "--json", "--probe_steps", "1", "--model", random_model_dir, "--task", "parity",
            "--prompts_per_step", "4", "--num_generations", "6", "--num_kept", "3", "--max_completion_length", "6",
            "--learning_rate", str(cfg.learning_rate)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    costs = report["costs"]
    assert costs["generated_rollout_seconds"] >= 0 and costs["trained_rollout_seconds"] >= 0
    assert set(report["probe_arms"]) == {"pods", "grpo", "grpo-ga"}
    assert report["probe_arms"]["grpo-ga"]["trained"] == 4 * 6 and report["probe_arms"]["pods"]["trained"] == 4 * 3
    rows = {(r["method"], r["n"], r["m"]): r for r in report["methods"]}
    assert {("pods", 6, 3), ("grpo", 3, 3), ("grpo-ga", 6, 6)} <= set(rows)
    assert all(r["step_seconds"] > 0 for r in rows.values()) and "recommendation" in report
    assert not list(tmp_path.iterdir())  # the probe's runs went to a temporary folder, gone

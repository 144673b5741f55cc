"""One evaluation's noise (#51): the standard error of a held-out accuracy with prompts as
clusters, against a brute-force oracle and a simulation, and how compare reports it."""

import json
import math
import random
import statistics

import pytest

from podsrl.experiments.compare import analyze, format_table
from podsrl.trainer.evaluate import clustered_standard_error, prompt_moments
from tests.test_compare import fake_run


def random_records(rng, prompts, samples):
    """Records as generate_and_grade writes them, each prompt with its own success rate."""
    rates = [rng.random() for _ in range(prompts)]
    return [{"index": i, "sample": k, "correct": rng.random() < rates[i]} for i in range(prompts)
            for k in range(samples)]


@pytest.mark.parametrize("seed", range(20))
def test_standard_error_is_the_spread_of_per_prompt_accuracies(seed):
    rng = random.Random(seed)
    prompts, samples = rng.randint(2, 40), rng.randint(1, 6)
    records = random_records(rng, prompts, samples)
    per_prompt = [statistics.fmean(r["correct"] for r in records if r["index"] == i) for i in range(prompts)]
    oracle = statistics.stdev(per_prompt) / math.sqrt(prompts)
    assert clustered_standard_error(*prompt_moments(records)) == pytest.approx(oracle, abs=1e-12)


def test_moments_add_across_processes():
    # each process grades every world_size-th prompt; the summed moments give the whole split's error
    records = random_records(random.Random(3), 30, 4)
    strided = [[r for r in records if r["index"] % 3 == rank] for rank in range(3)]
    summed = [sum(parts) for parts in zip(*(prompt_moments(part) for part in strided))]
    assert clustered_standard_error(*summed) == pytest.approx(clustered_standard_error(*prompt_moments(records)))


def test_correlated_samples_are_not_counted_as_independent():
    # every prompt all right or all wrong: 8 samples carry one prompt's information, so the
    # error is the binomial one over 50 prompts, sqrt(8) times the one over 400 completions
    records = [{"index": i, "correct": i % 2 == 0} for i in range(50) for _ in range(8)]
    se = clustered_standard_error(*prompt_moments(records))
    assert se == pytest.approx(math.sqrt(0.25 / 49))
    assert se > 2.5 * math.sqrt(0.25 / 400)


def test_standard_error_covers_the_spread_of_repeated_evaluations():
    # simulation: the same 200 prompts evaluated again with fresh samples, and fresh prompts
    # from the same population; the error estimated from one evaluation matches the spread of
    # the accuracies over 400 repetitions within 15%
    rng = random.Random(0)
    population = [rng.betavariate(0.6, 0.6) for _ in range(20000)]
    accuracies, estimates = [], []
    for _ in range(400):
        rates = rng.sample(population, 200)
        records = [{"index": i, "correct": rng.random() < rate} for i, rate in enumerate(rates) for _ in range(2)]
        accuracies.append(statistics.fmean(r["correct"] for r in records))
        estimates.append(clustered_standard_error(*prompt_moments(records)))
    assert statistics.fmean(estimates) == pytest.approx(statistics.stdev(accuracies), rel=0.15)


def test_one_prompt_has_no_error_estimate():
    assert math.isnan(clustered_standard_error(*prompt_moments([{"index": 0, "correct": True}] * 4)))


def add_errors(run, errors, prompts=200, samples=2):
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "eval_prompts": prompts, "eval_samples": samples}))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record, error in zip(records, errors):
        record["eval_accuracy_se"] = error
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_compare_reports_each_arms_evaluation_noise(tmp_path):
    evals = [(0, 0.5), (10, 0.6), (20, 0.8)]
    runs = [add_errors(fake_run(tmp_path, "grpo", "grpo", 0, evals), [0.030, 0.024, 0.020]),
            add_errors(fake_run(tmp_path, "pods", "pods", 0, evals), [0.010, 0.011, 0.008], prompts=800)]
    result = analyze(runs)
    rows = {r["arm"]: r for r in result["rows"]}
    assert rows["grpo 4/4"]["eval_se_median"] == pytest.approx(0.024)
    assert rows["grpo 4/4"]["eval_se_max"] == pytest.approx(0.030)
    table = format_table(result)
    # 200 prompts at 3.0 points: (3.0 / 1.2)^2 = 6.25 times as many prompts meet the goal
    assert "grpo 4/4: median 2.40, largest 3.00 points (200 prompts x 2 samples); above the goal: about 1250 " \
           "prompts would meet it" in table
    assert "pods 16->4 max_variance: median 1.00, largest 1.10 points (800 prompts x 2 samples); within the goal" \
           in table


def test_compare_says_when_runs_did_not_log_the_noise(tmp_path):
    runs = [fake_run(tmp_path, "grpo", "grpo", 0, [(0, 0.5), (10, 0.6)])]
    assert "not logged by these runs" in format_table(analyze(runs))

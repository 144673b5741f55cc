"""Reward functions: loading by name or module:function, combination, error policies,
and a TRL-style reward function running unchanged in a training run."""

import math
import time
from pathlib import Path

import pytest

from podsrl.metrics import read_metrics
from podsrl.rewards import RewardError, RewardStack, load_reward_fn
from podsrl.trainer import train
from podsrl.trainer.config import make_config

# Written exactly as for TRL's GRPOTrainer: keyword arguments, dataset columns in **kwargs.
TRL_STYLE = '''
from pathlib import Path

CALLS = Path(__file__).with_suffix(".calls")  # it runs in a worker process: what it records is there

def digit_count_reward(prompts, completions, answer, **kwargs):
    """Rewards completions by how many digits they contain."""
    with CALLS.open("a") as calls:
        calls.write(f"{len(completions)}\\n")
    return [float(sum(ch.isdigit() for ch in completion)) for completion in completions]

def flaky(completions, **kwargs):
    return [1.0 if "7" not in c else None for c in completions]
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(TRL_STYLE)
    return str(path)


def test_load_by_name_module_and_file(reward_file):
    assert load_reward_fn("math_correct").__name__ == "math_correct"
    assert load_reward_fn("podsrl.rewards:arithmetic_format").__name__ == "arithmetic_format"
    assert load_reward_fn(f"{reward_file}:digit_count_reward").__name__ == "digit_count_reward"
    with pytest.raises(ValueError, match="neither a built-in reward"):
        load_reward_fn("no_such_reward")
    with pytest.raises(ValueError, match="cannot import module"):
        load_reward_fn("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_reward_fn("podsrl.rewards:nope")
    with pytest.raises(FileNotFoundError, match="reward_funcs: file not found"):
        load_reward_fn("missing_file.py:fn")


@pytest.mark.slow
def test_trl_style_reward_runs_unchanged_in_training(random_model_dir, tmp_path, reward_file):
    cfg = make_config(overrides={
        "model": random_model_dir, "max_steps": "2", "prompts_per_step": "2", "num_generations": "4", "num_kept": "2",
        "eval_prompts": "8", "eval_samples": "1", "progress": "false", "output_dir": str(tmp_path / "run"),
        "reward_funcs": f"{reward_file}:digit_count_reward,arithmetic_format", "reward_weights": "0.5,2"})
    train(cfg)
    calls = Path(reward_file).with_suffix(".calls").read_text().split()
    assert calls == ["8", "8"], "called once per step on all P*n completions"
    record = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert math.isfinite(record["reward_mean"]) and record["reward_failures"] == 0


def raising(prompts, completions, **kwargs):
    return [1 / 0 if c == "bad" else 1.0 for c in completions]


FINISHED = []


def hanging(prompts, completions, **kwargs):
    time.sleep(5)
    FINISHED.append(len(completions))
    return [1.0] * len(completions)


def test_raise_policy_names_function_and_prompt_index():
    stack = RewardStack([raising], [1.0])
    with pytest.raises(RewardError, match=r"raising failed on prompt index 2 \(ZeroDivisionError"):
        stack(["p"] * 3, ["ok", "ok", "bad"], {})


def test_zero_policy_scores_failures_zero_and_counts_them():
    stack = RewardStack([raising], [1.0], error_policy="zero")
    assert stack(["p"] * 3, ["ok", "bad", "ok"], {}).tolist() == [1.0, 0.0, 1.0]
    assert stack.failures == 1


def test_timeouts_follow_the_policy():
    with pytest.raises(RewardError, match="hanging timed out after 0.2s"):
        RewardStack([hanging], [1.0], timeout=0.2)(["p"], ["x"], {})
    zero = RewardStack([hanging], [1.0], timeout=0.2, error_policy="zero")
    assert zero(["p"] * 2, ["x", "y"], {}).tolist() == [0.0, 0.0] and zero.failures == 2
    assert FINISHED == []  # both calls returned without waiting for the function to end


def infinite(prompts, completions, **kw):
    return [float("-inf")] * len(completions)


@pytest.mark.parametrize("fn, message", [
    (lambda prompts, completions, **kw: [float("inf")] * len(completions), "returned inf"),
    (infinite, "reward function infinite returned -inf"),
    (lambda prompts, completions, **kw: [1.0], "returned 1 values for 1 completions|failed on the batch"),
])
def test_malformed_outputs_are_rejected(fn, message):
    with pytest.raises(RewardError, match=message):
        RewardStack([fn], [1.0])(["p", "q"], ["a", "b"], {})


def test_none_means_unverifiable():
    values = RewardStack([lambda prompts, completions, **kw: [None, 2.0]], [0.5])(["p", "q"], ["a", "b"], {})
    assert math.isnan(values[0]) and values[1] == 1.0


def test_none_and_nan_mean_not_applicable_and_the_sum_skips_them():
    """TRL's torch.nansum(rewards_per_func * weights, dim=1): a function that does not apply
    to a sample (None or NaN) adds nothing there; no function applying leaves NaN."""
    nan = float("nan")
    first = lambda prompts, completions, **kw: [nan, 1.0, None, nan]  # noqa: E731
    second = lambda prompts, completions, **kw: [2.0, nan, None, None]  # noqa: E731
    values = RewardStack([first, second], [0.5, 3.0])(["p"] * 4, ["a", "b", "c", "d"], {})
    assert values[:2].tolist() == [6.0, 0.5] and values[2:].isnan().all()
    import torch  # the same as TRL's reduction over the same matrix
    per_func = torch.tensor([[nan, 2.0], [1.0, nan], [nan, nan], [nan, nan]])
    assert torch.nansum(per_func * torch.tensor([0.5, 3.0]), dim=1)[:2].tolist() == values[:2].tolist()

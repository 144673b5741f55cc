"""Arithmetic task generator and its rewards."""

import pytest

from podsrl.rewards import RewardStack, arithmetic_correct, arithmetic_format, extract_answer
from podsrl.tasks.arithmetic import LEVELS, build_arithmetic, evaluate_expression


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_splits_are_disjoint_seeded_and_correct(level):
    task = build_arithmetic(level=level, num_train=3000, num_test=200, seed=7)
    assert len(task.test) == 200
    assert not {ex.prompt for ex in task.train} & {ex.prompt for ex in task.test}
    assert len({ex.prompt for ex in task.train}) == len(task.train)
    again = build_arithmetic(level=level, num_train=3000, num_test=200, seed=7)
    assert task.train == again.train and task.test == again.test
    other = build_arithmetic(level=level, num_train=3000, num_test=200, seed=8)
    assert other.test != task.test
    spec = LEVELS[level]
    for ex in task.test[:50]:
        expression = ex.prompt.split("What is ")[1].split("?")[0]
        numbers = [int(t) for t in expression.split()[::2]]
        assert all(0 <= x <= spec.max_operand for x in numbers)
        assert len(numbers) == spec.num_ops + 1
        assert ex.prompt.endswith("Answer in format: 'Answer: {result}'\n")
        assert int(ex.answer) == evaluate_expression(expression)


def test_small_level_uses_every_remaining_problem():
    task = build_arithmetic(level=1, num_train=10_000, num_test=20, seed=0)
    assert len(task.train) + len(task.test) == 21 * 21


def test_evaluation_is_left_to_right():
    assert evaluate_expression("10 - 3 + 5") == 12
    assert evaluate_expression("3 - 10") == -7


@pytest.mark.parametrize("completion, gold, correct, formatted", [
    ("Answer: 42", "42", 1, 1),
    ("  Answer: -7 \n", "-7", 1, 1),
    ("Answer: 41", "42", 0, 1),
    ("answer: 42", "42", 0, 0),
    ("42", "42", 0, 0),
    ("Answer: 4 2", "42", 0, 0),
    ("Answer: 40 then Answer: 42", "42", 1, 0),  # the last answer counts
    ("", "42", 0, 0),
    ("Answer: ٤٢", "42", 0, 0),  # non-ASCII digits are not the requested format
])
def test_rewards_on_literal_strings(completion, gold, correct, formatted):
    assert arithmetic_correct([""], [completion], answer=[gold]) == [correct]
    assert arithmetic_format([""], [completion]) == [formatted]


def test_reward_stack_weights_and_checks():
    stack = RewardStack([arithmetic_correct, arithmetic_format], [0.8, 0.2])
    assert stack(["", ""], ["Answer: 1", "Answer: 2"], {"answer": ["1", "1"]}).tolist() == pytest.approx([1.0, 0.2])
    unverifiable = RewardStack([lambda prompts, completions, **kw: [None, 1.0]], [1.0])
    assert unverifiable(["", ""], ["a", "b"], {}).isnan().tolist() == [True, False]


def test_extract_answer():
    assert extract_answer("blah Answer: 3 Answer:-12") == "-12"
    assert extract_answer("no answer") is None

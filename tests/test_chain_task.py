"""The reasoning regime's task ``chain`` (#58): multi-step arithmetic worked one step per line."""

import json
import random
import statistics

import pytest

from podsrl.rewards import REWARDS, arithmetic_correct, chain_format
from podsrl.tasks import TaskOptions, build_task
from podsrl.tasks.arithmetic import evaluate_expression
from podsrl.tasks.chain import CHAIN_LEVELS, build_chain, chain_prompt, draw_steps, random_chain, worked_solution


@pytest.mark.parametrize("level", sorted(CHAIN_LEVELS))
def test_splits_are_disjoint_seeded_and_within_the_level(level):
    task = build_chain(level=level, num_train=2000, num_test=200, seed=3)
    assert len(task.train) == 2000 and len(task.test) == 200
    assert not {ex.prompt for ex in task.train} & {ex.prompt for ex in task.test}
    assert len({ex.prompt for ex in task.train}) == len(task.train)
    again = build_chain(level=level, num_train=2000, num_test=200, seed=3)
    assert task.train == again.train and task.test == again.test
    assert build_chain(level=level, num_train=2000, num_test=200, seed=4).test != task.test
    spec = CHAIN_LEVELS[level]
    for ex in task.train + task.test:
        expression = ex.columns["chain"]
        assert ex.prompt == chain_prompt(expression)
        numbers = [int(t) for t in expression.split()[::2]]
        assert 0 <= numbers[0] <= spec.max_start and all(1 <= x <= spec.max_operand for x in numbers[1:])
        assert 1 <= ex.columns["steps"] == len(numbers) - 1 <= spec.max_steps
        assert int(ex.answer) == evaluate_expression(expression)


def test_the_worked_solution_is_graded_right_and_recomputes_every_line():
    rng = random.Random(0)
    for _ in range(300):
        expression = random_chain(rng, CHAIN_LEVELS[3])
        solution = worked_solution(expression)
        lines = solution.split("\n")
        assert len(lines) == len(expression.split()) // 2 + 1
        terms = expression.split()
        value = int(terms[0])
        for k, line in enumerate(lines[:-1], start=1):  # each line: its number, the running value, the k-th
            number, left, right = line.replace(": ", " = ").split(" = ")  # operation, its result (eval-free)
            assert (int(number), left) == (k, f"{value} {terms[2 * k - 1]} {terms[2 * k]}")
            assert evaluate_expression(left) == int(right)
            value = int(right)
        gold = str(evaluate_expression(expression))
        assert lines[-1] == f"Answer: {gold}"
        assert arithmetic_correct([""], [solution], answer=[gold]) == [1.0]
        assert chain_format([""], [solution]) == [1.0]


@pytest.mark.parametrize("completion, formatted", [
    ("1: 3 + 4 = 7\nAnswer: 7", 1),
    ("  1: 3 + 4 = 7\n2: 7 - 10 = -3\nAnswer: -3\n", 1),
    ("1: 3 + 4 = 8\nAnswer: 8", 1),  # the format, not the arithmetic
    ("3 + 4 = 7\nAnswer: 7", 0),  # a line without its number
    ("Answer: 7", 0),  # no worked line
    ("1: 3 + 4 = 7\n", 0),  # no answer
    ("1: 3 + 4 = 7 Answer: 7", 0),
    ("1: 3 * 4 = 12\nAnswer: 12", 0),
    ("1: 3 + 4 = 7\nAnswer: 7\n1: 3 + 4 = 7", 0),
])
def test_chain_format_on_literal_strings(completion, formatted):
    assert chain_format([""], [completion]) == [float(formatted)]


def test_steps_are_log_uniform_with_a_long_tail():
    """Level 3's design targets (docs/tasks.md): median 4 steps, p99 at the maximum of 16, and the
    log-uniform shares: P(steps <= 2) = log2(2.5) / 4 = 0.330, P(steps >= 8) = 1 - log2(7.5) / 4 = 0.273."""
    rng = random.Random(1)
    steps = sorted(draw_steps(rng, 16) for _ in range(20000))
    assert statistics.median(steps) == 4
    assert steps[int(0.99 * len(steps))] == 16
    assert sum(s <= 2 for s in steps) / len(steps) == pytest.approx(0.330, abs=0.015)
    assert sum(s >= 8 for s in steps) / len(steps) == pytest.approx(0.273, abs=0.015)


def test_the_task_and_its_format_reward_are_registered():
    task = build_task(TaskOptions(task="chain", task_level=2, eval_prompts=50))
    assert task.name == "chain" and len(task.test) == 50 and task.format_fn is chain_format
    assert REWARDS.resolve("chain_format") is chain_format
    with pytest.raises(ValueError, match="task_level: unknown chain level 9"):
        build_chain(level=9)


def test_the_warm_starts_slipped_lines_carry_on_from_the_slip():
    """The spread warm start (podsrl.build.tiny_chain): a slipped line's result is off by +-1 / +-10 and
    the next line starts from it, so the answer is the slipped chain's, never a silently right one."""
    from podsrl.build.tiny_chain import chain_target
    from podsrl.tasks.base import Example

    example = Example(prompt=chain_prompt("10 + 5 - 3 + 9"), answer="21", columns={"chain": "10 + 5 - 3 + 9"})
    rng = random.Random(0)
    assert chain_target(0.0)(example, rng) == worked_solution("10 + 5 - 3 + 9")
    for _ in range(50):
        lines = chain_target(1.0)(example, rng).split("\n")
        previous = 10
        for line in lines[:-1]:
            left, right = line.split(": ")[1].split(" = ")
            assert int(left.split()[0]) == previous
            assert evaluate_expression(left) - int(right) in (-10, -1, 1, 10)
            previous = int(right)
        assert lines[-1] == f"Answer: {previous}"


def test_the_shipped_tiny_chain_model_works_chains_in_format():
    """The built-in model (podsrl/assets/tiny-chain, scripts/build_tiny_chain.py) loads by name and, greedy,
    writes numbered worked lines ending in an answer for held-out chains."""
    import json

    import torch

    from podsrl.models import TINY_CHAIN_DIR, load_model

    info = json.loads((TINY_CHAIN_DIR / "build_info.json").read_text())
    assert info["task"] == "chain" and info["params"] < 5_000_000
    bundle = load_model("tiny-chain")
    task = build_chain(level=3, num_test=300)
    short = [ex for ex in task.test if ex.columns["steps"] <= 3][:8]
    tokenizer = bundle.tokenizer
    batch = tokenizer([ex.prompt for ex in short], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = bundle.model.generate(**batch, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    assert sum(chain_format([""] * len(texts), texts)) >= 6, texts


def test_a_build_refuses_an_output_folder_it_did_not_write(tmp_path):
    """The builds (scripts/build_tiny*.py) write an empty or new folder, or over an earlier build's files; a
    folder with anything else (a user's model, a stray file beside a build) is refused before any training."""
    from podsrl.build.tiny import BUILD_FILES, check_build_output

    check_build_output(tmp_path / "new")
    check_build_output(tmp_path)  # empty
    for name in BUILD_FILES:
        (tmp_path / name).write_text("{}")
    (tmp_path / "build_info.json").write_text(json.dumps({"params": 1, "build_seconds": 2.0}))
    check_build_output(tmp_path)  # an earlier build
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match=r"--output .*notes\.txt"):
        check_build_output(tmp_path)
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "build_info.json").write_text('{"my": "model"}')  # a model folder the build did not write
    with pytest.raises(SystemExit, match="no build_info.json of a build"):
        check_build_output(tmp_path)
    assert (tmp_path / "build_info.json").read_text() == '{"my": "model"}'
    (tmp_path / "build_info.json").write_text(json.dumps({"params": 1, "build_seconds": 2.0}))
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors").symlink_to(tmp_path / "tokenizer.json")  # would write through to another file
    with pytest.raises(SystemExit, match=r"holds links \(model\.safetensors\)"):
        check_build_output(tmp_path)


def test_a_build_refuses_a_link_as_its_output_before_any_training(tmp_path):
    """A dangling link passed exists() and the build failed at save, its model lost; a link to a folder
    would write the build through it: both refused, like a path under a dangling link."""
    from podsrl.build.tiny import check_build_output

    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("mine")
    cases = {"dangling": "is a dangling link", "dangling/model": "lies under .*dangling, a dangling link",
             "linked": "is a link", "file/model": "cannot be created"}
    for name, message in cases.items():
        with pytest.raises(SystemExit, match=f"--output .*{name}: {message}"):
            check_build_output(tmp_path / name)
    assert not (tmp_path / "nowhere").exists() and list((tmp_path / "real").iterdir()) == []

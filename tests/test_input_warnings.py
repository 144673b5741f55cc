"""Data that trains, but not as meant, is warned about once at set-up and the run goes on
(docs/reliability.md, "Bad input"): the held-out file is the train file, the train data
repeats prompts, the held-out split is smaller than eval_prompts."""

import json
import re

from podsrl.cli import main
from podsrl.tasks.base import Example
from podsrl.trainer.config import make_config
from podsrl.trainer.setup import data_warnings


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


ROWS = [{"prompt": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(5)]


def test_the_same_file_repeated_prompts_and_a_small_held_out_split_are_warned_once_and_the_run_goes_on(
        random_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("podsrl.cli.plot_accuracy", lambda *args, **kwargs: tmp_path / "accuracy.png")
    data = write_jsonl(tmp_path / "data.jsonl", ROWS + ROWS[:3])  # 3 prompts twice
    rewards = tmp_path / "spread.py"  # rewards that differ in every group: a run that learned nothing exits 1
    rewards.write_text("def spread(prompts, completions, **kw):\n    return [i % 2 for i in range(len(completions))]\n")
    out = tmp_path / "run"
    code = main(["train", "--model", random_model_dir, "--reward_funcs", f"{rewards}:spread", "--task", "jsonl",
                 "--train_data", data, "--test_data", data, "--eval_prompts", "50", "--eval_samples", "1",
                 "--max_steps", "1", "--prompts_per_step", "2", "--num_generations", "4", "--num_kept", "2",
                 "--max_completion_length", "6", "--progress", "false", "--save_steps", "0", "--output_dir", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    lines = [line for line in captured.err.splitlines() if line.startswith("warning: ")]
    # the random model rarely ends a completion: its first evaluation says the budget cuts them, once (the share
    # is a sampled number, so its text is matched by pattern: a CPU kind's rounding may change one draw)
    cut = [line for line in lines if line.startswith("warning: max_completion_length: ")]
    assert len(cut) == 1 and re.fullmatch(r"warning: max_completion_length: \d+% of 8 held-out completions were cut "
                                          r"at 6 tokens before they ended: .*", cut[0]), cut
    warnings = [line for line in lines if line not in cut]
    assert warnings == [
        f"warning: train_data, test_data: {data} and {data} are the same file: held-out accuracy is measured on the "
        f"prompts trained on",
        f"warning: train_data {data}: 3 of 8 train prompts repeat an earlier one (same prompt text, e.g. "
        f"'What is 0 + 0?'); they are trained on more often",
        "warning: eval_prompts: evaluating on 8 prompts, fewer than eval_prompts=50 asked (the held-out split has "
        "no more)"]
    assert "x 8 prompts)" in captured.out and "x 50 prompts" not in captured.out  # the summary says what was evaluated


def examples_of(rows):
    return [Example(prompt=row["prompt"], answer=row["answer"]) for row in rows]


OTHER_ROWS = [{"prompt": f"What is {a} - 1?", "answer": str(a - 1)} for a in range(2)]


def test_a_copy_of_the_train_file_is_warned_about_and_distinct_files_are_not(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    copy = write_jsonl(tmp_path / "copy.jsonl", ROWS)
    other = write_jsonl(tmp_path / "test.jsonl", OTHER_ROWS)

    def warnings(test_data, test_rows, eval_prompts=2):
        cfg = make_config(overrides={"task": "jsonl", "train_data": train, "test_data": test_data,
                                     "eval_prompts": str(eval_prompts)})
        return data_warnings(cfg, examples_of(ROWS), examples_of(test_rows))

    assert warnings(copy, ROWS) == [f"train_data, test_data: {train} and {copy} are files with the same content: "
                                    f"held-out accuracy is measured on the prompts trained on"]
    assert warnings(other, OTHER_ROWS) == []
    assert warnings(other, OTHER_ROWS, eval_prompts=3) == [
        "eval_prompts: evaluating on 2 prompts, fewer than eval_prompts=3 asked (the held-out split has no more)"]


def test_held_out_prompts_that_are_also_train_prompts_are_counted_in_one_warning_whatever_the_order(tmp_path):
    """A test file that is a subset or a reordering of the train file is no copy of it, but its
    accuracy is measured on prompts trained on all the same (conversations compare as such)."""
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    for test_rows, shared in ((ROWS[3:1:-1], 2), (ROWS[::-1], 5), (OTHER_ROWS + ROWS[4:], 1)):
        test = write_jsonl(tmp_path / "test.jsonl", test_rows)
        cfg = make_config(overrides={"task": "jsonl", "train_data": train, "test_data": test, "eval_prompts": "1"})
        example = test_rows[-1 if shared == 1 else 0]["prompt"]
        assert data_warnings(cfg, examples_of(ROWS), examples_of(test_rows)) == [
            f"test_data {test}: {shared} of {len(test_rows)} held-out prompts are also train prompts (e.g. "
            f"{example!r}): held-out accuracy is partly measured on prompts trained on"]
    chat = [Example(prompt=[{"role": "user", "content": row["prompt"]}], answer=row["answer"]) for row in ROWS]
    cfg = make_config(overrides={"task": "jsonl", "train_data": train, "test_data": test, "eval_prompts": "1"})
    assert "1 of 1 held-out prompts are also train prompts" in data_warnings(cfg, chat, chat[2:3])[0]

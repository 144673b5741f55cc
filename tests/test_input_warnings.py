"""Data that trains, but not as meant, is warned about once at set-up and the run goes on
(docs/reliability.md, "Bad input"): the held-out file is the train file, the train data
repeats prompts, the held-out split is smaller than eval_prompts."""

import json

from podsrl.cli import main
from podsrl.config import make_config
from podsrl.tasks.base import Example
from podsrl.trainer.setup import data_warnings


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


ROWS = [{"prompt": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(5)]


def test_the_same_file_repeated_prompts_and_a_small_held_out_split_are_warned_once_and_the_run_goes_on(
        random_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("podsrl.cli.plot_accuracy", lambda *args, **kwargs: tmp_path / "accuracy.png")
    data = write_jsonl(tmp_path / "data.jsonl", ROWS + ROWS[:3])  # 3 prompts twice
    out = tmp_path / "run"
    code = main(["train", "--model", random_model_dir, "--task", "jsonl", "--train_data", data, "--test_data", data,
                 "--eval_prompts", "50", "--eval_samples", "1", "--max_steps", "1", "--prompts_per_step", "2",
                 "--num_generations", "4", "--num_kept", "2", "--max_completion_length", "6", "--progress", "false",
                 "--save_steps", "0", "--output_dir", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: train_data, test_data: {data} and {data} are the same file: held-out accuracy is measured on the "
        f"prompts trained on",
        f"warning: train_data {data}: 3 of 8 train prompts repeat an earlier one (same prompt text, e.g. "
        f"'What is 0 + 0?'); they are trained on more often",
        "warning: eval_prompts: evaluating on 8 prompts, fewer than eval_prompts=50 asked (the held-out split has "
        "no more)"]
    assert "x 8 prompts)" in captured.out and "x 50 prompts" not in captured.out  # the summary says what was evaluated


def test_a_copy_of_the_train_file_is_warned_about_and_distinct_files_are_not(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    copy = write_jsonl(tmp_path / "copy.jsonl", ROWS)
    other = write_jsonl(tmp_path / "test.jsonl", ROWS[:2])
    examples = [Example(prompt=row["prompt"], answer=row["answer"]) for row in ROWS]

    def warnings(test_data, eval_prompts=2):
        cfg = make_config(overrides={"task": "jsonl", "train_data": train, "test_data": test_data,
                                     "eval_prompts": str(eval_prompts)})
        return data_warnings(cfg, examples, held_out=2)

    assert warnings(copy) == [f"train_data, test_data: {train} and {copy} are files with the same content: held-out "
                              f"accuracy is measured on the prompts trained on"]
    assert warnings(other) == []
    assert warnings(other, eval_prompts=3) == ["eval_prompts: evaluating on 2 prompts, fewer than eval_prompts=3 "
                                               "asked (the held-out split has no more)"]

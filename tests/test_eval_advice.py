"""``podsrl eval --model`` pointed at a run's folders that are not a model: one line saying
exactly what to run instead (docs/reliability.md, "Bad input")."""

import json
import shutil

import pytest

from podsrl.cli import main
from podsrl.trainer import train
from podsrl.trainer.config import make_config


@pytest.fixture(scope="module")
def lora_run(random_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "run"
    values = dict(model=random_model_dir, task="parity", max_steps=1, prompts_per_step=2, num_generations=4,
                  num_kept=2, max_completion_length=4, eval_prompts=4, eval_samples=1, progress=False, lora_rank=4,
                  save_steps=1, output_dir=str(out))
    train(make_config(overrides={k: str(v) for k, v in values.items()}))
    return out


def evaluate(model, tmp_path, capsys):
    code = main(["eval", "--model", str(model), "--task", "parity", "--eval_prompts", "4", "--eval_samples", "1",
                 "--output_dir", str(tmp_path / "eval")])
    err = capsys.readouterr().err.strip()
    return code, err


def with_base(adapter, base):
    config = adapter / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": base}))


def test_a_run_folder_a_checkpoint_and_an_unfinished_run_say_what_to_run_instead(lora_run, tmp_path, capsys):
    code, err = evaluate(lora_run, tmp_path, capsys)
    assert code == 2 and err == (f"podsrl eval: error: model: {lora_run} is a podsrl run folder, not a model: "
                                 f"evaluate its final model with podsrl eval --model {lora_run / 'model'}")
    checkpoint = lora_run / "checkpoints" / "step_0000001"
    code, err = evaluate(checkpoint, tmp_path, capsys)
    assert code == 2 and err == (f"podsrl eval: error: model: {checkpoint} is a podsrl checkpoint (trainable weights "
                                 f"and optimizer state), not a model folder; export it first: podsrl export "
                                 f"{lora_run} EXPORT_DIR --checkpoint step_0000001, then podsrl eval --model "
                                 f"EXPORT_DIR")
    unfinished = tmp_path / "unfinished"
    shutil.copytree(lora_run, unfinished, ignore=shutil.ignore_patterns("model"))
    code, err = evaluate(unfinished, tmp_path, capsys)
    assert code == 2 and err.endswith(f"without a final model (not finished); export it first: podsrl export "
                                      f"{unfinished} EXPORT_DIR --checkpoint step_0000001, then podsrl eval --model "
                                      f"EXPORT_DIR")
    code, err = evaluate(lora_run / "model", tmp_path, capsys)  # what the advice says works
    assert code == 0, err


def test_a_lora_adapter_on_another_base_than_it_was_trained_on_is_one_line_naming_it(lora_run, random_model_dir,
                                                                                   tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    with_base(run / "model", "tiny")  # the shipped tiny model: another model than the run trained
    code, err = evaluate(run / "model", tmp_path, capsys)
    assert code == 2 and err == (f"podsrl eval: error: model: {run / 'model' / 'adapter_config.json'}: "
                                 f"base_model_name_or_path 'tiny' is not the model the run trained this adapter on "
                                 f"({random_model_dir!r}, in {run / 'config.json'}); set it to {random_model_dir!r} "
                                 f"and run podsrl eval --model {run / 'model'} again")
    alone = tmp_path / "adapter"  # outside its run: the shapes tell (before: 'the file is damaged or truncated')
    shutil.copytree(run / "model", alone)
    code, err = evaluate(alone, tmp_path, capsys)
    assert code == 2 and "\n" not in err
    assert err.startswith(f"podsrl eval: error: model: {alone / 'adapter_config.json'}: the adapter was trained on "
                          f"another model than its base_model_name_or_path 'tiny' (base_model.model.")
    assert err.endswith("torch.Size([4, 128]) in the base); set it to the model the adapter was trained on")


def test_a_runs_model_is_evaluated_on_the_runs_task_and_budget_unless_told_otherwise(lora_run, tmp_path, capsys):
    """Without --task, RUN/model is judged on what the run trained (parity, 4 tokens here), not the
    defaults (arithmetic); one line says so. Another --task brings its own budget."""
    assert main(["eval", "--model", str(lora_run / "model"), "--eval_prompts", "4", "--eval_samples", "1",
                 "--output_dir", str(tmp_path / "e")]) == 0
    captured = capsys.readouterr()
    summary = json.loads((tmp_path / "e" / "eval" / "parity-summary.json").read_text())
    assert summary["task"] == "parity" and summary["max_completion_length"] == 4
    assert f"podsrl eval: {lora_run / 'model'} is run {lora_run}'s model; from its config.json " \
           f"({lora_run / 'config.json'}): task \"parity\", " in captured.err
    assert "max_completion_length 4" in captured.err and "from the command line" not in captured.err
    assert "cut at max_completion_length 4" in captured.out
    assert main(["eval", "--model", str(lora_run / "model"), "--eval_prompts", "4", "--eval_samples", "1",
                 "--task", "arithmetic", "--output_dir", str(tmp_path / "e")]) == 0
    summary = json.loads((tmp_path / "e" / "eval" / "arithmetic-summary.json").read_text())
    assert summary["max_completion_length"] == 8  # the arithmetic task's own budget, not the run's
    assert "is run" not in capsys.readouterr().err
    # #80: a budget given on the command line was said to come from the run's config.json
    assert main(["eval", "--model", str(lora_run / "model"), "--eval_prompts", "4", "--eval_samples", "1",
                 "--max_completion_length", "3", "--output_dir", str(tmp_path / "e")]) == 0
    err = capsys.readouterr().err
    assert "; from the command line: max_completion_length 3" in err
    assert err.split("; from the command line")[0].count("max_completion_length") == 0


def test_eval_offers_only_what_evaluation_reads(tmp_path, capsys):
    """#80: podsrl eval listed and accepted every training option (--learning_rate 5, --max_steps 99),
    to no effect."""
    from podsrl.cli import _offered

    offered = {row["name"] for row in _offered("podsrl eval")}
    assert {"model", "task", "eval_prompts", "eval_samples", "eval_temperature", "max_completion_length"} <= offered
    assert not offered & {"learning_rate", "max_steps", "num_generations", "eval_steps", "eval_greedy", "resume"}
    for option in (["--learning_rate", "5"], ["--max_steps=99"]):
        assert main(["eval", *option, "--output_dir", str(tmp_path / "e")]) == 2
        name = option[0][2:].split("=")[0]
        assert capsys.readouterr().err.strip() == (f"podsrl eval: error: {name}: podsrl eval does not read it (a "
                                                   f"setting of training); its options: podsrl eval --help")
    assert main(["eval", "--learning_rat", "5"]) == 2  # not a field at all: the config's own refusal
    assert "unknown config field" in capsys.readouterr().err


def test_the_model_of_a_run_in_progress_is_named_as_such(lora_run, tmp_path, capsys):
    from podsrl.run_folder.claim import RunLock

    live = tmp_path / "live"
    shutil.copytree(lora_run, live, ignore=shutil.ignore_patterns("model"))
    lock = RunLock(live).acquire()  # as the running trainer holds it
    try:
        code, err = evaluate(live / "model", tmp_path, capsys)
    finally:
        lock.release()
    assert code == 2 and err.startswith(f"podsrl eval: error: model: {live / 'model'} does not exist yet: {live} is "
                                        f"a run still in progress (pid ")
    assert err.endswith(f"whose final model is written when it ends; export it first: podsrl export {live} "
                        f"EXPORT_DIR --checkpoint step_0000001, then podsrl eval --model EXPORT_DIR")
    code, err = evaluate(live / "model", tmp_path, capsys)  # the lock released: a run that has not finished
    assert code == 2 and f"{live} is a run that has not finished, whose final model" in err


def test_completions_mostly_cut_by_the_budget_are_said_in_one_line(lora_run, tmp_path, capsys):
    """One token cannot hold an answer: the eval says that its accuracy grades cut-off text."""
    assert main(["eval", "--model", str(lora_run / "model"), "--eval_prompts", "4", "--eval_samples", "2",
                 "--max_completion_length", "1", "--output_dir", str(tmp_path / "e")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    records = [json.loads(line) for line in (tmp_path / "e" / "eval" / "parity-samples.jsonl").read_text().split("\n")
               if line]
    cut = sum(r["cut"] for r in records)  # a one-token completion is cut unless that token ends it
    assert cut > 4 and all(r["cut"] == (r["completion"] != "") for r in records)
    assert warnings == [f"warning: max_completion_length: {100 * cut / 8:.0f}% of 8 held-out completions were cut at "
                        f"1 tokens before they ended: the budget cuts the answers, so accuracy grades cut-off text; "
                        f"raise max_completion_length (0 = the task's budget)"]

"""``podsrl eval --model`` pointed at a run's folders that are not a model: one line saying
exactly what to run instead (docs/reliability.md, "Bad input")."""

import json
import shutil

import pytest

from podsrl.cli import main
from podsrl.config import make_config
from podsrl.trainer import train


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

"""Hand-off commands: ``podsrl export`` (a run as a standalone Hugging Face folder, LoRA
merged, with a model card) and ``podsrl env`` (versions for bug reports), called in-process."""

import hashlib
import json
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from podsrl.cli import main
from podsrl.metrics import read_metrics
from podsrl.provenance import REPORTED_PACKAGES, installed, read_environment
from podsrl.run_folder.export import EXPORT_MARKER
from podsrl.run_folder.model_card import base_model_id
from podsrl.trainer import train
from podsrl.trainer.config import make_config

PROMPTS = ["What is 12 + 30? Answer in format: 'Answer: {result}'\n", "What is 7 - 9?"]


def _train(model_dir, output_dir, **overrides):
    values = dict(model=model_dir, max_steps=1, prompts_per_step=2, num_generations=4, num_kept=2,
                  max_completion_length=6, eval_prompts=8, eval_samples=2, eval_steps=0, save_steps=0,
                  progress=False, output_dir=str(output_dir), learning_rate=1e-2, warmup_steps=0, task="parity")
    values.update(overrides)
    return train(make_config(overrides={k: str(v) for k, v in values.items()})).run_dir


@pytest.fixture(scope="module")
def full_run(random_model_dir, tmp_path_factory):
    return _train(random_model_dir, tmp_path_factory.mktemp("export") / "full")


@pytest.fixture(scope="module")
def lora_run(random_model_dir, tmp_path_factory):
    # two steps with a checkpoint at each: step 1 differs from the final model, step 2 is it
    return _train(random_model_dir, tmp_path_factory.mktemp("export") / "lora", lora_rank=4, max_steps=2,
                  save_steps=1)


def logits(model, tokenizer):
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        return model(**batch).logits


def export(*args):
    assert main(["export", *map(str, args)]) == 0


def test_full_run_exports_the_runs_model(full_run, tmp_path):
    export(full_run, tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    saved = AutoModelForCausalLM.from_pretrained(full_run / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert torch.equal(logits(exported, tokenizer), logits(saved, tokenizer))
    run_tokenizer = AutoTokenizer.from_pretrained(full_run / "model")
    assert tokenizer(PROMPTS)["input_ids"] == run_tokenizer(PROMPTS)["input_ids"]
    assert tokenizer.chat_template == run_tokenizer.chat_template
    assert tokenizer.pad_token == run_tokenizer.pad_token is not None


@pytest.mark.slow
def test_lora_run_exports_merged_weights_that_need_no_peft(lora_run, random_model_dir, tmp_path):
    from peft import PeftModel

    export(lora_run, tmp_path / "hf")
    assert not list((tmp_path / "hf").glob("adapter_*")), "an adapter file would need peft to load"
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    base = AutoModelForCausalLM.from_pretrained(random_model_dir)
    assert not hasattr(merged, "peft_config") and type(merged) is type(base)
    assert merged.state_dict().keys() == base.state_dict().keys()  # no lora_A / lora_B left
    changed = [k for k, v in merged.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed), changed  # the adapter was merged in
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(random_model_dir),
                                             lora_run / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(logits(merged, tokenizer), logits(with_adapter, tokenizer), atol=1e-5, rtol=0)


def test_a_checkpoint_exports_the_model_of_its_step(lora_run, tmp_path):
    export(lora_run, tmp_path / "final")
    export(lora_run, tmp_path / "step2", "--checkpoint", "step_0000002")  # the final step: the final model
    export(lora_run, tmp_path / "step1", "--checkpoint", lora_run / "checkpoints" / "step_0000001")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "final")
    final, step2, step1 = (logits(AutoModelForCausalLM.from_pretrained(tmp_path / name), tokenizer)
                           for name in ("final", "step2", "step1"))
    torch.testing.assert_close(step2, final, atol=1e-6, rtol=0)
    assert not torch.allclose(step1, final, atol=1e-4)
    card = (tmp_path / "step1" / "README.md").read_text()
    assert "checkpoint step_0000001 (step 1)" in card and "| training steps | 1 of 2 |" in card


def test_a_checkpoint_of_another_run_is_refused_naming_its_run(lora_run, full_run, tmp_path, capsys):
    """Exported through another run, its model card named that run as the source (and that run's config
    read the weights): refused, with the command that exports it from its own run."""
    checkpoint = lora_run / "checkpoints" / "step_0000001"
    assert main(["export", str(full_run), str(tmp_path / "hf"), "--checkpoint", str(checkpoint)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"podsrl export: error: --checkpoint {checkpoint}: a checkpoint of run {lora_run.resolve()}, not of "
        f"{full_run}; export it from its own run: podsrl export {lora_run.resolve()} OUTPUT_DIR --checkpoint "
        f"step_0000001")
    assert not (tmp_path / "hf").exists()


def test_a_moved_lora_run_whose_base_folder_is_gone_names_the_field_to_fix(lora_run, random_model_dir, tmp_path,
                                                                         capsys):
    adapter_config = lora_run / "model" / "adapter_config.json"
    config = json.loads(adapter_config.read_text())
    assert config["base_model_name_or_path"] == str(Path(random_model_dir).resolve())  # a local base: its path
    moved = shutil.copytree(lora_run, tmp_path / "moved")
    adapter_config = moved / "model" / "adapter_config.json"
    adapter_config.write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "gone")}))
    assert main(["export", str(moved), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert f"{adapter_config}: base_model_name_or_path {str(tmp_path / 'gone')!r} is not a folder here" in err
    run_config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**run_config, "model": str(tmp_path / "gone")}))
    assert main(["export", str(moved), str(tmp_path / "hf"), "--checkpoint", "step_0000001"]) == 2
    assert f"{moved / 'config.json'}: model {str(tmp_path / 'gone')!r}" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_an_adapter_on_a_builtin_model_names_it_and_loads_on_another_machine(tmp_path):
    run = _train("tiny", tmp_path / "run", lora_rank=4, task="arithmetic")
    adapter_config = run / "model" / "adapter_config.json"
    config = json.loads(adapter_config.read_text())
    assert config["base_model_name_or_path"] == "tiny"  # not this machine's path to it
    export(run, tmp_path / "before")
    # adapters saved by podsrl before the name was recorded hold the built-in's folder,
    # which another machine does not have
    elsewhere = "/elsewhere/lib/python3.11/site-packages/podsrl/assets/tiny"
    adapter_config.write_text(json.dumps({**config, "base_model_name_or_path": elsewhere}))
    export(run, tmp_path / "after")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "before")
    before, after = (logits(AutoModelForCausalLM.from_pretrained(tmp_path / name), tokenizer)
                     for name in ("before", "after"))
    assert torch.equal(before, after)


def test_model_card_states_accuracies_method_and_provenance(lora_run, tmp_path):
    export(lora_run, tmp_path / "hf")
    card = (tmp_path / "hf" / "README.md").read_text()
    front = card.split("---\n")[1]
    assert "library_name: transformers\n" in front and "base_model" not in front  # a local base: no hub id
    assert all(f"- {tag}\n" in front for tag in ("podsrl", "pods", "grpo", "reinforcement-learning"))
    evals = [r for r in read_metrics(lora_run / "metrics.jsonl") if r.get("eval_accuracy") is not None]
    first, last = evals[0], evals[-1]
    assert (first["step"], last["step"]) == (0, 2)
    assert f"| {100 * first['eval_accuracy']:.1f}% | {100 * last['eval_accuracy']:.1f}% |" in card
    assert f"| greedy | {100 * first['eval_greedy_accuracy']:.1f}% | {100 * last['eval_greedy_accuracy']:.1f}% |" \
        in card
    assert "| method | pods 4->2 max_variance:" in card and "| task | `parity` |" in card
    assert "LoRA adapter (rank 4" in card and "| `lora_rank` | `4` |" in card
    environment = read_environment(lora_run)[-1]
    assert f"{environment['podsrl']}, commit {environment['commit']}" in card
    assert f'from_pretrained("{tmp_path / "hf"}")' in card
    snippet = card.split("```python\n")[1].split("```")[0]
    exec(snippet, {})  # the card's usage example runs as written (plain transformers)


def test_base_model_metadata_names_hub_models_only(tmp_path, monkeypatch):
    assert base_model_id("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_id("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # the built-in copy
    assert base_model_id("tiny") is None
    (tmp_path / "runs" / "base").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert base_model_id("runs/base") is None  # a local folder that looks like a hub id


def test_refusals_name_the_path(full_run, tmp_path, capsys):
    def refused(*args):
        assert main(["export", *map(str, args)]) == 2
        return capsys.readouterr().err

    assert f"{tmp_path / 'nope'}: not a podsrl run directory" in refused(tmp_path / "nope", tmp_path / "out")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(full_run / "config.json", unfinished)
    err = refused(unfinished, tmp_path / "out")
    assert f"{unfinished / 'model'}: no finished model" in err and "--checkpoint" in err
    err = refused(full_run, tmp_path / "out", "--checkpoint", "step_9")
    assert "step_9: not a podsrl checkpoint" in err and "step_0000001" in err  # lists the real ones
    corrupt = shutil.copytree(full_run / "checkpoints" / "step_0000001", tmp_path / "corrupt")
    (corrupt / "trainable.pt").write_bytes(b"truncated")
    assert f"{corrupt / 'trainable.pt'}: unreadable" in refused(full_run, tmp_path / "out", "--checkpoint", corrupt)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    for flags in ((), ("--overwrite",)):
        assert f"{occupied}: exists, is not empty and is not a podsrl export" in refused(full_run, occupied, *flags)
    assert (occupied / "notes.txt").read_text() == "mine"
    assert "choose another folder" in refused(full_run, full_run / "model", "--overwrite")
    assert "choose another folder" in refused(full_run, full_run.parent, "--overwrite")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, content, message", [
    ("config.json", b'{\n  "model": "ti', "config.json: not valid JSON (Unterminated string starting at: line 2"),
    ("config.json", b"[1, 2]\n", "config.json: expected a JSON object, got list"),
    ("data.json", b'{"task": "caf\xe9"}', "data.json line 1: not valid UTF-8 (byte b'\\xe9')"),
    ("environment.json", b"{oops", "environment.json: not valid JSON (Expecting property name"),
    ("summary.json", b"\xff\xfe{}", "summary.json line 1: not valid UTF-8"),
    ("summary.json", b'{"steps": 1}', "summary.json: has no 'steps' and 'train_seconds' numbers"),
    ("metrics.jsonl", b'{"step": 1}\n{"step": "caf\xe9"}\n', "metrics.jsonl, line 2: not valid UTF-8"),
    ("checkpoints/step_0000001/trainer_state.json", b'{"step": ', "trainer_state.json: not valid JSON (Expecting"),
])
def test_a_damaged_json_file_of_the_run_is_one_line_naming_it(full_run, tmp_path, monkeypatch, capsys, name, content,
                                                               message):
    """#57: a run's damaged config.json (and the like) came out as Python's message, naming no file."""
    import podsrl.run_folder.export as export_module

    run = shutil.copytree(full_run, tmp_path / "run")
    (run / name).write_bytes(content)
    monkeypatch.setattr(export_module, "load_model", lambda *a, **k: pytest.fail("loaded a model before refusing"))
    flags = ["--checkpoint", "step_0000001"] if "checkpoints" in name else []
    assert main(["export", str(run), str(tmp_path / "hf"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"podsrl export: error: {run / name.rpartition('/')[0]}") and message in err, err
    assert "\n" not in err and not (tmp_path / "hf").exists()


def test_overwrite_replaces_only_what_podsrl_exported(full_run, tmp_path, capsys):
    """#38: --overwrite deleted any destination holding a config.json: a run, a user's model
    or project folder. Now only a folder carrying podsrl's export marker is replaced."""

    def refused(*args):
        assert main(["export", *map(str, args)]) == 2
        return capsys.readouterr().err

    other_run = shutil.copytree(full_run, tmp_path / "other_run")
    users_model = shutil.copytree(full_run / "model", tmp_path / "users_model")
    (users_model / "notes.txt").write_text("mine")
    before = {folder: sorted(p.relative_to(folder) for p in folder.rglob("*")) for folder in (other_run, users_model)}
    assert f"{other_run}: exists, is not empty and is a podsrl run" in refused(full_run, other_run, "--overwrite")
    assert f"{users_model}: exists, is not empty and is not a podsrl export" in \
        refused(full_run, users_model, "--overwrite")
    assert before == {folder: sorted(p.relative_to(folder) for p in folder.rglob("*")) for folder in before}
    export(full_run, tmp_path / "hf")
    marker = json.loads((tmp_path / "hf" / "podsrl_export.json").read_text())
    assert marker == {"run_dir": str(full_run.resolve()), "source": "final model", "step": marker["step"],
                      "files": {p.name: digest(p) for p in (tmp_path / "hf").iterdir() if p.name != EXPORT_MARKER}}
    assert f"{tmp_path / 'hf'}: holds an earlier podsrl export; pass --overwrite" in refused(full_run, tmp_path / "hf")
    export(full_run, tmp_path / "hf", "--overwrite")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf") and (tmp_path / "hf" / "README.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "other_run", "users_model"]  # no temporary folder


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_overwrite_keeps_and_lists_what_podsrl_did_not_export(full_run, tmp_path, capsys):
    """#50: --overwrite trusted podsrl_export.json and replaced the folder whole: a user's
    my_eval.csv added to the exported model was deleted, with exit code 0 and no list."""
    export(full_run, tmp_path / "hf")
    (tmp_path / "hf" / "my_eval.csv").write_text("prompt,correct\n1+1,1\n")
    (tmp_path / "hf" / "evals").mkdir()
    (tmp_path / "hf" / "evals" / "run1.json").write_text("{}")
    capsys.readouterr()
    export(full_run, tmp_path / "hf", "--overwrite")
    assert f"{tmp_path / 'hf'}: kept 2 entries podsrl did not export (evals, my_eval.csv), moved into the new " \
           f"export" in capsys.readouterr().err
    assert (tmp_path / "hf" / "my_eval.csv").read_text() == "prompt,correct\n1+1,1\n"
    assert (tmp_path / "hf" / "evals" / "run1.json").read_text() == "{}"
    assert "my_eval.csv" not in json.loads((tmp_path / "hf" / EXPORT_MARKER).read_text())["files"]  # still the user's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temporary folder


def users_readme(folder):
    (folder / "README.md").write_text("# my notes on this model\n")
    return "README.md"


def hand_made_marker(folder):
    (folder / EXPORT_MARKER).write_text(json.dumps({"run_dir": "elsewhere", "source": "final model", "step": 1}))
    return EXPORT_MARKER


def users_weights(folder):
    (folder / "model.safetensors").write_bytes(b"my fine-tuned weights")
    return "model.safetensors"


@pytest.mark.parametrize("spoil", [users_readme, users_weights, hand_made_marker])
def test_overwrite_refuses_before_loading_a_model_when_a_file_it_keeps_has_a_name_the_export_writes(
        full_run, tmp_path, monkeypatch, capsys, spoil):
    import podsrl.run_folder.export as export_module

    export(full_run, tmp_path / "hf")
    (tmp_path / "hf" / "my_eval.csv").write_text("mine")
    named = spoil(tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    monkeypatch.setattr(export_module, "load_model", lambda *a, **k: pytest.fail("loaded a model before refusing"))
    assert main(["export", str(full_run), str(tmp_path / "hf"), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"podsrl export: error: {tmp_path / 'hf'}: holds files podsrl cannot prove it exported "
                          f"whose names the new export writes (") and "\n" not in err
    assert named in err.split("writes (")[1].split(")")[0].split(", ") and "my_eval.csv" not in err
    assert "move them out" in err
    assert before == {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}


def test_an_export_onto_a_link_writes_into_its_folder_and_keeps_the_link(full_run, tmp_path, capsys):
    """#57: --overwrite onto a link renamed the link away, emptied its folder, made the link a
    real folder and left a hidden .lnk.export-*.old link behind."""
    target, link = tmp_path / "disk" / "hf", tmp_path / "hf"
    target.mkdir(parents=True)
    link.symlink_to(target)
    export(full_run, link)  # an empty folder behind a link: the first export goes into it
    (target / "my_eval.csv").write_text("prompt,correct\n")
    export(full_run, link, "--overwrite")
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert (target / "my_eval.csv").read_text() == "prompt,correct\n"
    assert AutoModelForCausalLM.from_pretrained(link) and (target / EXPORT_MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "hf"]  # no hidden leftover
    assert sorted(p.name for p in target.parent.iterdir()) == ["hf"]
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "unmounted" / "hf")
    capsys.readouterr()
    assert main(["export", str(full_run), str(dangling)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"podsrl export: error: {dangling}: a link to {tmp_path / 'unmounted' / 'hf'}, which "
                          f"does not exist") and "\n" not in err
    assert not (tmp_path / "unmounted").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_an_export_gets_the_permissions_of_the_umask_and_an_overwrite_keeps_the_folders(full_run, tmp_path, umask):
    """#57: the export folder was private (mkdtemp's 0700) and so was model.safetensors."""
    import os
    import stat

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    before = os.umask(umask)
    try:
        export(full_run, tmp_path / "hf")
        assert mode(tmp_path / "hf") == 0o777 & ~umask
        assert {p.name: mode(p) for p in (tmp_path / "hf").iterdir()} == \
            {p.name: 0o666 & ~umask for p in (tmp_path / "hf").iterdir()}
        (tmp_path / "hf").chmod(0o750)
        (tmp_path / "hf" / "notes.txt").write_text("mine")
        (tmp_path / "hf" / "notes.txt").chmod(0o600)
        export(full_run, tmp_path / "hf", "--overwrite")
        assert mode(tmp_path / "hf") == 0o750
        assert mode(tmp_path / "hf" / "notes.txt") == 0o600  # the user's file as it was
        assert mode(tmp_path / "hf" / "model.safetensors") == 0o666 & ~umask
    finally:
        os.umask(before)


def test_a_full_disk_during_an_export_is_one_line_and_leaves_no_staging_folder(full_run, tmp_path, monkeypatch,
                                                                               capsys):
    """#50: safetensors' own error on a full disk came out as a 28-line traceback."""
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    def full_disk(self, folder, *args, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    export(full_run, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    for target, flags in ((tmp_path / "new", ()), (tmp_path / "hf", ("--overwrite",))):
        assert main(["export", str(full_run), str(target), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"podsrl export: error: {target}: could not write the export (SafetensorError: Error "
                              f"while serializing") and "\n" not in err and "free space, then run the same" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging folder, nothing half-written
    assert before == {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}


def test_a_failed_export_leaves_the_destination_as_it_was(full_run, tmp_path, monkeypatch, capsys):
    import podsrl.run_folder.export as export_module

    def disk_full(path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "fsync", disk_full)  # fails after the files are written
    assert main(["export", str(full_run), str(tmp_path / "new")]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "nothing half-written may remain"
    monkeypatch.undo()
    export(full_run, tmp_path / "hf")
    (tmp_path / "hf" / "marker.txt").write_text("the previous export")
    monkeypatch.setattr(export_module, "fsync", disk_full)
    assert main(["export", str(full_run), str(tmp_path / "hf"), "--overwrite"]) == 2
    assert (tmp_path / "hf" / "marker.txt").read_text() == "the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_ctrl_c_during_an_export_is_one_line_exit_130_and_leaves_the_destination_as_it_was(
        full_run, tmp_path, monkeypatch, capsys):
    import podsrl.run_folder.export as export_module

    def ctrl_c(path):
        raise KeyboardInterrupt  # after the files are written, before the folder is renamed into place

    export(full_run, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    monkeypatch.setattr(export_module, "fsync", ctrl_c)
    for target, flags in ((tmp_path / "new", ()), (tmp_path / "hf", ("--overwrite",))):
        assert main(["export", str(full_run), str(target), *flags]) == 130
        assert capsys.readouterr().err.strip().splitlines() == [
            "podsrl export: stopped by SIGINT; nothing was exported (an export is written beside its folder and "
            "renamed into place at the end)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging folder
    assert before == {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}


def test_env_reports_the_installed_versions(capsys):
    heavy = {"transformers", "trl", "peft", "datasets", "accelerate", "vllm", "deepspeed", "wandb", "trackio"}
    before = set(sys.modules)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert not (set(sys.modules) - before) & heavy, "env imported a library to read its version"
    assert f"- torch: {version('torch')} " in out
    assert f"- transformers: {version('transformers')}\n" in out
    for name in REPORTED_PACKAGES:
        assert f"- {name}: {installed(name)}" in out
    assert f"- podsrl: {version('podsrl')} (commit " in out

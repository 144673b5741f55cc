"""``podsrl eval``: a model's accuracy on a task's held-out split, written to files beside an
earlier eval's (:func:`run_eval`), and the refusals of folders that are not a model."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import sys
import time
from pathlib import Path

from podsrl.distributed import Processes
from podsrl.models import load_model
from podsrl.models.loading import BUILTIN_PATH_TAILS
from podsrl.options import bind
from podsrl.registry import component_label
from podsrl.run_folder.claim import RunLock, is_run_folder
from podsrl.tasks import TaskOptions, build_task, prepare_split
from podsrl.trainer.checkpoints import STATE_FILE, WEIGHTS_FILE, list_checkpoints
from podsrl.trainer.evaluate import EvalOptions, cut_share, cut_warning, eval_shortfall, evaluate

FINAL_MODEL = "model"  # a run's final model: RUN/model
# the config fields podsrl eval reads, so the options it offers (the command line's field table marks
# them: scripts/config_table.py): the task and its held-out split, the model and where it runs, how
# prompts are rendered, how completions are sampled, and where the files go
EVAL_FIELDS = frozenset({f.name for f in dataclasses.fields(TaskOptions)} | {
    "eval_samples", "eval_temperature", "eval_batch_size", "model", "dtype", "device", "seed", "output_dir",
    "system_prompt", "chat_template", "max_prompt_tokens", "max_completion_length"})
# a run's fields that say what its model was trained to answer: podsrl eval --model RUN/model reads them
RUN_TASK_FIELDS = ("task", "task_level", "data_seed", "train_data", "test_data", "prompt_column",
                   "answer_column", "reasoning_gym_size", "system_prompt", "chat_template",
                   "max_prompt_tokens", "max_completion_length")


def check_eval_model(model: str) -> None:
    """Refuse, saying what to run instead, the folders of a run that are not a model: the run
    folder itself, a checkpoint (trainable weights and optimizer state, no config or
    tokenizer), and a run's LoRA adapter whose base_model_name_or_path names another model than
    the run trained (it would load, or fail as 'damaged', on the wrong base)."""
    path = Path(model).expanduser()
    if not path.exists() and path.name == FINAL_MODEL and is_run_folder(path.parent):
        run, holder = path.parent, RunLock.holder(path.parent)
        state = f"a run still in progress ({holder})" if holder else "a run that has not finished"
        raise ValueError(f"model: {path} does not exist yet: {run} is {state}, whose final model is written "
                         f"when it ends; {_export_advice(run, run / 'checkpoints')}")
    if is_run_folder(path):
        final = path / FINAL_MODEL
        if (final / "config.json").exists() or (final / "adapter_config.json").exists():
            raise ValueError(f"model: {path} is a podsrl run folder, not a model: evaluate its final model "
                             f"with podsrl eval --model {final}")
        raise ValueError(f"model: {path} is a podsrl run folder without a final model (not finished); "
                         f"{_export_advice(path, path / 'checkpoints')}")
    if (path / WEIGHTS_FILE).is_file() and (path / STATE_FILE).is_file():
        run = (path.parent.parent if path.parent.name == "checkpoints" and is_run_folder(path.parent.parent)
               else None)
        raise ValueError(f"model: {path} is a podsrl checkpoint (trainable weights and optimizer state), not "
                         f"a model folder; {_export_advice(run, path.parent, path.name)}")
    if (path / "adapter_config.json").is_file() and is_run_folder(path.parent):
        _check_adapter_base(path, json.loads((path.parent / "config.json").read_text()).get("model", ""))


def run_of_model(model: str) -> Path | None:
    """The run folder whose final model ``model`` is (RUN/model), else None."""
    path = Path(model).expanduser()
    return path.parent if path.name == FINAL_MODEL and path.is_dir() and is_run_folder(path.parent) else None


def said_first(cfg, config_file: str | None, given: set[str], run: Path | None, terms: dict) -> list[str]:
    """The lines ``podsrl eval`` says before it evaluates: the settings of a ``--config`` file it
    does not read (a training YAML reused: its task is read), and, for a run's model, where each
    value that decides what it is judged on comes from: the run's config.json (``terms``) or the
    command line (``given``)."""
    def shown(names) -> str:
        return ", ".join(f"{name} {json.dumps(getattr(cfg, name))}" for name in names)
    lines, unread = [], sorted(given - EVAL_FIELDS)
    if unread:
        lines.append(f"warning: {config_file} sets {', '.join(unread)}, which podsrl eval does not read")
    if not terms:  # not a run's model, or the command line chose another task
        return lines
    told = [name for name in RUN_TASK_FIELDS if name in given]
    said = f"from its config.json ({run / 'config.json'}): {shown(terms)}"
    said += f"; from the command line: {shown(told)}" if told else ""
    return [*lines, f"podsrl eval: {cfg.model} is run {run}'s model; {said}"]


def with_output_dir(cfg, given: set[str]):
    """``cfg`` writing where it was told, else to :func:`default_eval_dir`: not the main job's
    runs/podsrl, which a later podsrl train would find taken."""
    if "output_dir" in given:
        return cfg
    return dataclasses.replace(cfg, output_dir=str(default_eval_dir(cfg.model, cfg.task)))


def run_terms(run: Path, given: set[str]) -> dict:
    """What a run's model is evaluated on unless the command line says otherwise (``given``: the
    fields it set): the task the run trained on, as its prompts were rendered, with its
    completion budget, from the run's config.json; none of them where another task is given
    (its own budget then applies)."""
    if "task" in given:
        return {}
    recorded = json.loads((run / "config.json").read_text())
    return {name: recorded[name] for name in RUN_TASK_FIELDS if name in recorded and name not in given}


def _export_advice(run: Path | None, checkpoints: Path, name: str = "") -> str:
    """How to evaluate a checkpoint: export it as a model folder first."""
    name = name or next((p.name for p in reversed(list_checkpoints(checkpoints))), "step_N")
    return (f"export it first: podsrl export {run or 'RUN_DIR'} EXPORT_DIR --checkpoint {name}, then "
            f"podsrl eval --model EXPORT_DIR")


def _check_adapter_base(adapter: Path, trained_on: str) -> None:
    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    if not trained_on or _same_model(base, trained_on):
        return
    raise ValueError(f"model: {adapter / 'adapter_config.json'}: base_model_name_or_path {base!r} is not the "
                     f"model the run trained this adapter on ({trained_on!r}, in "
                     f"{adapter.parent / 'config.json'}); set it to {trained_on!r} and run podsrl eval "
                     f"--model {adapter} again")


def _same_model(a: str, b: str) -> bool:
    """Two names of one model: equal, the same folder, a built-in's name and its folder, or a
    relative folder and the absolute path it was resolved to where the adapter was saved.
    Lenient: only names that clearly differ are refused."""
    parts = []
    for name in (a, b):
        path = Path(name).expanduser()
        parts.append(BUILTIN_PATH_TAILS.get(name) or (path.resolve().parts if path.is_dir() else path.parts))
    short, long = sorted(parts, key=len)
    return bool(short) and tuple(long[-len(short):]) == tuple(short)


def default_eval_dir(model: str, task) -> Path:
    """``podsrl eval``'s folder when none is given: ``runs/eval/MODEL-TASK``, not the main job's
    ``runs/podsrl`` (a later ``podsrl train`` would find that folder taken)."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}-{component_label(task)}").strip("_.")
    return Path("runs") / "eval" / (label or "model")


def _new_eval_files(out_dir: Path, stem: str):
    """(samples path, its file opened for writing, summary path): ``STEM-samples.jsonl``, else
    ``STEM-2-samples.jsonl``, ... the first whose files do not exist, created exclusively, so an
    earlier eval's files (or a concurrent one's) are never overwritten."""
    for number in itertools.count(1):
        name = stem if number == 1 else f"{stem}-{number}"
        samples, summary = out_dir / f"{name}-samples.jsonl", out_dir / f"{name}-summary.json"
        if summary.exists():
            continue
        try:
            return samples, samples.open("x", encoding="utf-8"), summary
        except FileExistsError:
            continue


def run_eval(cfg, task_options: TaskOptions) -> dict:
    """``podsrl eval``: accuracy of ``cfg.model`` on the task's held-out split, sampled as
    ``cfg``'s evaluation settings say (greedy at eval_temperature 0), one accuracy.

    Writes one JSONL record per sample (prompt, completion, extracted answer, gold,
    correct) and a summary to ``{output_dir}/eval/``, beside an earlier eval's files (a new
    number, never over them); returns the summary.
    """
    options = bind(EvalOptions, cfg, eval_greedy=False)
    check_eval_model(cfg.model)  # before the data and model load: a wrong folder should cost no time
    task = build_task(task_options, with_train=False)
    bundle = load_model(cfg.model, dtype=cfg.dtype)
    bundle.model.to(Processes().device(cfg.device))
    split = prepare_split(task.test[:options.eval_prompts], bundle.tokenizer,
                          system_prompt=cfg.system_prompt_for(task), use_chat_template=cfg.chat_template,
                          max_prompt_tokens=cfg.max_prompt_tokens)
    if not split.examples:
        raise ValueError(f"test_data: no held-out prompts for task {cfg.task!r} (dropped {split.dropped} "
                         f"over max_prompt_tokens={cfg.max_prompt_tokens})")
    shortfall = eval_shortfall(len(split.examples), options.eval_prompts)
    if shortfall:
        print(f"warning: {shortfall}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    evaluation = evaluate(bundle, task, split, options, cfg.max_completion_length, seed=cfg.seed)
    seconds = time.perf_counter() - start
    warning = cut_warning(evaluation.records, cfg.max_completion_length)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    out_dir = Path(cfg.output_dir) / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", task.name)
    samples_path, samples_file, summary_path = _new_eval_files(out_dir, stem)
    with samples_file as fh:
        for record in evaluation.records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    records = evaluation.records
    summary = {"model": cfg.model, "task": task.name, "accuracy": evaluation.accuracies["eval_accuracy"],
               "prompts": len(split.examples), "dropped_prompts": split.dropped,
               "samples_per_prompt": 1 if options.eval_temperature == 0 else options.eval_samples,
               "temperature": options.eval_temperature, "max_completion_length": cfg.max_completion_length,
               "answered": sum(r["extracted"] is not None for r in records) / max(1, len(records)),
               "cut": cut_share(records),
               "seconds": round(seconds, 2), "samples_file": str(samples_path)}
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary

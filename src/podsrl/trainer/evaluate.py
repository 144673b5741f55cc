"""Held-out evaluation, one function for training and ``podsrl eval``: sampled accuracy
(several samples per prompt, at the paper's temperature 0.9) and greedy accuracy, with
per-sample records.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from podsrl.distributed import Processes
from podsrl.models import ModelBundle, load_model
from podsrl.models.loading import BUILTIN_PATH_TAILS
from podsrl.registry import component_label
from podsrl.rewards.scorer import reward_inputs
from podsrl.rollout import generate
from podsrl.tasks import PreparedSplit, Task, TaskOptions, build_task, prepare_split
from podsrl.trainer.checkpoints import STATE_FILE, WEIGHTS_FILE, list_checkpoints
from podsrl.trainer.run_dir import is_run_folder
from podsrl.types import Rollouts


@dataclass(frozen=True)
class EvalOptions:
    prompts: int = 300  # held-out prompts (the first ones of the split)
    samples: int = 4  # samples per prompt for the sampled accuracy
    temperature: float = 0.9  # of the sampled accuracy (0 = greedy, one sample)
    greedy: bool = True  # also measure greedy accuracy
    max_new_tokens: int = 8
    batch_size: int = 512  # sequences generated at once


@dataclass
class Evaluation:
    # eval_accuracy (sampled), eval_greedy_accuracy, and each one's standard error over prompts (*_se)
    accuracies: dict[str, float]
    records: list[dict] = field(default_factory=list)  # one per sampled completion (this process's)


def generate_and_grade(bundle, split: PreparedSplit, *, samples: int, temperature: float, max_new_tokens: int,
                       seed: int, correct_fn: Callable[..., list],
                       extract_fn: Callable[[str], str | None] | None = None, top_p: float = 1.0,
                       batch_size: int = 512, generate_fn: Callable[..., Rollouts] = generate) -> list[dict]:
    """One record per completion of ``split``'s prompts: prompt, completion, extracted
    answer, gold, correct (a None / NaN verdict counts as not correct). ``generate_fn``:
    :func:`podsrl.rollout.generate` (transformers), or an engine's ``generate`` (vllm).

    ``correct_fn`` is called as every reward function is (:func:`reward_inputs`). Runs
    under its own seeded RNG (``torch.random.fork_rng``) so evaluating never changes the
    training run's random stream: how often one evaluates cannot change what is learnt.
    """
    if not split.examples:
        return []
    samples = 1 if temperature == 0 else samples
    device = bundle.model.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        rollouts = generate_fn(bundle.model, bundle.tokenizer, list(split.prompts), samples,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                               batch_size=batch_size)
    completions = [text for group in rollouts.texts for text in group]
    correct = correct_fn(**reward_inputs(split, rollouts).kwargs())
    records = []
    for k, (completion, verdict) in enumerate(zip(completions, correct)):
        example = split.examples[k // samples]
        records.append({"index": k // samples, "sample": k % samples, "prompt": example.prompt,
                        "completion": completion,
                        "extracted": extract_fn(completion) if extract_fn else None,
                        "gold": example.answer, "correct": _is_correct(verdict)})
    return records


def _is_correct(verdict) -> bool:
    return verdict is not None and not math.isnan(float(verdict)) and bool(verdict)


def accuracy(records: Sequence[dict]) -> float:
    """Fraction of correct completions (averaged over samples and prompts)."""
    return sum(r["correct"] for r in records) / max(1, len(records))


def prompt_moments(records: Sequence[dict]) -> list[float]:
    """[number of prompts, sum of per-prompt accuracies, sum of their squares]: what
    :func:`clustered_standard_error` needs, summable across processes."""
    per_prompt: dict[int, list[bool]] = {}
    for record in records:
        per_prompt.setdefault(record["index"], []).append(record["correct"])
    means = [sum(verdicts) / len(verdicts) for verdicts in per_prompt.values()]
    return [float(len(means)), sum(means), sum(mean * mean for mean in means)]


def clustered_standard_error(prompts: float, total: float, total_squares: float) -> float:
    """Standard error of an accuracy averaged over ``prompts`` prompts, each prompt a cluster:
    the sample standard deviation of the per-prompt accuracies over sqrt(prompts). Samples of
    one prompt are correlated (an easy prompt is right in all of them), so the binomial
    sqrt(p (1 - p) / completions) would understate it by up to sqrt(samples per prompt).
    NaN with fewer than two prompts."""
    if prompts < 2:
        return float("nan")
    mean = total / prompts
    variance = max(0.0, (total_squares - prompts * mean * mean) / (prompts - 1))
    return math.sqrt(variance / prompts)


def evaluate(bundle: ModelBundle, task: Task, split: PreparedSplit, options: EvalOptions, seed: int,
             procs: Processes | None = None, generate_fn: Callable[..., Rollouts] = generate) -> Evaluation:
    """Accuracy on the first ``options.prompts`` prompts of ``split``: sampled, and greedy
    when ``options.greedy``. With several processes each grades every world_size-th prompt
    and the counts are summed. A fixed ``seed`` gives every evaluation of a run the same
    sampling noise (common random numbers)."""
    procs = procs or Processes()
    mine = procs.strided(list(range(min(options.prompts, len(split.examples)))))
    split = split.at_prompts(mine)
    modes = {"eval_accuracy": (options.samples, options.temperature)}
    if options.greedy:
        modes["eval_greedy_accuracy"] = (1, 0.0)
    result = Evaluation({})
    for name, (samples, temperature) in modes.items():
        with procs.whole_weights(bundle.model):
            records = generate_and_grade(bundle, split, samples=samples, temperature=temperature,
                                         max_new_tokens=options.max_new_tokens, seed=seed,
                                         correct_fn=task.correct_fn, extract_fn=task.extract_fn,
                                         batch_size=options.batch_size, generate_fn=generate_fn)
        correct, count, *prompt_sums = procs.sum([float(sum(r["correct"] for r in records)),
                                                  float(len(records)), *prompt_moments(records)])
        result.accuracies[name] = correct / max(1.0, count)
        result.accuracies[f"{name}_se"] = clustered_standard_error(*prompt_sums)
        result.records = result.records or records
    return result


def eval_shortfall(held_out: int, asked: int) -> str:
    """The warning for a held-out split smaller than ``eval_prompts`` ('' when it is not):
    evaluation then uses all of it, and the reports say how many."""
    if held_out >= asked:
        return ""
    return (f"eval_prompts: evaluating on {held_out} prompts, fewer than eval_prompts={asked} asked (the held-out "
            f"split has no more)")


def check_eval_model(model: str) -> None:
    """Refuse, saying what to run instead, the folders of a run that are not a model: the run
    folder itself, a checkpoint (trainable weights and optimizer state, no config or
    tokenizer), and a run's LoRA adapter whose base_model_name_or_path names another model than
    the run trained (it would load, or fail as 'damaged', on the wrong base)."""
    path = Path(model).expanduser()
    if is_run_folder(path):
        final = path / "model"
        if (final / "config.json").exists() or (final / "adapter_config.json").exists():
            raise ValueError(f"model: {path} is a podsrl run folder, not a model: evaluate its final model with "
                             f"podsrl eval --model {final}")
        raise ValueError(f"model: {path} is a podsrl run folder without a final model (not finished); "
                         f"{_export_advice(path, path / 'checkpoints')}")
    if (path / WEIGHTS_FILE).is_file() and (path / STATE_FILE).is_file():
        run = path.parent.parent if path.parent.name == "checkpoints" and is_run_folder(path.parent.parent) else None
        raise ValueError(f"model: {path} is a podsrl checkpoint (trainable weights and optimizer state), not a "
                         f"model folder; {_export_advice(run, path.parent, path.name)}")
    if (path / "adapter_config.json").is_file() and is_run_folder(path.parent):
        _check_adapter_base(path, json.loads((path.parent / "config.json").read_text()).get("model", ""))


def _export_advice(run: Path | None, checkpoints: Path, name: str = "") -> str:
    """How to evaluate a checkpoint: export it as a model folder first."""
    name = name or next((p.name for p in reversed(list_checkpoints(checkpoints))), "step_N")
    return (f"export it first: podsrl export {run or 'RUN_DIR'} EXPORT_DIR --checkpoint {name}, then "
            f"podsrl eval --model EXPORT_DIR")


def _check_adapter_base(adapter: Path, trained_on: str) -> None:
    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""
    if not trained_on or _same_model(base, trained_on):
        return
    raise ValueError(f"model: {adapter / 'adapter_config.json'}: base_model_name_or_path {base!r} is not the model "
                     f"the run trained this adapter on ({trained_on!r}, in {adapter.parent / 'config.json'}); "
                     f"set it to {trained_on!r} and run podsrl eval --model {adapter} again")


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


def run_eval(cfg, task_options: TaskOptions, options: EvalOptions) -> dict:
    """``podsrl eval``: accuracy of ``cfg.model`` on the task's held-out split.

    Writes one JSONL record per sample (prompt, completion, extracted answer, gold,
    correct) and a summary to ``{output_dir}/eval/``, beside an earlier eval's files (a new
    number, never over them); returns the summary.
    """
    check_eval_model(cfg.model)  # before the data and model load: a wrong folder should cost no time
    task = build_task(task_options, with_train=False)
    bundle = load_model(cfg.model, dtype=cfg.dtype)
    bundle.model.to(Processes().device(cfg.device))
    split = prepare_split(task.test[:options.prompts], bundle.tokenizer, system_prompt=cfg.system_prompt_for(task),
                          use_chat_template=cfg.chat_template, max_prompt_tokens=cfg.max_prompt_tokens)
    if not split.examples:
        raise ValueError(f"test_data: no held-out prompts for task {cfg.task!r} (dropped {split.dropped} "
                         f"over max_prompt_tokens={cfg.max_prompt_tokens})")
    if eval_shortfall(len(split.examples), options.prompts):
        print(f"warning: {eval_shortfall(len(split.examples), options.prompts)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    evaluation = evaluate(bundle, task, split, options, seed=cfg.seed)
    seconds = time.perf_counter() - start
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
               "samples_per_prompt": 1 if options.temperature == 0 else options.samples,
               "temperature": options.temperature, "max_completion_length": options.max_new_tokens,
               "answered": sum(r["extracted"] is not None for r in records) / max(1, len(records)),
               "seconds": round(seconds, 2), "samples_file": str(samples_path)}
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary

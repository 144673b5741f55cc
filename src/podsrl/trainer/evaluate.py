"""Held-out evaluation, one function for training and ``podsrl eval``
(:mod:`podsrl.run_folder.eval_command`): sampled accuracy (several samples per prompt, at the
paper's temperature 0.9) and greedy accuracy, with per-sample records. Its settings
(:class:`EvalOptions`: when, on how many prompts, how) are declared here and nowhere else;
the config composes them. During training :class:`Evaluator` is the run's evaluation.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from podsrl.distributed import Processes
from podsrl.models import ModelBundle
from podsrl.options import NON_NEGATIVE, POSITIVE, Range, option
from podsrl.rollout import Sampling, generate
from podsrl.scoring import reward_inputs
from podsrl.tasks import HeldOutOptions, PreparedSplit, Task
from podsrl.types import Rollouts


@dataclass(frozen=True)
class EvalOptions(HeldOutOptions):
    """When and how the run evaluates (the config's fields of these names; ``eval_prompts``, the
    held-out split's size, is the task's too: :class:`podsrl.tasks.HeldOutOptions`)."""

    eval_steps: int = option(25, "Evaluate every this many steps, at step 0 and at the end (0 = only those; "
                                 "TRL's field).", NON_NEGATIVE)
    eval_samples: int = option(4, "Samples per held-out prompt for sampled accuracy.", POSITIVE)
    eval_temperature: float = option(
        0.9, "Temperature of sampled evaluation (paper: 0.9; 0 = greedy, one sample).",
        Range(0, why="0 = greedy"))
    eval_greedy: bool = option(True, "Also log greedy accuracy at each evaluation.")
    eval_batch_size: int = option(512, "Max sequences generated at once during evaluation.", POSITIVE)


@dataclass
class Evaluation:
    # eval_accuracy (sampled), eval_greedy_accuracy, and each one's standard error over prompts (*_se)
    accuracies: dict[str, float]
    records: list[dict] = field(default_factory=list)  # one per sampled completion (this process's)
    # seconds its decoding spent compiling the decode step or capturing CUDA graphs (a process's
    # first compiled call pays them); None where the sampler compiles nothing
    compile_seconds: float | None = None


def generate_and_grade(bundle, split: PreparedSplit, *, samples: int, temperature: float,
                       max_completion_length: int, seed: int, correct_fn: Callable[..., list],
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
                               Sampling(max_completion_length, temperature, top_p, batch_size))
    completions = [text for group in rollouts.texts for text in group]
    correct = correct_fn(**reward_inputs(split, rollouts).kwargs())
    cut = cut_by_budget(rollouts, max_completion_length, bundle.tokenizer.eos_token_id).flatten().tolist()
    records = []
    for k, (completion, verdict) in enumerate(zip(completions, correct)):
        example = split.examples[k // samples]
        records.append({"index": k // samples, "sample": k % samples, "prompt": example.prompt,
                        "completion": completion,
                        "extracted": extract_fn(completion) if extract_fn else None,
                        "gold": example.answer, "correct": _is_correct(verdict), "cut": cut[k]})
    return records


def cut_by_budget(rollouts: Rollouts, max_completion_length: int, eos_token_id: int | None) -> torch.Tensor:
    """[P, n] bool: samples that used the whole budget without an end of sequence (cut short)."""
    mask = rollouts.completion_mask.bool()  # [P, n, Lc]
    ended = ((rollouts.completion_ids == eos_token_id) & mask if eos_token_id is not None
             else torch.zeros_like(mask))
    return (mask.sum(-1) >= max_completion_length) & ~ended.any(-1)


def cut_share(records: Sequence[dict]) -> float:
    """The share of the records' completions cut by the budget (:func:`cut_by_budget`)."""
    return sum(r["cut"] for r in records) / max(1, len(records))


def cut_warning(records: Sequence[dict], max_completion_length: int) -> str:
    """The line for completions mostly cut by the budget ('' when at most half are): their
    accuracy grades cut-off text, and a run on them learns from it."""
    cut = cut_share(records)
    if cut <= 0.5:
        return ""
    return (f"max_completion_length: {100 * cut:.0f}% of {len(records)} held-out completions were cut at "
            f"{max_completion_length} tokens before they ended: the budget cuts the answers, so accuracy "
            "grades cut-off text; raise max_completion_length (0 = the task's budget)")


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


def evaluate(bundle: ModelBundle, task: Task, split: PreparedSplit, options: EvalOptions,
             max_completion_length: int, seed: int, procs: Processes | None = None,
             generate_fn: Callable[..., Rollouts] = generate) -> Evaluation:
    """Accuracy on the first ``options.eval_prompts`` prompts of ``split`` (completions of at
    most ``max_completion_length``): sampled, and greedy when ``options.eval_greedy``. With several
    processes each grades every world_size-th prompt and the counts are summed. A fixed
    ``seed`` gives every evaluation of a run the same sampling noise (common random numbers)."""
    procs = procs or Processes()
    mine = procs.strided(list(range(min(options.eval_prompts, len(split.examples)))))
    split = split.at_prompts(mine)
    modes = {"eval_accuracy": (options.eval_samples, options.eval_temperature)}
    if options.eval_greedy:
        modes["eval_greedy_accuracy"] = (1, 0.0)
    result = Evaluation({})
    stats: list[dict] = []  # each call's Rollouts.stats, for what its sampler paid to compile

    def generating(*args) -> Rollouts:
        rollouts = generate_fn(*args)
        stats.append(rollouts.stats)
        return rollouts

    for name, (samples, temperature) in modes.items():
        with procs.whole_weights(bundle.model):
            records = generate_and_grade(bundle, split, samples=samples, temperature=temperature,
                                         max_completion_length=max_completion_length, seed=seed,
                                         correct_fn=task.correct_fn, extract_fn=task.extract_fn,
                                         batch_size=options.eval_batch_size, generate_fn=generating)
        correct, count, *prompt_sums = procs.sum([float(sum(r["correct"] for r in records)),
                                                  float(len(records)), *prompt_moments(records)])
        result.accuracies[name] = correct / max(1.0, count)
        result.accuracies[f"{name}_se"] = clustered_standard_error(*prompt_sums)
        result.records = result.records or records
    if any("compile_seconds" in stat for stat in stats):  # from the settings: on every process alike
        result.compile_seconds = procs.max([sum(stat.get("compile_seconds", 0.0) for stat in stats)])[0]
    return result


def eval_shortfall(held_out: int, asked: int) -> str:
    """The warning for a held-out split smaller than ``eval_prompts`` ('' when it is not):
    evaluation then uses all of it, and the reports say how many."""
    if held_out >= asked:
        return ""
    return (f"eval_prompts: evaluating on {held_out} prompts, fewer than eval_prompts={asked} asked (the "
            "held-out split has no more)")


@dataclass
class Evaluator:
    """The run's evaluation, built at set-up: when it is due (:meth:`due`) and the held-out
    accuracy now (:meth:`__call__`), on the split, with the sampler and the seed it was given."""

    options: EvalOptions
    bundle: ModelBundle
    task: Task
    split: PreparedSplit  # the held-out prompts
    max_completion_length: int
    seed: int  # evaluation's own sampling seed (this process's): every evaluation draws the same noise
    procs: Processes
    generate_fn: Callable[..., Rollouts] = generate  # transformers, or the engine's own sampler
    warned: bool = False  # said that the budget cuts most completions (once a run)
    compiled: bool = False  # said what compiling the decode step cost (once a process)

    @property
    def prompts(self) -> int:
        """Held-out prompts each evaluation uses: eval_prompts, or fewer when the split is smaller."""
        return min(self.options.eval_prompts, len(self.split.examples))

    def due(self, step: int, last: bool) -> bool:
        """Every eval_steps steps, and after the ``last`` step."""
        return bool(self.options.eval_steps and step % self.options.eval_steps == 0) or last

    def __call__(self) -> dict[str, float]:
        evaluation = evaluate(self.bundle, self.task, self.split, self.options, self.max_completion_length,
                              self.seed, self.procs, generate_fn=self.generate_fn)
        warning = cut_warning(evaluation.records, self.max_completion_length) if not self.warned else ""
        if warning and self.procs.is_main:
            self.warned = True
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        if evaluation.compile_seconds is None:
            return evaluation.accuracies
        if evaluation.compile_seconds and not self.compiled and self.procs.is_main:
            self.compiled = True
            print(f"compiling the decode step took {evaluation.compile_seconds:.1f} s, in this evaluation "
                  f"(metrics: eval_compile_seconds; a training step's: generate_compile_seconds)",
                  file=sys.stderr, flush=True)
        return {**evaluation.accuracies, "eval_compile_seconds": evaluation.compile_seconds}

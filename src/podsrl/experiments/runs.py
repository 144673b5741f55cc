"""A run folder as comparisons read it: its config, its evaluation curve (accuracy against
training seconds) and its mean seconds per step by stage."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from podsrl.experiments.levels import first_passage, value_at
from podsrl.methods import METHODS
from podsrl.metrics import read_metrics
from podsrl.provenance import read_environment
from podsrl.registry import component_label, spec_parts


@dataclass
class FinishedRun:
    """A finished (or stopped) run folder as a comparison reads it."""

    path: Path
    config: dict
    evals: list[tuple[float, float]]  # (training seconds, sampled accuracy)
    inference_seconds: float  # mean per step: generate + reward
    update_seconds: float  # mean per step: logprobs + update
    other_seconds: float  # mean per step: select + advantages
    steps: int
    environment: list[dict] = field(default_factory=list)  # one entry per start of the run
    # largest per-step value of update_activation_mb / update_peak_cuda_mb (None: not logged)
    update_memory_mb: dict[str, float | None] = field(default_factory=dict)
    eval_steps: list[int] = field(default_factory=list)  # the step of each evaluation in ``evals``
    # each evaluation's standard error over prompts (eval_accuracy_se; None: not logged, or not measurable)
    eval_errors: list[float | None] = field(default_factory=list)
    eval_se_logged: bool = False  # the log has eval_accuracy_se (podsrl since #51), null where not measurable
    # partial rollouts' and the slots engine's per-step numbers (OFF_POLICY_FIELDS; staleness_max: the
    # largest), over the steps that logged them; empty when none did
    off_policy: dict[str, float] = field(default_factory=dict)
    # mean rollouts generated per step (:func:`generated_per_step`); None: read from the config's n (old callers)
    rollouts_generated: float | None = None
    rate_named: bool = False  # the arm's name carries the learning rate (:func:`name_swept_rates`)

    @property
    def arm(self) -> str:
        return arm_name(self.config, self.rate_named)

    @property
    def seed(self) -> int | None:
        return self.config.get("seed")

    @property
    def budget_seconds(self) -> float:
        """Training time of the last evaluation: where the run's curve ends."""
        return self.evals[-1][0]

    def curve(self, axis: str = "seconds") -> list[tuple[float, float]]:
        """(training seconds, accuracy) at each evaluation, or (step, accuracy) with axis 'steps'."""
        if axis == "steps":
            return [(float(step), accuracy) for step, (_, accuracy) in zip(self.eval_steps, self.evals)]
        return list(self.evals)

    def rollout_milliseconds(self) -> tuple[float, float]:
        """Mean cost of one generated rollout (inference seconds per step over the rollouts
        generated per step, as the steps logged them: :attr:`rollouts_generated`) and of one
        trained rollout (update seconds per step over the prompts x m, or x n, trained on), in
        ms: both factors of a speedup (docs/reproducing.md)."""
        c = self.config
        method, n, m = METHODS[c["method"]], c.get("num_generations", c.get("n")), c.get("num_kept", c.get("m"))
        prompts = c.get("prompts_per_step", 1)
        generated = self.rollouts_generated or prompts * method.generated_per_prompt(n, m)
        return (1000 * self.inference_seconds / generated,
                1000 * self.update_seconds / (prompts * method.trained_per_prompt(n, m)))

    def accuracy_at(self, seconds: float) -> float:
        """Linear interpolation between evaluations (held at the ends)."""
        return value_at(self.evals, seconds)

    def time_to(self, accuracy: float) -> float | None:
        """First training time at which the (interpolated) curve reaches ``accuracy``."""
        return first_passage(self.evals, accuracy)

    def censored_time_to(self, accuracy: float) -> tuple[float, bool]:
        """(seconds, censored): the time to ``accuracy``, or the whole budget when the run
        never reached it (then the true time is larger: censored)."""
        seconds = self.time_to(accuracy)
        return (self.budget_seconds, True) if seconds is None else (seconds, False)


class NothingToCompare(ValueError):
    """A run folder whose log has no curve to compare: no evaluation, or no training step."""


def _nothing_to_compare(path: Path, steps: list[dict], evaluated: list[dict]) -> str:
    """Why a run's metrics.jsonl gives no curve ('' when it does), in the run's own numbers."""
    if not evaluated:
        return (f"{path}: no evaluation in its metrics.jsonl ({len(steps)} training step"
                f"{'s' if len(steps) != 1 else ''} logged, none with eval_accuracy)")
    if not steps:
        return f"{path}: no training step in its metrics.jsonl (only the evaluation at step 0)"
    return ""


# per-step means a comparison reports beside the stage costs, where runs logged them
OFF_POLICY_FIELDS = ("off_policy_token_frac", "staleness_mean", "partial_samples_resumed", "partial_samples_restarted",
                     "idle_slot_frac")


def off_policy_numbers(steps: list[dict]) -> dict[str, float]:
    """Per-step means of :data:`OFF_POLICY_FIELDS` and the largest staleness_max, over the steps
    that logged each."""
    numbers = {}
    for key in OFF_POLICY_FIELDS:
        logged = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        if logged:
            numbers[key] = statistics.fmean(logged)
    largest = largest_logged(r.get("staleness_max") for r in steps)
    if largest is not None:
        numbers["staleness_max"] = largest
    return numbers


def generated_per_step(config: dict, record: dict) -> float:
    """The rollouts one step generated: where dynamic sampling logged its rounds' prompts
    (prompts_generated), those x the rollouts per prompt (with early stop too, an upper bound: the
    samples it cancelled are not subtracted); else where the step logged the samples its groups hold
    (rollouts_generated: early stop, pruning, adaptive n, partial rollouts; cancelled and pruned samples
    are not among them, though the tokens they decoded are in the generation seconds), those; else
    prompts x the rollouts per prompt of the config's n and m (every sample generated whole)."""
    if isinstance(record.get("rollouts_generated"), (int, float)) and "prompts_generated" not in record:
        return float(record["rollouts_generated"])
    method = METHODS[config["method"]]
    per_prompt = method.generated_per_prompt(config.get("num_generations", config.get("n")),
                                             config.get("num_kept", config.get("m")))
    if isinstance(record.get("prompts_generated"), (int, float)):
        return record["prompts_generated"] * per_prompt
    return float(config.get("prompts_per_step", 1) * per_prompt)


def logged_generation(steps: list[dict]) -> bool:
    """Whether any step logged how many rollouts it generated (else the config's n and m say it)."""
    return any(key in r for r in steps for key in ("rollouts_generated", "prompts_generated"))


def evaluated_record(record: dict) -> bool:
    """Whether a metrics record holds an evaluation: a finite eval_accuracy (an evaluation that gave
    no number, NaN, is no point of the curve: it printed 'nan%' and broke the interpolation)."""
    value = record.get("eval_accuracy")
    return isinstance(value, (int, float)) and math.isfinite(value)


def load_run(path: Path) -> FinishedRun:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    records = read_metrics(path / "metrics.jsonl")
    evaluated = [r for r in records if evaluated_record(r)]
    evals = [(r["train_seconds"], r["eval_accuracy"]) for r in evaluated]
    steps = [r for r in records if r["step"] > 0]
    if _nothing_to_compare(path, steps, evaluated):
        raise NothingToCompare(_nothing_to_compare(path, steps, evaluated))

    def per_step(*keys):
        return statistics.fmean(sum(r.get(k) or 0.0 for k in keys) for r in steps)

    return FinishedRun(path, config, evals, per_step("time_generate", "time_reward"),
                       per_step("time_logprobs", "time_update"), per_step("time_select", "time_advantages"),
                       len(steps), read_environment(path),
                       {key: largest_logged(r.get(key) for r in steps)
                        for key in ("update_activation_mb", "update_peak_cuda_mb")},
                       [r["step"] for r in evaluated], [r.get("eval_accuracy_se") for r in evaluated],
                       any("eval_accuracy_se" in r for r in evaluated), off_policy_numbers(steps),
                       statistics.fmean(generated_per_step(config, r) for r in steps)
                       if logged_generation(steps) else None)


def load_comparable(paths: list[Path], left_out: Callable[[str], None]) -> list[FinishedRun]:
    """The runs of ``paths`` that have a curve to compare; ``left_out`` is told, one line each,
    which are left out and why (``podsrl plot`` over folders where one run never evaluated)."""
    runs = []
    for path in paths:
        try:
            runs.append(load_run(path))
        except NothingToCompare as why:
            left_out(f"left out {why}")
    return runs


def run_identity(run: FinishedRun) -> tuple | None:
    """What makes a run itself, not its folder: its first start's time and command line
    (environment.json), which a copy of the folder keeps and another run, of the same config and
    seed included, does not; None where no start's time is recorded to the sub-second (podsrl
    before 71b53c4 kept the date to the second only, as test fixtures do)."""
    first = run.environment[0] if run.environment else {}
    if not isinstance(first.get("unix_time"), (int, float)):
        return None
    return first["unix_time"], tuple(first.get("argv") or ())


def once_each(runs: list[FinishedRun], told: Callable[[str], None]) -> list[FinishedRun]:
    """``runs`` with each run once: a copied run folder is the same run, not a second seed
    (``told`` says which folder was left out, one line each)."""
    first: dict[tuple, FinishedRun] = {}
    kept = []
    for run in runs:
        identity = run_identity(run)
        if identity is not None and identity in first:
            told(f"{run.path} is a copy of the run {first[identity].path} (the same start in "
                 f"environment.json): counted once")
            continue
        if identity is not None:
            first[identity] = run
        kept.append(run)
    return kept


def largest_logged(values) -> float | None:
    """The largest of logged values, skipping those not logged (None) or not measured (NaN:
    metrics.jsonl's null); None when none is left."""
    logged = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return max(logged) if logged else None


def arm_name(config: dict, rate_named: bool = False) -> str:
    """The arm a run's config belongs to, as reports name it: method, n, m, rule and variants, and
    with ``rate_named`` its learning rate (an arm of a learning-rate sweep)."""
    # (runs written before the rename of n / m / rule still read)
    n = "auto" if config.get("adaptive_n") else config.get("num_generations", config.get("n"))
    m, rule = config.get("num_kept", config.get("m")), config.get("downsampling_rule", config.get("rule"))
    rate = [f"lr {config['learning_rate']:g}"] if rate_named else []
    return " ".join([METHODS[config["method"]].arm_name(n, m, rule), *arm_variants(config), *rate])


def swept_rates(configs: list[dict]) -> list[bool]:
    """Whether each config's arm is named with its learning rate: where one seed of the arm was
    trained at several rates (a learning-rate sweep). An arm trained at one rate keeps its name, so
    a comparison without a sweep reads as it always has; seeds that each ran at a rate of their own
    are one arm mixed by mistake, which :func:`~podsrl.experiments.seeds.warn_unlike_seeds` names."""
    rates: dict[tuple, set] = {}
    for config in configs:
        rates.setdefault((arm_name(config), config.get("seed")), set()).add(config.get("learning_rate"))
    swept = {arm for (arm, _), seen in rates.items() if len(seen) > 1}
    return [arm_name(config) in swept for config in configs]


def name_swept_rates(runs: list[FinishedRun]) -> list[FinishedRun]:
    """``runs``, each arm of a learning-rate sweep named with its rate (:func:`swept_rates`)."""
    for run, named in zip(runs, swept_rates([run.config for run in runs])):
        run.rate_named = named
    return runs


def arm_variants(fields: dict) -> list[str]:
    """What sets an arm apart beyond method, n, m and rule (adaptive n shows as n = 'auto'):
    the slots engine, early stop, partial rollouts, pruning of running samples (with its rule), dynamic
    sampling, and a prompt selector other than the shuffled pass (by its name; a module's by the object's;
    with its arguments, if any)."""
    selector = component_label(fields.get("prompt_selector", "shuffled"), short=True)
    engine = spec_parts(fields.get("generation_engine", "hf"), "generation_engine")[0]  # a name, or a mapping's
    partial = f"partial-{fields.get('partial_extra_prompts', 2)}"  # with its over-provisioning
    return [label for label, on in (("slots", engine == "slots"),
                                    ("early-stop", fields.get("group_early_stop")),
                                    (partial, fields.get("partial_rollouts")),
                                    (f"prune-{fields.get('prune_rule', 'finished')}", fields.get("prune_running")),
                                    ("dynamic_sampling", fields.get("dynamic_sampling")),
                                    (selector, selector != "shuffled")) if on]

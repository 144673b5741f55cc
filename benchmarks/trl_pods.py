"""PODS inside TRL (podsrl.trl.PODSTrainer) against TRL's own GRPOTrainer, on CPU with the
tiny model and the arithmetic task (the main job's settings: 16 prompts per step, 8 new
tokens, lr 2e-4 after 10 warm-up steps, AdamW (0.9, 0.99), weight decay 0.1, grad clip 0.1).

    pip install -e ".[trl]"
    python benchmarks/trl_pods.py step-time [--rounds 3] [--steps 12] [--record NAME]
    python benchmarks/trl_pods.py time-to-accuracy [--seeds 3] [--budget_minutes 2] [--output_dir runs/trl-tta]
        [--figures benchmarks/figures] [--record NAME]

step-time: seconds per optimizer step of PODS n = 16 -> m = 4, GRPO with G = 16 and G = 4,
split into generation (GRPOTrainer._generate), rewards and selection, the no-grad log-prob
passes (beta = 0.04, so TRL computes reference log-probs) and the rest (forward, backward,
optimizer); the arms alternate within each round, the first 2 steps of every run dropped.

time-to-accuracy: PODSTrainer n -> m vs GRPOTrainer m (beta = 0), each run a fixed budget of
training time (evaluation excluded), held-out accuracy with podsrl's evaluation every
eval_steps steps; the runs are interleaved seed by seed and written as podsrl run
directories, so `podsrl compare`'s analysis (censoring, exact t intervals, provenance)
reports them. ``--config FILE.yaml`` takes the regime from a podsrl config, so both
libraries train the same thing: its model (and LoRA), task, prompts rendered exactly as
podsrl renders them (system prompt, chat template), n, m, prompts per step, micro-batch,
learning rate and warm-up, completion length, bf16, reward weights and evaluation settings;
without it, podsrl's defaults (the main job: tiny model, 16 -> 4, 16 prompts per step, 4
samples x 300 held-out prompts at T = 0.9 every 25 steps).

    python benchmarks/trl_pods.py time-to-accuracy --config configs/smollm2-headroom.yaml \
        --seeds 3 --budget_minutes 8 --output_dir runs/trl-headroom
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from podsrl.experiments.compare import analyze, run_plan, write_report
from podsrl.metrics import MetricsLog
from podsrl.models import load_model
from podsrl.models.precision import autocast
from podsrl.options import bind
from podsrl.provenance import record_environment
from podsrl.rewards import arithmetic_correct, arithmetic_format
from podsrl.tasks import build_task, prepare_split
from podsrl.trainer.config import Config, make_config, parse_value
from podsrl.trainer.evaluate import EvalOptions, evaluate
from podsrl.trainer.setup import task_options
from podsrl.trl import PODSConfig, PODSTrainer, trl_batch_arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

STEP_TIME_ARMS = {"pods": ("pods", 16, 4), "grpo16": ("grpo", 16, 16), "grpo4": ("grpo", 4, 4)}  # method, n, m


def tta_arms(cfg: Config) -> dict[str, tuple[str, int, int]]:
    """The time-to-accuracy arms of ``cfg``: GRPOTrainer with m generations, PODSTrainer n -> m."""
    n, m = cfg.num_generations, cfg.num_kept
    return {f"grpo{m}": ("grpo", m, m), "pods": ("pods", n, m)}


class StageClock:
    """Seconds per optimizer step, split by stage, from wrappers around TRL's methods:
    ``_generate`` (PODS: generation, rewards and selection), ``_calculate_rewards`` (GRPO's
    reward step; PODS's returns the rewards it computed before selection) and the no-grad
    calls of ``_get_per_token_logps_and_entropies``."""

    def __init__(self, trainer) -> None:
        self.step_seconds: list[float] = []
        self.totals: list[dict[str, float]] = []
        self.stage: dict[str, float] = {}
        self.start = 0.0
        for name, method, only_no_grad in (("generate", "_generate", False), ("generate", "_calculate_rewards", False),
                                           ("logprobs", "_get_per_token_logps_and_entropies", True)):
            setattr(trainer, method, self._timed(name, getattr(trainer, method), only_no_grad))

    def _timed(self, name, fn, only_no_grad):
        def wrapper(*args, **kwargs):
            if only_no_grad and torch.is_grad_enabled():
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.stage[name] = self.stage.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    def begin(self) -> None:
        self.stage, self.start = {}, time.perf_counter()

    def end(self) -> dict[str, float]:
        seconds = time.perf_counter() - self.start
        split = {"step": seconds, "generate": self.stage.get("generate", 0.0),
                 "logprobs": self.stage.get("logprobs", 0.0)}
        split["rest"] = seconds - split["generate"] - split["logprobs"]
        self.step_seconds.append(seconds)
        self.totals.append(split)
        return split


class ClockCallback(TrainerCallback):
    def __init__(self, clock: StageClock) -> None:
        self.clock = clock

    def on_step_begin(self, *args, **kwargs):
        self.clock.begin()

    def on_step_end(self, *args, **kwargs):
        self.clock.end()


def dataset(split) -> Dataset:
    """Train prompts as podsrl renders them (system prompt, chat template): TRL conditions on
    the same text (a string prompt is tokenized as it is) and the rewards see the gold answer."""
    return Dataset.from_list([{"prompt": text, "answer": ex.answer} for ex, text in zip(split.examples, split.prompts)])


def config(cfg: Config, method: str, n: int, m: int, out: Path, seed: int, beta: float, max_steps: int):
    batch = trl_batch_arguments(cfg.prompts_per_step, n, m, min(cfg.micro_batch_size, cfg.prompts_per_step * m))
    common = dict(output_dir=str(out), max_steps=max_steps, learning_rate=cfg.learning_rate,
                  lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps, adam_beta1=cfg.adam_beta1,
                  adam_beta2=cfg.adam_beta2, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                  max_completion_length=cfg.max_completion_length, temperature=cfg.temperature, top_k=0,
                  top_p=cfg.top_p, beta=beta, loss_type="grpo", scale_rewards="group" if cfg.scale_rewards else "none",
                  reward_weights=[cfg.correct_weight, cfg.format_weight], bf16=cfg.bf16,
                  use_cpu=not torch.cuda.is_available(), report_to="none", save_strategy="no",
                  logging_steps=10**6, disable_tqdm=True, seed=seed)
    if method == "pods":
        return PODSTrainer, PODSConfig(**common, **batch, downsampling_rule=cfg.downsampling_rule)
    batch.pop("num_kept")
    return GRPOTrainer, GRPOConfig(**common, **batch)


def make_trainer(cfg: Config, arm: tuple[str, int, int], out: Path, seed: int, beta: float, max_steps: int, task,
                 callbacks=()):
    """The arm's trainer on podsrl's model (LoRA as ``cfg`` asks), and the held-out split."""
    trainer_class, args = config(cfg, *arm, out, seed, beta, max_steps)
    bundle = load_model(cfg.model, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                        lora_dropout=cfg.lora_dropout, dtype=cfg.dtype, lora_target_modules=cfg.lora_targets)
    train_split, test_split = (prepare_split(examples, bundle.tokenizer, system_prompt=cfg.system_prompt_for(task),
                                             use_chat_template=cfg.chat_template,
                                             max_prompt_tokens=cfg.max_prompt_tokens)
                               for examples in (task.train, task.test))
    trainer = trainer_class(model=bundle.model, processing_class=bundle.tokenizer, args=args,
                            train_dataset=dataset(train_split), reward_funcs=[arithmetic_correct, arithmetic_format],
                            callbacks=list(callbacks))
    return trainer, bundle, test_split


# --- step time ----------------------------------------------------------------------------------
def regime(args) -> Config:
    """The podsrl config both libraries train: ``--config`` with the ``--set`` overrides."""
    overrides = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set: expected FIELD=VALUE, got {item!r}")
        overrides[name] = parse_value(name, value)
    return make_config(args.config, overrides)


def step_time(args) -> str:
    cfg = regime(args)
    task = build_task(task_options(cfg))
    rows: dict[str, list[dict]] = {arm: [] for arm in STEP_TIME_ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for arm in STEP_TIME_ARMS:
                trainer, _, _ = make_trainer(cfg, STEP_TIME_ARMS[arm], Path(tmp) / f"{arm}{round_}", 0, 0.04,
                                             args.steps, task)
                clock = StageClock(trainer)
                trainer.add_callback(ClockCallback(clock))
                trainer.train()
                rows[arm] += clock.totals[2:]
    names = {"pods": "PODSTrainer n=16 -> m=4", "grpo16": "GRPOTrainer G=16", "grpo4": "GRPOTrainer G=4"}
    mean = {arm: {k: statistics.fmean(r[k] for r in rows[arm]) for k in rows[arm][0]} for arm in STEP_TIME_ARMS}
    for r in mean.values():
        r["generate+reward+select"] = r["generate"]
    lines = [f"{args.rounds} rounds x {args.steps} steps per arm (first 2 of each run dropped), beta = 0.04, "
             f"{cfg.prompts_per_step} prompts per step, micro-batches of {cfg.micro_batch_size} trained rows",
             "", "| arm | s/step | generation + rewards + selection | no-grad log-probs | forward/backward/optimizer |",
             "| --- | --- | --- | --- | --- |"]
    for arm in STEP_TIME_ARMS:
        r = mean[arm]
        lines.append(f"| {names[arm]} | {r['step']:.3f} | {r['generate+reward+select']:.3f} | {r['logprobs']:.3f} "
                     f"| {r['rest']:.3f} |")
    p, g16, g4 = mean["pods"], mean["grpo16"], mean["grpo4"]
    lines += ["", f"- PODS step / GRPO G=16 step: {p['step'] / g16['step']:.2f}x; PODS step / GRPO G=4 step: "
                  f"{p['step'] / g4['step']:.2f}x",
              f"- PODS no-grad log-probs / GRPO G=16's: {p['logprobs'] / g16['logprobs']:.2f}x (m / n = 0.25)",
              f"- PODS step vs generation(G=16) + update(G=4): {p['step']:.3f} s vs "
              f"{g16['generate+reward+select'] + g4['logprobs'] + g4['rest']:.3f} s"]
    return "\n".join(lines)


# --- time to accuracy --------------------------------------------------------------------------
class Budgeted(TrainerCallback):
    """Training time per step (evaluation excluded), held-out accuracy every `every` steps,
    podsrl's metrics.jsonl, and a stop when the budget is spent."""

    def __init__(self, run_dir: Path, clock: StageClock, bundle, task, split, budget_s: float, seed: int,
                 cfg: Config) -> None:
        self.run_dir, self.clock, self.bundle, self.task, self.split = run_dir, clock, bundle, task, split
        self.budget_s, self.seed, self.every = budget_s, seed, cfg.eval_steps
        self.metrics, self.train_seconds = MetricsLog(run_dir / "metrics.jsonl"), 0.0
        self.options, self.max_new_tokens = bind(EvalOptions, cfg), cfg.max_completion_length
        self.autocast = cfg.bf16  # evaluate as the own trainer does: under bf16 autocast when training uses it

    def evaluate(self) -> dict:
        was = self.bundle.model.training
        with autocast(self.bundle.model.device, "bfloat16" if self.autocast else ""):
            accuracies = evaluate(self.bundle, self.task, self.split, self.options, self.max_new_tokens,
                                  seed=self.seed + 10_007).accuracies
        self.bundle.model.train(was)
        return accuracies

    def on_train_begin(self, args, state, control, **kwargs):
        self.metrics.write({"step": 0, "train_seconds": 0.0, **self.evaluate()})

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.begin()

    def on_step_end(self, args, state, control, **kwargs):
        split = self.clock.end()
        self.train_seconds += split["step"]
        record = {"step": state.global_step, "train_seconds": self.train_seconds, "time_generate": split["generate"],
                  "time_logprobs": split["logprobs"], "time_update": split["rest"]}
        out_of_time = self.train_seconds >= self.budget_s
        if state.global_step % self.every == 0 or out_of_time:
            record.update(self.evaluate())
        self.metrics.write(record)
        control.should_training_stop = out_of_time


def time_to_accuracy(args) -> str:
    cfg = regime(args)
    task = build_task(task_options(cfg))
    arms = tta_arms(cfg)
    seeds = list(range(args.seeds))
    run_dirs = []
    for arm, seed in run_plan(list(arms), seeds):
        method, n, m = arms[arm]
        run_dir = args.output_dir / "runs" / arm / f"seed{seed}"
        run_dirs.append(run_dir)
        if (run_dir / "summary.json").exists():
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        (run_dir / "config.json").write_text(json.dumps({"method": method, "num_generations": n, "num_kept": m,
                                                         "downsampling_rule": cfg.downsampling_rule, "seed": seed,
                                                         "library": "trl", "budget_minutes": args.budget_minutes,
                                                         "regime": args.config or "podsrl defaults",
                                                         "overrides": args.set, "model": cfg.model}))
        torch.manual_seed(seed)
        trainer, bundle, split = make_trainer(cfg, arms[arm], run_dir / "trl", seed, 0.0, 10**6, task)
        record_environment(run_dir, bundle.tokenizer)  # with its EOS: which SmolLM2 conversion (#57)
        callback = Budgeted(run_dir, StageClock(trainer), bundle, task, split, args.budget_minutes * 60, seed, cfg)
        trainer.add_callback(callback)
        trainer.train()
        (run_dir / "summary.json").write_text(json.dumps({"train_seconds": callback.train_seconds}) + "\n")
        print(f"{run_dir}: {trainer.state.global_step} steps", flush=True)
    result = analyze(run_dirs, baseline="grpo")
    paths = write_report(result, args.output_dir, title="PODS in TRL vs GRPO in TRL (mean, 95% CI)")
    if args.figures:
        args.figures.mkdir(parents=True, exist_ok=True)
        target = args.figures / f"{args.record or 'trl-tta'}-accuracy.png"
        target.write_bytes(paths["accuracy"].read_bytes())
    return paths["table"].read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=["step-time", "time-to-accuracy"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--config", default=None, help="a podsrl YAML config: the regime both libraries train "
                        "(default: podsrl's defaults, the main job)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field of the config, e.g. --set bf16=true (repeatable)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget_minutes", type=float, default=2.0)
    parser.add_argument("--output_dir", type=Path, default=Path("runs/trl-tta"))
    parser.add_argument("--figures", type=Path, default=None)
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as generated block NAME")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        torch.set_num_threads(2)
    table = step_time(args) if args.experiment == "step-time" else time_to_accuracy(args)
    print(table)
    if args.record:
        figure = (f"\n\n![PODS in TRL: accuracy vs training time](figures/{args.record}-accuracy.png)"
                  if args.figures and args.experiment == "time-to-accuracy" else "")
        record(args.record, table + figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())

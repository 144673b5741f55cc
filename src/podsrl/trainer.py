"""The training loop: generate -> reward -> select -> advantages -> update, read top to bottom.

Each stage is a function of its own (here or in rollout/, rewards.py, select.py, algo.py,
update.py); ``train`` only calls them in order, times each, and logs what shows whether
down-sampling works (reward mean/std before and after selection, zero-variance groups,
completion length, seconds per stage).
"""

from __future__ import annotations

import copy
import json
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from podsrl import algo
from podsrl.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from podsrl.config import Config
from podsrl.distributed import Processes
from podsrl.evaluate import generate_and_grade
from podsrl.metrics import MetricsLog, StageTimer
from podsrl.models import ModelBundle, load_model
from podsrl.provenance import record_environment
from podsrl.rewards import RewardStack, load_reward_fn
from podsrl.rollout import ENGINES, Rollouts, concat_rollouts
from podsrl.select import select
from podsrl.state import PromptSampler, StopSignals, TrainingStopped
from podsrl.tasks import Example, PreparedSplit, Task, build_task, prepare_split, reward_columns
from podsrl.update import batch_logprobs, flatten_for_update, make_optimizer, update_policy


# ----------------------------------------------------------------------------- stages
@dataclass
class Scorer:
    """The run's reward: ``correct_weight * correct + format_weight * format`` from the task,
    or the user's ``reward_funcs`` instead. Correctness is always scored too: it is the
    accuracy metric."""

    correct: RewardStack
    format: RewardStack
    custom: RewardStack | None
    correct_weight: float
    format_weight: float

    @classmethod
    def from_config(cls, task: Task, cfg: Config) -> "Scorer":
        def stack(fns, weights):
            return RewardStack(fns, weights, error_policy=cfg.reward_error_policy, timeout=cfg.reward_timeout)

        custom = (stack([load_reward_fn(r) for r in cfg.reward_specs], cfg.reward_weight_values)
                  if cfg.reward_specs else None)
        return cls(stack([task.correct_fn], [1.0]), stack([task.format_fn], [1.0]), custom,
                   cfg.correct_weight, cfg.format_weight)

    @property
    def failures(self) -> int:
        return self.correct.failures + self.format.failures + (self.custom.failures if self.custom else 0)

    def __call__(self, examples: list[Example], rollouts: Rollouts) -> dict[str, torch.Tensor]:
        """Rewards [P, n] and their parts; unverifiable samples (NaN) score 0 and are counted."""
        n = rollouts.group_size
        prompts = [ex.prompt for ex in examples for _ in range(n)]
        completions = [text for group in rollouts.texts for text in group]
        columns = reward_columns(examples, n)
        correct = self.correct(prompts, completions, columns)
        if self.custom is None:
            formatted = self.format(prompts, completions, columns)
            total = self.correct_weight * correct.nan_to_num(0.0) + self.format_weight * formatted.nan_to_num(0.0)
            unverifiable = correct.isnan() & formatted.isnan()
        else:
            formatted = torch.full_like(correct, float("nan"))
            total = self.custom(prompts, completions, columns)
            unverifiable = total.isnan()
            total = total.nan_to_num(0.0)
        shape = (len(examples), n)
        return {"reward": total.view(shape), "correct": correct.view(shape), "format": formatted.view(shape),
                "unverifiable": unverifiable.view(shape)}


def evaluate(bundle: ModelBundle, task: Task, test: PreparedSplit, cfg: Config,
             procs: Processes | None = None) -> dict[str, float]:
    """Held-out accuracy: sampled (eval_samples per prompt at eval_temperature) and greedy.
    A fixed seed gives every evaluation the same sampling noise (common random numbers).
    With several processes each grades every world_size-th prompt and the counts are summed."""
    procs = procs or Processes()
    common = dict(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + 10_007 + procs.rank,
                  correct_fn=task.correct_fn, batch_size=cfg.eval_batch_size)
    examples = procs.strided(test.examples[:cfg.eval_prompts])
    prompts = procs.strided(test.prompts[:cfg.eval_prompts])
    modes = {"eval_accuracy": (cfg.eval_samples, cfg.eval_temperature)}
    if cfg.eval_greedy:
        modes["eval_greedy_accuracy"] = (1, 0.0)
    out = {}
    for name, (samples, temperature) in modes.items():
        with procs.whole_weights(bundle.model):
            records = generate_and_grade(bundle, examples, prompts, samples=samples, temperature=temperature,
                                         **common)
        correct, count = procs.sum([float(sum(r["correct"] for r in records)), float(len(records))])
        out[name] = correct / max(1.0, count)
    return out


def _group_stats(prefix: str, rewards: torch.Tensor) -> dict[str, float]:
    """Mean, mean within-group std and zero-variance fraction of rewards [P, k]."""
    return {f"{prefix}_mean": float(rewards.mean()),
            f"{prefix}_std": float(rewards.std(dim=1, correction=0).mean()),
            f"{prefix}_zero_var_frac": float((rewards.amax(1) == rewards.amin(1)).float().mean())}


# ----------------------------------------------------------------------------- the loop
@dataclass
class RunResult:
    run_dir: Path
    initial: dict[str, float]
    final: dict[str, float]
    steps: int
    train_seconds: float
    plot: Path
    is_main: bool = True  # False in the other processes of a multi-process run (they write nothing)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _restore(checkpoints: Path, **state) -> tuple[Path, dict] | tuple[None, None]:
    """Load the newest readable checkpoint; a corrupt one is skipped with a warning."""
    for candidate in reversed(list_checkpoints(checkpoints)):
        try:
            return candidate, load_checkpoint(candidate, **state)
        except Exception as err:  # truncated file, bad pickle, wrong shapes ...
            _say(f"warning: checkpoint {candidate} is unreadable ({type(err).__name__}: {err}); "
                 f"trying the previous one")
    return None, None


def train(cfg: Config) -> RunResult:
    with StopSignals() as stop:
        return _train(cfg, stop)


def sampling_seed(seed: int, step: int, first_prompt: int) -> int:
    """The RNG seed of the rollouts of one chunk of a step's prompts.

    Seeding per chunk by the chunk's position in the step's batch, not by process, makes
    the samples independent of how the batch is split: a run over W processes draws the
    same rollouts as one process generating the same chunks (generation_batch_size)."""
    return hash((seed, step, first_prompt)) % 2**63


def _train(cfg: Config, stop: StopSignals) -> RunResult:
    procs = Processes.from_env()
    run_dir = Path(cfg.output_dir)
    checkpoints = run_dir / "checkpoints"
    if not cfg.resume and (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"output_dir: {run_dir} already holds a run; pass --resume true to "
                              f"continue it or choose another --output_dir")
    if cfg.prompts_per_step % procs.world_size:
        raise ValueError(f"prompts_per_step: {cfg.prompts_per_step} prompts cannot be split evenly over "
                         f"{procs.world_size} processes")
    procs.barrier()  # every process has checked output_dir before the main one writes to it

    _seed_everything(cfg.seed)
    task = build_task(cfg)
    if not task.test:  # before the model loads: data problems should cost no time
        raise ValueError(f"test_data: task {cfg.task!r} has no held-out prompts to evaluate on")
    bundle = load_model(cfg.model, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                        lora_dropout=cfg.lora_dropout, dtype=cfg.dtype,
                        lora_target_modules=cfg.lora_targets)
    system_prompt = cfg.system_prompt_for(task)
    split_options = dict(system_prompt=system_prompt, use_chat_template=cfg.chat_template,
                         max_prompt_tokens=cfg.max_prompt_tokens)
    train_split = prepare_split(task.train, bundle.tokenizer, **split_options)
    test_split = prepare_split(task.test, bundle.tokenizer, **split_options)
    if (train_split.dropped or test_split.dropped) and procs.is_main:
        _say(f"max_prompt_tokens={cfg.max_prompt_tokens}: dropped {train_split.dropped} train and "
             f"{test_split.dropped} held-out prompts that are longer")
    if not train_split.examples:
        raise ValueError(f"train_data: no usable train prompts for task {cfg.task!r}")
    if not test_split.examples:
        raise ValueError(f"test_data: no held-out prompts for task {cfg.task!r} to evaluate on")
    scorer = Scorer.from_config(task, cfg)
    generate_rollouts = ENGINES[cfg.generation_engine](cfg)
    if procs.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)  # only once model and data loaded: no empty run folders
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        record_environment(run_dir)  # commit, date, machine: reports built from the run state them
        (run_dir / "data.json").write_text(json.dumps({
            "task": task.name, "train_prompts": len(train_split.examples), "test_prompts": len(test_split.examples),
            "dropped_train_prompts": train_split.dropped, "dropped_test_prompts": test_split.dropped,
            "system_prompt": system_prompt, "example_prompt": test_split.prompts[0],
            "processes": procs.world_size}, indent=2) + "\n")
    policy = bundle.model.to(procs.device(cfg.device))  # the bare model: generation, no-grad log-probs, saving
    policy.train()
    # KL reference: with LoRA the base model with the adapter disabled, else a frozen copy.
    reference = None
    if cfg.beta > 0 and not bundle.uses_lora:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    optimizer, scheduler = make_optimizer((p for p in policy.parameters() if p.requires_grad), cfg)
    rule_generator = torch.Generator().manual_seed(cfg.seed + 1)  # the `random` rule's stream
    generators = {"rule": rule_generator}
    sampler = PromptSampler(len(train_split.examples), seed=cfg.seed)  # the same on every process
    metrics = MetricsLog(run_dir / "metrics.jsonl") if procs.is_main else None

    step, train_seconds = 0, 0.0
    resume_from, state = (_restore(checkpoints, model=policy, optimizer=optimizer, scheduler=scheduler,
                                   generators=generators, engine=generate_rollouts, rank=procs.rank)
                          if cfg.resume else (None, None))
    if cfg.resume and resume_from is None and procs.is_main:
        _say(f"resume: no usable checkpoint in {checkpoints}; starting from scratch")
    model, optimizer = procs.prepare(policy, optimizer)  # DDP / FSDP / DeepSpeed under a launcher
    if resume_from is not None:
        step, train_seconds = state["step"], state["train_seconds"]
        sampler.epoch, sampler.position = state["sampler"]["epoch"], state["sampler"]["position"]
        if not state["engine_restored"] and generate_rollouts.state_dict():
            _say(f"resume: {resume_from} holds no generation-engine state for process {procs.rank} (written by "
                 f"fewer processes): the length predictor starts afresh, so rollouts differ from an "
                 f"uninterrupted run")
        if metrics:
            metrics.truncate_after(step)
        initial, latest_eval = _logged_evals(run_dir)
        if procs.is_main:
            _say(f"resumed from {resume_from} at step {step}")
    else:
        if metrics:
            metrics.truncate_after(-1)  # a resume that found no checkpoint starts the log afresh
        initial = latest_eval = evaluate(bundle, task, test_split, cfg, procs)
        if metrics:
            metrics.write({"step": 0, "train_seconds": 0.0, **initial})

    def checkpoint() -> None:
        nonlocal last_checkpoint_time
        weights, optimizer_state = procs.full_state(policy, optimizer)  # gathered when sharded
        engine_states = procs.gather_objects(generate_rollouts.state_dict())  # each process's own
        if procs.is_main:  # whole parameters and optimizer state are the same on every process
            save_checkpoint(checkpoints, step=step, weights=weights, optimizer_state=optimizer_state,
                            scheduler=scheduler, generators=generators, keep=cfg.keep_checkpoints,
                            engine_states=engine_states,
                            trainer_state={"train_seconds": train_seconds, "sampler": sampler.state()})
        procs.barrier()
        last_checkpoint_time = time.time()

    progress = _progress(cfg, step, enabled=procs.is_main)
    last_checkpoint_time = time.time()
    consecutive_skips = 0
    local_prompts = cfg.prompts_per_step // procs.world_size
    chunk = max(1, cfg.generation_batch_size // cfg.rollouts_per_prompt) if cfg.generation_batch_size \
        else local_prompts

    def out_of_time() -> bool:
        return bool(cfg.max_minutes) and train_seconds >= cfg.max_minutes * 60

    while step < cfg.steps and not out_of_time():
        step += 1
        timer = StageTimer()
        batch_indices = procs.block(sampler.take(cfg.prompts_per_step))  # this process's prompts
        examples = [train_split.examples[i] for i in batch_indices]
        prompts = [train_split.prompts[i] for i in batch_indices]

        with timer("generate"):
            parts = []
            with procs.whole_weights(policy):
                for start in range(0, local_prompts, chunk):
                    torch.manual_seed(sampling_seed(cfg.seed, step, procs.rank * local_prompts + start))
                    parts.append(generate_rollouts(policy, bundle.tokenizer, prompts[start:start + chunk],
                                                   cfg.rollouts_per_prompt))
            rollouts = concat_rollouts(parts, bundle.tokenizer.pad_token_id)  # [P, n, Lc]
        with timer("reward"):
            scores = scorer(examples, rollouts)
            rewards = scores["reward"]  # [P, n]
        with timer("select"):
            if cfg.method == "pods":
                keep = select(cfg.rule, rewards, cfg.m, generator=rule_generator)  # [P, m]
            else:  # grpo and grpo-ga train on every generated rollout
                keep = torch.arange(rollouts.group_size).expand(len(examples), -1)
            kept = rollouts.select(keep)
            kept_rewards = rewards.gather(1, keep)  # [P, m]
        with timer("advantages"):
            advantages = algo.group_advantages(kept_rewards, scale_by_std=cfg.scale_rewards)  # [P, m]
            batch = flatten_for_update(kept, advantages)  # [B = P*m, ...]
        if cfg.num_iterations > 1 or cfg.beta > 0:
            with timer("logprobs"):
                options = dict(size=cfg.micro_batch_size, share_prompt=cfg.share_prompt_in_update)
                if cfg.num_iterations > 1:
                    batch["old_logp"] = batch_logprobs(policy, batch, **options)
                if cfg.beta > 0:
                    if reference is None:
                        with policy.disable_adapter():
                            batch["ref_logp"] = batch_logprobs(policy, batch, **options)
                    else:
                        batch["ref_logp"] = batch_logprobs(reference, batch, **options)
        with timer("update"):
            tokens_per_process = procs.sum([float(batch["completion_mask"].sum())])[0] / procs.world_size
            for _ in range(cfg.num_iterations):
                update = update_policy(model, optimizer, scheduler, batch, cfg, procs, tokens_per_process)
        # the slowest process sets the pace (and every process must agree on max_minutes)
        train_seconds += procs.max([timer.total])[0]

        everywhere = {name: procs.gather(t) for name, t in (  # [P_all, ...]: metrics of the whole batch
            ("rewards", rewards), ("kept_rewards", kept_rewards), ("correct", scores["correct"]),
            ("format", scores["format"]), ("unverifiable", scores["unverifiable"].float()),
            ("length", rollouts.completion_mask.sum(-1).float()),
            ("kept_length", kept.completion_mask.sum(-1).float()))}
        decode_steps, failures = procs.sum([rollouts.stats["decode_steps"], scorer.failures])
        record = {"step": step, "train_seconds": train_seconds, "lr": update["lr"],
                  **_group_stats("reward", everywhere["rewards"]),
                  **_group_stats("kept_reward", everywhere["kept_rewards"]),
                  "correct_rate": float(everywhere["correct"].nanmean()),
                  "format_rate": float(everywhere["format"].nanmean()),  # NaN (null) when not scored
                  "unverifiable": int(everywhere["unverifiable"].sum()), "reward_failures": int(failures),
                  "completion_len": float(everywhere["length"].mean()),
                  "kept_completion_len": float(everywhere["kept_length"].mean()),
                  "decode_steps": int(decode_steps),
                  **procs.mean({**update, **{f"time_{k}": v for k, v in timer.seconds.items()}})}
        if procs.world_size > 1:
            record["skipped_step"] = int(record["skipped_step"])
        if procs.world_size > 1 and not procs.sharded:
            record["rank_param_spread"] = procs.parameter_spread(model)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps or out_of_time():
            eval_start = time.perf_counter()
            latest_eval = evaluate(bundle, task, test_split, cfg, procs)
            record.update(latest_eval, time_eval=time.perf_counter() - eval_start)
        if metrics:
            metrics.write(record)
        progress.update(1)
        progress.set_postfix(reward=f"{record['reward_mean']:.2f}",
                             acc=f"{latest_eval['eval_accuracy']:.3f}", refresh=False)

        consecutive_skips = consecutive_skips + 1 if update["skipped_step"] else 0
        if consecutive_skips >= cfg.max_consecutive_skips:
            progress.close()
            good = list_checkpoints(checkpoints)
            raise TrainingStopped(f"stopped at step {step}: {consecutive_skips} consecutive steps had a non-finite "
                                  f"loss or gradient (max_consecutive_skips); last good checkpoint: "
                                  f"{good[-1] if good else 'none'}")
        # a signal may reach one process only: every process stops at the same step
        signum = int(procs.max([float(stop.signum or 0)])[0])
        due_by_time = cfg.checkpoint_minutes and time.time() - last_checkpoint_time >= cfg.checkpoint_minutes * 60
        due_by_time = bool(procs.max([float(bool(due_by_time))])[0])
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or due_by_time or signum:
            checkpoint()
        if signum:
            progress.close()
            raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint "
                                  f"written to {checkpoints}; continue with the same command plus --resume true",
                                  signum=signum)
    progress.close()

    if not (checkpoints / f"step_{step:07d}").is_dir():
        checkpoint()
    result = RunResult(run_dir=run_dir, initial=initial, final=latest_eval, steps=step,
                       train_seconds=train_seconds, plot=run_dir / "accuracy.png", is_main=procs.is_main)
    weights = procs.full_state(policy, optimizer)[0] if procs.sharded else None  # gathered on every process
    if procs.is_main:
        policy.save_pretrained(run_dir / "model", state_dict=weights)
        bundle.tokenizer.save_pretrained(run_dir / "model")
        from podsrl.plot import plot_accuracy

        plot_accuracy([run_dir], result.plot, title=f"{cfg.method} on {cfg.task} ({cfg.model})")
        (run_dir / "summary.json").write_text(json.dumps({
            "steps": step, "train_seconds": round(train_seconds, 2), "initial": initial, "final": latest_eval},
            indent=2) + "\n")
    procs.barrier()
    return result


def _logged_evals(run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """The first and the latest evaluation written to metrics.jsonl (on resume)."""
    from podsrl.metrics import read_metrics

    evals = [{k: v for k, v in r.items() if k.startswith("eval_")}
             for r in read_metrics(run_dir / "metrics.jsonl") if r.get("eval_accuracy") is not None]
    return evals[0], evals[-1]


def _progress(cfg: Config, step: int, enabled: bool = True):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.steps, initial=step, disable=not (cfg.progress and enabled), desc=f"{cfg.method}",
                unit="step", dynamic_ncols=True)

"""The training loop: generate -> reward -> select -> advantages -> update, read top to bottom.

``training_step`` is one step of the pipeline on this process's prompt groups, each stage
timed; ``train`` sets the run up, then steps, logs, evaluates and checkpoints until the
step count or the time budget is reached. The stages live in their own packages
(``rollout``, ``rewards``, ``methods`` / ``algorithms``, ``update``); set-up, run state and
logging in the modules beside this one.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from podsrl.algorithms.advantages import group_advantages
from podsrl.algorithms.select import Groups
from podsrl.config import Config
from podsrl.rewards import RewardError, RewardFn
from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.tasks import Example
from podsrl.tasks.base import PreparedSplit
from podsrl.trainer.early_stop import SaturationStopper
from podsrl.trainer.logging import StageTimer, progress_bar, rollout_rows, step_record
from podsrl.trainer.run import Run, RunResult
from podsrl.trainer.setup import set_up
from podsrl.trainer.state import StopSignals, TrainingStopped, sampling_seed
from podsrl.types import Rollouts, Scores, UpdateBatch
from podsrl.update import batch_logprobs, flatten_for_update, update_policy


@dataclass
class StepOutcome:
    examples: list[Example]  # [P] this process's prompts
    rollouts: Rollouts  # [P, n, Lc]
    scores: Scores  # [P, n]
    keep: torch.Tensor  # [P, m] indices of the kept rollouts into the group axis
    kept: Rollouts  # [P, m, Lc]
    kept_rewards: torch.Tensor  # [P, m]
    update: dict  # loss, grad_norm, clip_fraction, kl, skipped_step, lr


def training_step(run: Run, timer: StageTimer) -> StepOutcome:
    """One step of the pipeline on this process's share of the step's prompts."""
    cfg, method = run.cfg, run.method
    indices = run.procs.block(run.sampler.take(cfg.prompts_per_step))  # this process's prompts
    step_prompts = run.train_split.select(indices)  # [P] examples and their rendered prompts
    n = run.rollout_budget.choose(run.step) if run.rollout_budget is not None else cfg.num_generations
    with timer("generate"):
        rollouts = generate_rollouts(run, step_prompts, n)  # [P, n, Lc]
    with timer("reward"):
        scores = score_on_every_process(run, step_prompts, rollouts)  # [P, n], NaN where skipped
    with timer("select"):
        groups = Groups(scores.reward, rollouts.generated, rollouts.completion_mask.sum(-1))  # [P, n] each
        keep = method.keep(groups, cfg.num_kept, cfg.downsampling_rule, run.generators["rule"])  # [P, m]
        kept, kept_rewards = rollouts.select(keep), scores.reward.gather(1, keep)  # [P, m, Lc], [P, m]
        if kept.generated is not None and not kept.generated.all():
            raise RuntimeError("early stop: selection kept a sample that was never generated (a bug in podsrl)")
    with timer("advantages"):
        advantages = group_advantages(kept_rewards, scale_by_std=cfg.scale_rewards)  # [P, m]
        batch = flatten_for_update(kept, advantages)  # [B = P*m, ...]
    if cfg.num_iterations > 1 or cfg.beta > 0:
        with timer("logprobs"):  # on the kept rollouts only
            add_old_and_reference_logprobs(run, batch)
    with timer("update"):
        tokens_per_process = run.procs.sum([float(batch.completion_mask.sum())])[0] / run.procs.world_size
        for _ in range(cfg.num_iterations):
            update = update_policy(run.model, run.optimizer, run.scheduler, batch, run.update_options, run.procs,
                                   tokens_per_process)
    return StepOutcome(step_prompts.examples, rollouts, scores, keep, kept, kept_rewards, update)


def score_on_every_process(run: Run, split: PreparedSplit, rollouts: Rollouts) -> Scores:
    """The rollouts' scores; a reward failure (the 'raise' policy) on any process stops every
    process here, so none is left waiting for the others in a later collective."""
    failure = None
    try:
        scores = run.scorer(split, rollouts, run.trainer_progress())
    except RewardError as err:
        failure = err
    if run.procs.max([float(failure is not None)])[0]:
        raise failure or RewardError("a reward function failed on another process (its error is in that "
                                     "process's output)")
    return scores


def generate_rollouts(run: Run, split: PreparedSplit, n: int) -> Rollouts:
    """The method's rollouts for each prompt of ``split`` (n of them for pods), in chunks of
    ``generation_batch_size / n`` prompts, each chunk seeded by its position in the step's
    batch (so the split over processes does not change the samples); with
    ``group_early_stop``, saturated groups stop early (``Rollouts.generated`` marks what
    they skipped)."""
    cfg, procs, tokenizer = run.cfg, run.procs, run.bundle.tokenizer
    per_prompt = run.method.generated(n, cfg.num_kept)
    total = len(split.prompts)
    chunk = max(1, cfg.generation_batch_size // per_prompt) if cfg.generation_batch_size else total
    parts = []
    with procs.whole_weights(run.policy):
        for start in range(0, total, chunk):
            part = split.select(list(range(start, min(start + chunk, total))))
            stopper = (SaturationStopper(run.scorer, part, tokenizer, cfg.num_kept, run.reward_bounds,
                                         run.trainer_progress()) if cfg.group_early_stop else None)
            torch.manual_seed(sampling_seed(cfg.seed, run.step, procs.rank * total + start))
            parts.append(run.engine(run.policy, tokenizer, part.prompts, per_prompt, stopper=stopper))
    return Rollouts.concat(parts, tokenizer.pad_token_id)


def add_old_and_reference_logprobs(run: Run, batch: UpdateBatch) -> None:
    """The generating policy's log-probs (reused batches) and the reference policy's (KL)."""
    options = dict(size=run.cfg.micro_batch_size, share_prompt=run.cfg.share_prompt_in_update)
    if run.cfg.num_iterations > 1:
        batch.old_logp = batch_logprobs(run.policy, batch, **options)
    if run.cfg.beta > 0:
        if run.reference is None:  # LoRA: the base model is the policy with its adapter off
            with run.policy.disable_adapter():
                batch.ref_logp = batch_logprobs(run.policy, batch, **options)
        else:
            batch.ref_logp = batch_logprobs(run.reference, batch, **options)


def train(cfg: Config, reward_funcs: Sequence[RewardFn | str] | None = None) -> RunResult:
    """Train with ``cfg``; stops cleanly (with a checkpoint) on SIGINT / SIGTERM.

    ``reward_funcs``: reward functions as Python callables (TRL's signature), replacing the
    task's reward like the config's ``reward_funcs`` names do (not both); weighted by the
    config's ``reward_weights``."""
    with StopSignals() as stop:
        run = set_up(cfg, reward_funcs)
        try:
            return run_steps(run, stop)
        finally:
            run.trackers.finish()  # flushed and closed however the run ends
            if run.lock:
                run.lock.release()


def run_steps(run: Run, stop: StopSignals) -> RunResult:
    """From the start (or the checkpoint) to the last step, logging, evaluating and
    checkpointing on the way."""
    cfg = run.cfg
    initial, latest_eval = run.resume_or_start()
    first_step = run.step
    progress = progress_bar(cfg.max_steps, run.step, cfg.method, enabled=cfg.progress and run.procs.is_main)
    run.last_checkpoint_time, consecutive_skips = time.time(), 0
    while run.step < cfg.max_steps and not run.out_of_time():
        run.step += 1
        timer, step_start = StageTimer(), run.step_state()
        try:
            with run.autocast():
                outcome = training_step(run, timer)
        except RewardError as err:  # the 'raise' policy: stop with the last finished step checkpointed
            progress.close()
            raise run.abandon_step(step_start, err) from None
        run.train_seconds += run.procs.max([timer.total])[0]  # the slowest process sets the pace
        record = step_record(run.procs, run.step, run.train_seconds, outcome.rollouts, outcome.scores,
                             outcome.kept, outcome.kept_rewards, outcome.update, timer.seconds,
                             run.scorer.failures)
        if run.procs.world_size > 1 and not run.procs.sharded:
            record["rank_param_spread"] = run.procs.parameter_spread(run.model)
        if run.rollout_budget is not None:  # what it chose for this step and why; then it learns from the step
            record.update(run.rollout_budget.decision)
            generation = run.procs.max([timer.seconds["generate"] + timer.seconds["reward"]])[0]
            run.rollout_budget.observe(run.procs.gather(outcome.scores.reward), generation,
                                       run.procs.max([timer.total])[0] - generation)
        if (cfg.eval_steps and run.step % cfg.eval_steps == 0) or run.step == cfg.max_steps or run.out_of_time():
            eval_start = time.perf_counter()
            latest_eval = run.evaluate()
            record.update(latest_eval, time_eval=time.perf_counter() - eval_start)
        sampled = cfg.log_rollouts if run.procs.is_main else 0  # the main process's first groups
        run.log(record, rollout_rows(run.step, outcome.examples, outcome.rollouts, outcome.scores,
                                     outcome.keep, sampled))
        progress.update(1)
        progress.set_postfix(reward=f"{record['reward_mean']:.2f}", acc=f"{latest_eval['eval_accuracy']:.3f}",
                             refresh=False)
        consecutive_skips = consecutive_skips + 1 if outcome.update["skipped_step"] else 0
        try:
            checkpoint_or_stop(run, stop, consecutive_skips)
        except TrainingStopped:
            progress.close()
            raise
    progress.close()
    return run.finish(initial, latest_eval, first_step)


def checkpoint_or_stop(run: Run, stop: StopSignals, consecutive_skips: int) -> None:
    """Checkpoint when due (every save_steps steps, every checkpoint_minutes, or on a
    signal) and raise TrainingStopped on a signal or too many non-finite steps in a row."""
    cfg, procs = run.cfg, run.procs
    if consecutive_skips >= cfg.max_consecutive_skips:
        good = list_checkpoints(run.checkpoints)
        raise TrainingStopped(f"stopped at step {run.step}: {consecutive_skips} consecutive steps had a non-finite "
                              f"loss or gradient (max_consecutive_skips); last good checkpoint: "
                              f"{good[-1] if good else 'none'}")
    signum = int(procs.max([float(stop.signum or 0)])[0])  # a signal may reach one process only
    due_by_time = cfg.checkpoint_minutes and time.time() - run.last_checkpoint_time >= cfg.checkpoint_minutes * 60
    due_by_time = bool(procs.max([float(bool(due_by_time))])[0])  # every process must agree
    if (cfg.save_steps and run.step % cfg.save_steps == 0) or due_by_time or signum:
        run.checkpoint()
    if signum:
        raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {run.step}; checkpoint "
                              f"written to {run.checkpoints}; continue with the same command plus --resume true",
                              signum=signum)

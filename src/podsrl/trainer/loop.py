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
from typing import Sequence

import torch

from podsrl.algorithms.select import Groups
from podsrl.config import Config
from podsrl.contracts import UserCodeError
from podsrl.interrupts import StopNow
from podsrl.prompt_selection import add_selector_record, informative_first, is_constant
from podsrl.rewards import RewardError, RewardFn
from podsrl.tasks.base import PreparedSplit
from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.trainer.components import Components, StepOutcome
from podsrl.trainer.early_stop import SaturationStopper
from podsrl.trainer.logging import StageTimer, progress_bar, rollout_rows, step_record
from podsrl.trainer.run import Run, RunResult
from podsrl.trainer.setup import set_up
from podsrl.trainer.state import StopSignals, TrainingStopped, sampling_seed
from podsrl.types import Rollouts, Scores, UpdateBatch
from podsrl.update import batch_logprobs, flatten_for_update, update_policy


def training_step(run: Run, timer: StageTimer) -> StepOutcome:
    """One step of the pipeline on this process's share of the step's prompts."""
    parts, cfg = run.components, run.components.cfg
    n = parts.group_size.choose(run.state.step)
    # [P] examples and their rendered prompts, rollouts [P, n, Lc], scores [P, n] (NaN where skipped)
    step_prompts, rollouts, scores, prompt_record = generate_and_score(run, timer, n)
    with timer("select"):
        groups = Groups(scores.reward, rollouts.generated, rollouts.completion_mask.sum(-1))  # [P, n] each
        keep = parts.method.keep(groups, cfg.num_kept, cfg.downsampling_rule, run.state.generators["rule"])  # [P, m]
        kept, kept_rewards = rollouts.select(keep), scores.reward.gather(1, keep)  # [P, m, Lc], [P, m]
    with timer("advantages"):
        advantages = parts.advantage_estimator(kept_rewards, cfg.scale_rewards)  # [P, m]
        batch = flatten_for_update(kept, advantages)  # [B = P*m, ...]
    if cfg.num_iterations > 1 or cfg.beta > 0:
        with timer("logprobs"):  # on the kept rollouts only
            add_old_and_reference_logprobs(parts, batch)
    with timer("update"):
        tokens_per_process = parts.procs.sum([float(batch.completion_mask.sum())])[0] / parts.procs.world_size
        for _ in range(cfg.num_iterations):
            update = update_policy(parts.model, parts.optimizer, parts.scheduler, batch, parts.update_options,
                                   parts.procs, tokens_per_process)
    return StepOutcome(step_prompts.examples, rollouts, scores, keep, kept, kept_rewards, update, prompt_record)


def generate_and_score(run: Run, timer: StageTimer, n: int) -> tuple[PreparedSplit, Rollouts, Scores, dict]:
    """This process's prompt groups of the step, generated and scored, and the prompt
    selector's numbers. The selector picks the prompts and learns from the outcomes of every
    process; one that refills (dynamic sampling) gets another round while any process has
    fewer informative groups than its share, up to its cap, and each process then keeps its
    share, informative groups first (constant ones fill the batch only at the cap)."""
    parts, cfg, selector, step = run.components, run.components.cfg, run.state.prompt_selector, run.state.step
    local_indices, rollout_rounds, score_rounds, informative = [], [], [], 0
    for round_index in range(selector.refill_rounds + 1):
        indices = selector.take(cfg.prompts_per_step, step, n)  # the same list on every process
        mine = parts.procs.block(indices)  # this process's share
        local_indices += mine
        split = parts.train_split.select(mine)
        with timer("generate"):
            rollouts = generate_rollouts(run, split, n, round_index)  # [P, n, Lc]
        with timer("reward"):
            scores = score_on_every_process(run, split, rollouts)  # [P, n], NaN where skipped
        if selector.learns:  # the gather is a collective: only for a selector that uses it
            correct = scores.correct.masked_fill(~rollouts.generated_mask, float("nan"))  # [P, n]
            selector.observe(step, indices, parts.procs.gather(correct))  # [P_all, n]: every process's outcomes
        rollout_rounds.append(rollouts)
        score_rounds.append(scores)
        if not selector.refill_rounds:
            return split, rollouts, scores, selector.record()
        informative += int((~is_constant(scores.reward)).sum())  # this process's, over the rounds so far
        if not parts.procs.max([float(informative < len(mine))])[0]:
            break
    rollouts = Rollouts.concat(rollout_rounds, parts.bundle.tokenizer.pad_token_id)  # [P * rounds, n, Lc]
    scores = Scores.concat(score_rounds)
    constant = is_constant(scores.reward)  # [P * rounds]
    keep = informative_first(constant, len(mine))  # this process's share
    generated, constant_groups, set_aside = parts.procs.sum(
        [float(len(constant)), float(constant.sum()), float(constant.sum() - constant[keep].sum())])
    record = {"prompt_rounds": len(score_rounds), "prompts_generated": int(generated),
              "generated_constant_frac": constant_groups / generated, "constant_groups_set_aside": int(set_aside)}
    return (parts.train_split.select([local_indices[i] for i in keep]), rollouts.groups(keep), scores.groups(keep),
            record)


def score_on_every_process(run: Run, split: PreparedSplit, rollouts: Rollouts) -> Scores:
    """The rollouts' scores; a reward failure (the 'raise' policy) on any process stops every
    process here, so none is left waiting for the others in a later collective."""
    failure = None
    try:
        scores = run.components.scorer(split, rollouts, run.trainer_progress())
    except RewardError as err:
        failure = err
    if run.components.procs.max([float(failure is not None)])[0]:
        raise failure or RewardError("a reward function failed on another process (its error is in that "
                                     "process's output)")
    return scores


def generate_rollouts(run: Run, split: PreparedSplit, n: int, round_index: int = 0) -> Rollouts:
    """The method's rollouts for each prompt of ``split`` (n of them for pods), in chunks of
    ``generation_batch_size / n`` prompts, each chunk seeded by its position in the step's
    batch (so the split over processes does not change the samples) and by the generation
    round (dynamic sampling's refills draw afresh); with ``group_early_stop``, saturated
    groups stop early (``Rollouts.generated`` marks what they skipped)."""
    parts = run.components
    cfg, procs, tokenizer = parts.cfg, parts.procs, parts.bundle.tokenizer
    per_prompt = parts.method.generated_per_prompt(n, cfg.num_kept)
    total = len(split.prompts)
    chunk = max(1, cfg.generation_batch_size // per_prompt) if cfg.generation_batch_size else total
    chunks = []
    with procs.whole_weights(parts.policy):
        for start in range(0, total, chunk):
            part = split.select(list(range(start, min(start + chunk, total))))
            stopper = (SaturationStopper(parts.scorer, part, tokenizer, cfg.num_kept, parts.reward_bounds,
                                         run.trainer_progress()) if cfg.group_early_stop else None)
            first_prompt = round_index * cfg.prompts_per_step + procs.rank * total + start  # in the step's rounds
            torch.manual_seed(sampling_seed(cfg.seed, run.state.step, first_prompt))
            chunks.append(parts.engine(parts.policy, tokenizer, part.prompts, per_prompt, stopper=stopper))
    return Rollouts.concat(chunks, tokenizer.pad_token_id)


def add_old_and_reference_logprobs(parts: Components, batch: UpdateBatch) -> None:
    """The generating policy's log-probs (reused batches) and the reference policy's (KL)."""
    cfg = parts.cfg
    options = dict(size=cfg.micro_batch_size, share_prompt=cfg.share_prompt_in_update)
    if cfg.num_iterations > 1:
        batch.old_logp = batch_logprobs(parts.policy, batch, **options)
    if cfg.beta > 0:
        if parts.reference is None:  # LoRA: the base model is the policy with its adapter off
            with parts.policy.disable_adapter():
                batch.ref_logp = batch_logprobs(parts.policy, batch, **options)
        else:
            batch.ref_logp = batch_logprobs(parts.reference, batch, **options)


def train(cfg: Config, reward_funcs: Sequence[RewardFn | str] | None = None) -> RunResult:
    """Train with ``cfg``; stops cleanly (with a checkpoint) on SIGINT / SIGTERM.

    ``reward_funcs``: reward functions as Python callables (TRL's signature), replacing the
    task's reward like the config's ``reward_funcs`` names do (not both); weighted by the
    config's ``reward_weights``. A run that finished but learned nothing (no reward applied,
    or every step skipped) returns with ``RunResult.failure`` saying why (``podsrl train``
    exits 1 then)."""
    with StopSignals() as stop:
        try:
            run = set_up(cfg, reward_funcs)
        except StopNow as interrupted:
            raise TrainingStopped(f"stopped by {interrupted} while setting the run up; nothing was trained",
                                  signum=interrupted.signum) from None
        try:
            return run_steps(run, stop)
        except StopNow as interrupted:  # outside a step: evaluating, logging, writing a checkpoint
            good = list_checkpoints(run.components.checkpoints)
            raise TrainingStopped(f"stopped by {interrupted} after step {run.state.step}; last checkpoint: "
                                  f"{good[-1] if good else 'none'}; continue with the same command plus --resume true",
                                  signum=interrupted.signum) from None
        finally:
            run.release()


def run_steps(run: Run, stop: StopSignals) -> RunResult:
    """From the start (or the checkpoint) to the last step: each step's pipeline, then its
    hooks, evaluation when due, its log line, and a checkpoint or stop when due."""
    parts, state, cadence = run.components, run.state, run.cadence
    initial, latest_eval = run.resume_or_start()
    first_step, consecutive_skips, trained = state.step, 0, 0  # trained: steps whose update was not skipped
    cadence.last_checkpoint_time = time.time()
    with progress_bar(cadence.max_steps, state.step, parts.cfg.method,
                      enabled=parts.cfg.progress and parts.procs.is_main) as progress:
        while cadence.more_steps(state):
            state.step += 1
            outcome, timer = timed_step(run)
            record = step_record(parts.procs, state.step, state.train_seconds, outcome.rollouts, outcome.scores,
                                 outcome.kept, outcome.kept_rewards, outcome.update, timer.seconds,
                                 parts.scorer.failures)
            add_selector_record(outcome.prompt_record, record)
            for hook in parts.hooks:
                hook.after_step(parts, outcome, timer, record)
            if cadence.evaluation_due(state):
                eval_start = time.perf_counter()
                latest_eval = run.evaluate()
                record.update(latest_eval, time_eval=time.perf_counter() - eval_start)
            sampled = parts.cfg.log_rollouts if parts.procs.is_main else 0  # the main process's first groups
            run.log(record, rollout_rows(state.step, outcome.examples, outcome.rollouts, outcome.scores,
                                         outcome.keep, sampled))
            progress.update(1)
            progress.set_postfix(reward=f"{record['reward_mean']:.2f}", acc=f"{latest_eval['eval_accuracy']:.3f}",
                                 refresh=False)
            consecutive_skips = consecutive_skips + 1 if outcome.update.skipped_step else 0
            trained += not outcome.update.skipped_step
            checkpoint_or_stop(run, stop, consecutive_skips)
    return run.finish(initial, latest_eval, first_step, trained)


def timed_step(run: Run) -> tuple[StepOutcome, StageTimer]:
    """The step's pipeline with each stage timed; the run's training time advances by the
    slowest process's. A reward failure (the 'raise' policy), a user component's failure or a
    stop that could not wait for the step abandons it: the run stops with the last finished
    step checkpointed (:meth:`Run.abandon_step`)."""
    timer, step_start = StageTimer(), run.step_start()
    try:
        with run.autocast():
            outcome = training_step(run, timer)
    except RewardError as err:
        raise run.abandon_step(step_start, err, "fix the reward function, then continue with --resume true") from None
    except UserCodeError as err:
        raise run.abandon_step(step_start, err, "fix it, then continue with --resume true",
                               update_began="update" in timer.seconds) from None
    except StopNow as stop:
        raise run.abandon_step(step_start, stop, "continue with the same command plus --resume true",
                               update_began="update" in timer.seconds) from None
    run.state.train_seconds += run.components.procs.max([timer.total])[0]  # the slowest process sets the pace
    return outcome, timer


def checkpoint_or_stop(run: Run, stop: StopSignals, consecutive_skips: int) -> None:
    """Checkpoint when due (every save_steps steps, every checkpoint_minutes, or on a
    signal) and raise TrainingStopped on a signal or too many non-finite steps in a row."""
    parts, state, cadence = run.components, run.state, run.cadence
    cfg, procs = parts.cfg, parts.procs
    if consecutive_skips >= cfg.max_consecutive_skips:
        good = list_checkpoints(parts.checkpoints)
        raise TrainingStopped(f"stopped at step {state.step}: {consecutive_skips} consecutive steps had a "
                              f"non-finite loss or gradient (max_consecutive_skips); last good checkpoint: "
                              f"{good[-1] if good else 'none'}")
    signum = int(procs.max([float(stop.signum or 0)])[0])  # a signal may reach one process only
    due_by_time = bool(procs.max([float(cadence.checkpoint_due_by_time())])[0])  # every process must agree
    if cadence.checkpoint_due_by_steps(state) or due_by_time or signum:
        run.checkpoint()
    if signum:
        raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {state.step}; checkpoint "
                              f"written to {parts.checkpoints}; continue with the same command plus --resume true",
                              signum=signum)

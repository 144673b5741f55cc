"""The training loop: generate -> reward -> select -> advantages -> update, read top to bottom.

``training_step`` is one step of the pipeline on this process's prompt groups, each stage
timed; ``run_steps`` steps, logs, evaluates and checkpoints until the step count or the time
budget is reached. The stages arrive configured (:class:`~podsrl.trainer.stages.StepStages`,
bound to the config at set-up), so nothing here reads the config.
"""

from __future__ import annotations

import signal
import time

from podsrl.algorithms.select import Groups
from podsrl.contracts import UserCodeError
from podsrl.interrupts import StopNow
from podsrl.rewards import RewardError
from podsrl.trainer.run import Run, RunResult
from podsrl.trainer.stages import StepOutcome, StepStages
from podsrl.trainer.state import StopSignals, TrainingStopped
from podsrl.trainer.timer import StageTimer
from podsrl.update import flatten_for_update


def training_step(stages: StepStages, step: int, timer: StageTimer) -> StepOutcome:
    """One step of the pipeline on this process's share of the step's prompts."""
    n = stages.group_size.choose(step)
    groups = stages.prompts.scored_groups(step, n, timer)  # [P] prompts, rollouts [P, n, Lc], scores [P, n]
    rollouts, rewards = groups.rollouts, groups.scores.reward
    with timer("select"):
        keep = stages.select(Groups(rewards, rollouts.generated, rollouts.completion_mask.sum(-1)))  # [P, m]
        kept, kept_rewards = rollouts.kept(keep), rewards.gather(1, keep)  # [P, m, Lc], [P, m]
    with timer("advantages"):
        advantages = stages.advantages(kept_rewards)  # [P, m]
        batch = flatten_for_update(kept, advantages)  # [B = P*m, ...]
    if stages.logprobs:
        with timer("logprobs"):  # on the kept rollouts only
            stages.logprobs(batch)
    with timer("update"):
        update = stages.update(batch)
    return StepOutcome(groups.split.examples, rollouts, groups.scores, keep, kept, kept_rewards, advantages, update,
                       groups.record)


def run_steps(run: Run, stop: StopSignals) -> RunResult:
    """From the start (or the checkpoint) to the last step: each step's pipeline, then its
    record (hooks included), evaluation when due, its log line, and a checkpoint or stop when due."""
    state, cadence = run.state, run.cadence
    stop_before_steps(run, stop, "during set-up")  # a Ctrl-C while the model and data loaded: no evaluation
    initial, latest_eval = run.resume_or_start()
    stop_before_steps(run, stop)
    stop.setting_up = False
    first_step, consecutive_skips = state.step, 0
    trained, informative = 0, 0  # steps whose update was not skipped; steps with a non-zero advantage here
    cadence.last_checkpoint_time = time.time()
    with run.progress_bar() as progress:
        while cadence.more_steps(state):
            state.step += 1
            outcome, timer = step_or_stop(run)
            record = run.step_record(outcome, timer)
            if cadence.evaluation_due(state):
                latest_eval = evaluate_or_stop(run, stop, record, outcome)
            run.log_step(record, outcome)
            progress.update(1)
            progress.set_postfix(reward=f"{record['reward_mean']:.2f}", acc=f"{latest_eval['eval_accuracy']:.3f}",
                                 refresh=False)
            consecutive_skips = consecutive_skips + 1 if outcome.update.skipped_step else 0
            trained += not outcome.update.skipped_step
            informative += bool(outcome.advantages.any())
            checkpoint_or_stop(run, stop, consecutive_skips)
    return run.finish(initial, latest_eval, first_step, trained, informative)


def step_or_stop(run: Run) -> tuple[StepOutcome, StageTimer]:
    """The step's pipeline, each stage timed; the run's training time advances by the slowest
    process's. A reward failure (the 'raise' policy), a user component's failure or a stop
    that could not wait for the step abandons it and stops the run, with the last finished
    step checkpointed (:meth:`Run.abandon_step`)."""
    timer, before = StageTimer(), run.snapshot_before_step()
    try:
        with run.autocast():
            outcome = training_step(run.stages, run.state.step, timer)
    except RewardError as err:
        raise run.abandon_step(before, err, "fix the reward function") from None
    except UserCodeError as err:
        raise run.abandon_step(before, err, "fix it",
                               update_began="update" in timer.seconds) from None
    except StopNow as stop:
        raise run.abandon_step(before, stop, "",
                               update_began="update" in timer.seconds) from None
    run.state.train_seconds += run.procs.max([timer.total])[0]  # the slowest process sets the pace
    return outcome, timer


def stop_before_steps(run: Run, stop: StopSignals, where: str = "") -> None:
    """A stop asked for while the run was set up (``where``: its files are then as a stopped
    run leaves them, a resumed run's as they were) or evaluated its start: no step is begun
    (every process agrees: a signal may reach one only)."""
    signum = int(run.procs.max([float(stop.signum or 0)])[0])
    if signum:
        raise TrainingStopped(f"stopped by {signal.Signals(signum).name} {where or f'before step {run.state.step + 1}'}"
                              f"; {run.stopped_here()}", signum=signum)


def evaluate_or_stop(run: Run, stop: StopSignals, record: dict, outcome: StepOutcome) -> dict[str, float]:
    """The evaluation due after this step, added to its ``record``. A stop does not wait for it
    (an evaluation of a large model can outlast a scheduler's grace period between SIGTERM and
    SIGKILL): asked for before it, the evaluation is not begun; asked for during it, it gets the
    grace, then is cut short (:meth:`Run.evaluate`). Either way the step is checkpointed with
    its record held back and the resumed run evaluates it first, so its metrics equal an
    uninterrupted run's (:meth:`Run.hold_back_evaluation`). A multi-process run waits for the
    evaluation: a signal may reach one process only, and a checkpoint needs every process."""
    single = run.procs.world_size == 1
    if single and stop.signum:
        raise run.hold_back_evaluation(record, outcome, stop.signum)
    try:
        return run.evaluate_into(record)
    except StopNow as interrupted:
        if not (interrupted.waited and single):  # a second signal: stop at once, no checkpoint
            raise
        raise run.hold_back_evaluation(record, outcome, interrupted.signum) from None


def checkpoint_or_stop(run: Run, stop: StopSignals, consecutive_skips: int) -> None:
    """Checkpoint when due (every save_steps steps, every checkpoint_minutes, or on a
    signal) and raise TrainingStopped on a signal or too many non-finite steps in a row."""
    state, cadence, procs = run.state, run.cadence, run.procs
    if consecutive_skips >= cadence.max_consecutive_skips:
        raise TrainingStopped(f"stopped at step {state.step}: {consecutive_skips} consecutive steps had a "
                              f"non-finite loss or gradient (max_consecutive_skips); last good checkpoint: "
                              f"{run.last_checkpoint()}")
    signum = int(procs.max([float(stop.signum or 0)])[0])  # a signal may reach one process only
    due_by_time = bool(procs.max([float(cadence.checkpoint_due_by_time())])[0])  # every process must agree
    if cadence.checkpoint_due_by_steps(state) or due_by_time or signum:
        run.checkpoint()
    if signum:
        raise TrainingStopped(f"stopped by {signal.Signals(signum).name} after step {state.step}; checkpoint "
                              f"written to {run.checkpoints}; continue with the same command plus --resume true",
                              signum=signum)

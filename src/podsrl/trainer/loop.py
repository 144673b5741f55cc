"""The training loop: generate -> reward -> select -> advantages -> update, read top to bottom.

``training_step`` is one step of the pipeline on this process's prompt groups, each stage
timed; ``run_steps`` steps, logs, evaluates and checkpoints until the step count or the time
budget is reached, asking :class:`~podsrl.trainer.stops.Stops` at each point where a stop may
land. The stages arrive configured (:class:`~podsrl.trainer.stages.StepStages`, bound to the
config at set-up), so nothing here reads the config.
"""

from __future__ import annotations

from podsrl.algorithms.select import Groups
from podsrl.trainer.run import Run, RunResult
from podsrl.trainer.stages import StepOutcome, StepStages
from podsrl.trainer.stops import Stops
from podsrl.trainer.timer import StageTimer
from podsrl.update import flatten_for_update


def training_step(stages: StepStages, step: int, timer: StageTimer) -> StepOutcome:
    """One step of the pipeline on this process's share of the step's prompts."""
    n = stages.group_size.choose(step)
    groups = stages.prompts.scored_groups(step, n, timer)  # [P] prompts, rollouts [P, n, Lc], scores [P, n]
    rollouts, rewards = groups.rollouts, groups.scores.reward
    with timer("select"):
        kept_indices = stages.select(Groups(rewards, rollouts.generated,
                                            rollouts.completion_mask.sum(-1)))  # [P, m]
        # [P, m, Lc], [P, m]
        kept, kept_rewards = rollouts.kept(kept_indices), rewards.gather(1, kept_indices)
    with timer("advantages"):
        advantages = stages.advantages(kept_rewards)  # [P, m]
        batch = flatten_for_update(kept, advantages)  # [B = P*m, ...]
    if stages.logprobs:
        with timer("logprobs"):  # on the kept rollouts only
            stages.logprobs(batch)
    with timer("update"):
        update = stages.update(batch)
    return StepOutcome(groups.split.examples, rollouts, groups.scores, kept_indices, kept, kept_rewards,
                       advantages, update, groups.record)


def run_steps(run: Run, stops: Stops) -> RunResult:
    """From the start (or the checkpoint) to the last step: each step's pipeline, then its
    record (hooks included), evaluation when due, its log line, a checkpoint when due (or on a
    signal), and the stops: giving up, or a signal. The evaluation, the log and the checkpoints
    are the run's jobs (:mod:`podsrl.trainer.jobs`)."""
    state, limits, evaluation, log, checkpoints = (run.state, run.limits, run.evaluation, run.log,
                                                   run.checkpoints)
    stops.before_steps("during set-up")  # a Ctrl-C while the model and data loaded: no evaluation
    initial, latest_eval = run.resume_or_start()
    stops.first_step_begins()
    first_step = state.step
    trained, informative = 0, 0  # steps whose update was not skipped; steps with a non-zero advantage here
    checkpoints.restart_clock()
    with log.progress_bar(limits.options.max_steps) as progress:
        while limits.more_steps(state):
            state.step += 1
            with stops.guard_step() as timer:  # a failing step is abandoned
                outcome = training_step(run.stages, state.step, timer)
            record = log.step_record(outcome, timer)
            if evaluation.due():
                with stops.guard_evaluation(record, outcome):  # a stop holds the record back
                    latest_eval = evaluation.into(record)
            log.write_step(record, outcome)
            progress.update(1)
            progress.set_postfix(reward=f"{record['reward_mean']:.2f}",
                                 acc=f"{latest_eval['eval_accuracy']:.3f}", refresh=False)
            trained += not outcome.update.skipped_step
            informative += bool(outcome.advantages.any())
            stops.give_up_after(outcome)  # e.g. too many non-finite steps in a row
            signum = stops.agreed_signal()
            if signum or checkpoints.due():
                checkpoints.write()
            stops.stop_on(signum)
    return run.finish(initial, latest_eval, first_step, trained, informative)

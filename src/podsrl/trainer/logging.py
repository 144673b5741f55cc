"""What each step logs: the step record (what shows whether
down-sampling works: reward mean and spread before and after selection, zero-variance
groups, completion lengths, seconds per stage), a sample of its rollouts and the progress
bar. The metrics.jsonl / rollouts.jsonl files are :mod:`podsrl.metrics`, the trackers
:mod:`podsrl.tracking`; what is logged where (:class:`LogOptions`) is declared here only, and
the config composes it."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from podsrl.algorithms.group_stats import group_stats
from podsrl.distributed import Processes
from podsrl.metrics import read_metrics
from podsrl.options import NON_NEGATIVE, option
from podsrl.tracking import Trackers, tracker_names
from podsrl.trainer.stages import StepOutcome
from podsrl.types import Rollouts


@dataclass(frozen=True)
class LogOptions:
    """What the run logs besides metrics.jsonl, and where (the config's fields of these names)."""

    progress: bool = option(True, "Show a progress bar.")
    report_to: str = option(
        "none", "Experiment trackers that also get every metrics record (its numbers, at its step), the "
                "config and the rollout samples, as TRL's report_to: 'none', 'tensorboard', 'wandb', "
                "'trackio', a comma-separated list, or 'all' (every one installed). TensorBoard and wandb "
                "write under output_dir/tracking/ (wandb offline unless it finds an API key or WANDB_MODE "
                "says otherwise), trackio to its own store; see docs/tracking.md.")
    log_rollouts: int = option(
        1, "Prompt groups per step whose rollouts (prompt, completion, reward, correct, kept) go to "
           "rollouts.jsonl and, with report_to, to a table (0 = none). Sampled from the main process's "
           "groups: at most prompts_per_step / processes.", NON_NEGATIVE)

    def progress_bar(self, total: int, step: int, desc: str, is_main: bool):
        """The run's progress bar, shown on the main process when ``progress`` is on."""
        return tqdm(total=total, initial=step, disable=not (self.progress and is_main), desc=desc,
                    unit="step", dynamic_ncols=True)

    def rollout_groups(self, is_main: bool) -> int:
        """Prompt groups per step whose rollouts are logged: ``log_rollouts`` on the main process."""
        return self.log_rollouts if is_main else 0

    def trackers(self, run_dir: Path, is_main: bool) -> Trackers:
        """The ``report_to`` trackers, on the main process only, writing under run_dir/tracking."""
        return Trackers(tracker_names(self.report_to) if is_main else [], run_dir / "tracking",
                        run_name=str(run_dir))


def say(message: str) -> None:
    """A message for the user, on stderr (stdout carries the results)."""
    print(message, file=sys.stderr, flush=True)


def step_record(procs: Processes, step: int, train_seconds: float, outcome: StepOutcome,
                seconds: dict[str, float], reward_failures: int) -> dict:
    """One metrics.jsonl record, from tensors gathered over every process's prompt groups."""
    rollouts, scores, kept, update = outcome.rollouts, outcome.scores, outcome.kept, outcome.update
    everywhere = {name: procs.gather(t) for name, t in (  # [P_all, ...]: the whole batch
        ("rewards", scores.reward), ("kept_rewards", outcome.kept_rewards), ("correct", scores.correct),
        ("format", scores.format), ("unverifiable", scores.unverifiable.float()),
        ("length",
         rollouts.completion_mask.sum(-1).float().masked_fill(~rollouts.generated_mask, float("nan"))),
        ("kept_length", kept.completion_mask.sum(-1).float()),
        ("generated", rollouts.generated_mask.float()))}
    decode_steps, failures = procs.sum([rollouts.stats["decode_steps"], reward_failures])
    record = {"step": step, "train_seconds": train_seconds, "lr": update.lr,
              **group_stats("reward", everywhere["rewards"]),
              **group_stats("kept_reward", everywhere["kept_rewards"]),
              "correct_rate": float(everywhere["correct"].nanmean()),
              "format_rate": float(everywhere["format"].nanmean()),  # NaN (null) when not scored
              "unverifiable": int(everywhere["unverifiable"].sum()), "reward_failures": int(failures),
              "completion_len": float(everywhere["length"].nanmean()),
              "kept_completion_len": float(everywhere["kept_length"].mean()),
              "decode_steps": int(decode_steps),
              **procs.mean({**update.as_record(), **{f"time_{k}": v for k, v in seconds.items()}})}
    if rollouts.generated is not None:  # early stop: how much generation it saved
        generated = everywhere["generated"]  # [P_all, n]
        record.update(rollouts_generated=int(generated.sum()),
                      groups_stopped_early=float((generated < 1).any(dim=1).float().mean()))
    if "slot_steps" in rollouts.stats:  # the slots engine: the share of its slots left without a sample
        slot_steps, live = procs.sum([rollouts.stats["slot_steps"], rollouts.stats["live_slot_steps"]])
        record["idle_slot_frac"] = 1.0 - live / slot_steps if slot_steps else 0.0
    if "compile_seconds" in rollouts.stats:  # the decode step's compile or CUDA graphs, inside time_generate
        record.update(procs.mean({"generate_compile_seconds": rollouts.stats["compile_seconds"]}))
    if kept.token_versions is not None:  # partial rollouts: how stale the trained tokens are
        record.update(staleness_record(procs, step, kept))
    if procs.world_size > 1:
        record["skipped_step"] = int(record["skipped_step"])
    return record


def staleness_record(procs: Processes, step: int, kept: Rollouts) -> dict:
    """Over the trained tokens of every process: the share drawn by an earlier policy, and their
    staleness (updates between the policy that drew a token and the one it trains), mean and max."""
    on = kept.completion_mask.bool()  # [P, m, Lc]
    staleness = (step - kept.token_versions)[on].float()  # [T]
    tokens, stale, total, largest = procs.sum([float(staleness.numel()), float((staleness > 0).sum()),
                                               float(staleness.sum())]) + procs.max(
        [float(staleness.max()) if staleness.numel() else 0.0])
    return {"off_policy_token_frac": stale / tokens if tokens else 0.0,
            "staleness_mean": total / tokens if tokens else 0.0, "staleness_max": int(largest)}


def rollout_rows(step: int, outcome: StepOutcome, groups: int) -> list[dict]:
    """One record per rollout of the first ``groups`` prompt groups: what the model was asked
    (the prompt before templating, the gold answer), what it wrote, how it scored, and
    whether selection kept it for the update (``outcome.kept_indices`` [P, m] indexes the group axis)."""
    examples, rollouts, scores = outcome.examples, outcome.rollouts, outcome.scores
    # [P, n]
    kept = torch.zeros(scores.reward.shape, dtype=torch.bool).scatter_(1, outcome.kept_indices, True)
    generated = rollouts.generated_mask
    rows = []
    for group in range(min(groups, len(examples))):
        for index, completion in enumerate(rollouts.texts[group]):
            if not generated[group, index]:  # skipped by early stop: nothing to show
                continue
            correct = float(scores.correct[group, index])
            rows.append({"step": step, "group": group, "index": index, "prompt": examples[group].prompt,
                         "answer": examples[group].answer, "completion": completion,
                         "reward": float(scores.reward[group, index]),
                         "correct": None if math.isnan(correct) else correct,  # None: not verifiable
                         "kept": bool(kept[group, index])})
    return rows


def logged_evals(path: Path) -> tuple[dict[str, float], dict[str, float]]:
    """The first and the latest evaluation written to a metrics.jsonl (on resume)."""
    evals = [{k: v for k, v in r.items() if k.startswith("eval_")}
             for r in read_metrics(path) if r.get("eval_accuracy") is not None]
    return evals[0], evals[-1]

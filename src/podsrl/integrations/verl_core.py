"""The parts of PODS-in-verl that need no verl: choosing the kept rows of a sampled batch and
verl's batch arithmetic. :mod:`podsrl.integrations.verl` wires them into verl's replay buffer.

verl's v1 trainer stores each trajectory under the key ``{uid}_{session_id}_{index}``
(``verl/trainer/ppo/v1/replay_buffer.py``): ``uid`` is the prompt, ``session_id`` one of its
``rollout.n`` rollouts, ``index`` the outputs of a multi-output session (0 for ordinary
rollouts). A session is a rollout: selection keeps or drops whole sessions, judged on the
reward of their final output (the highest index), as verl's multi-trajectory advantage reads
a session's outcome.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from podsrl.algorithms.group_stats import group_stats
from podsrl.algorithms.select import RULES, Groups, select


class VerlConfigError(ValueError):
    """A verl setting PODS cannot run with (one line: the fields, the numbers, what to do)."""


def split_key(key: str) -> tuple[str, int, int]:
    """``{uid}_{session_id}_{index}`` -> (uid, session_id, index)."""
    uid, session, index = key.rsplit("_", 2)
    return uid, int(session), int(index)


@dataclass
class RowSelection:
    kept_keys: list[str]  # every output of each kept session, in the batch's order
    dropped_keys: list[str]  # every output of each dropped session
    metrics: dict[str, float]  # the selection statistics, podsrl's names under 'pods/'


def select_sessions(keys: list[str], scores: list[float], num_kept: int, rule: str,
                    generator: torch.Generator | None = None) -> RowSelection:
    """Keep ``num_kept`` sessions of each prompt by ``rule`` on the final outputs' scores.

    ``keys`` are one sampled batch's trajectory keys and ``scores`` their rewards (verl's
    ``rm_scores`` summed over tokens). A prompt normally has ``rollout.n`` sessions; one whose
    failed sessions verl left out has fewer, and keeps ``min(num_kept, its sessions)`` (verl
    pads the batch for the rows missing). Groups of one size are selected together, in order
    of first appearance."""
    sessions: dict[str, dict[int, tuple[int, float]]] = {}  # uid -> session -> (final index, its score)
    for key, score in zip(keys, scores, strict=True):
        uid, session, index = split_key(key)
        final = sessions.setdefault(uid, {}).get(session)
        if final is None or index > final[0]:
            sessions[uid][session] = (index, float(score))
    ids = {uid: sorted(group) for uid, group in sessions.items()}  # session ids per prompt
    n = max(len(group) for group in ids.values())
    if not 2 <= num_kept <= n:
        raise VerlConfigError(f"sampler_kwargs.num_kept: must be between 2 and rollout.n = {n}, got "
                              f"{num_kept}")
    generated = torch.full((len(ids), n), float("nan"))  # [P, n] NaN where a session is missing
    kept_rewards = torch.full((len(ids), num_kept), float("nan"))  # [P, m]
    kept: set[tuple[str, int]] = set()
    for size in sorted({len(group) for group in ids.values()}):
        rows = [i for i, group in enumerate(ids.values()) if len(group) == size]  # prompts of this size
        uids = [uid for uid, group in ids.items() if len(group) == size]
        rewards = torch.tensor([[sessions[uid][s][1] for s in ids[uid]] for uid in uids])  # [P_s, size]
        keep = select(rule, Groups(rewards), min(num_kept, size), generator)  # [P_s, m_s]
        kept |= {(uid, ids[uid][i]) for uid, row in zip(uids, keep.tolist()) for i in row}
        generated[rows, :size] = rewards
        kept_rewards[rows, :keep.shape[1]] = rewards.gather(1, keep)
    kept_keys, dropped_keys = [], []
    for key in keys:
        uid, session, _ = split_key(key)
        (kept_keys if (uid, session) in kept else dropped_keys).append(key)
    metrics = {**group_stats("pods/generated_reward", generated),
               **group_stats("pods/kept_reward", kept_rewards),
               "pods/rollouts_generated": float((~generated.isnan()).sum()),
               "pods/rollouts_kept": float(len(kept))}
    return RowSelection(kept_keys, dropped_keys, metrics)


def verl_batch_arguments(prompts_per_step: int, num_generations: int, num_kept: int,
                         mini_batches_per_step: int = 1, data_parallel_size: int = 1) -> dict[str, int]:
    """verl's batch settings for PODS with ``prompts_per_step`` prompts, n = ``num_generations``
    rollouts each, m = ``num_kept`` trained on, in ``mini_batches_per_step`` actor mini-batches
    over ``data_parallel_size`` actor ranks.

    verl sizes an actor mini-batch as ``ppo_mini_batch_size x rollout.n`` rows and pads a batch
    that does not divide (``verl/trainer/ppo/padding_utils.py``); after selection a step has
    ``P x m`` rows, so ``ppo_mini_batch_size = P x m / (n x mini-batches)``. Settings where
    verl would add padding rows or split a prompt's group across mini-batches are refused."""
    P, n, m, k, dp = prompts_per_step, num_generations, num_kept, mini_batches_per_step, data_parallel_size
    if min(P, n, m, k, dp) < 1:
        raise VerlConfigError("verl_batch_arguments: every count must be at least 1")
    if not 2 <= m <= n:
        raise VerlConfigError(f"num_kept: must be between 2 and num_generations = {n}, got {m}")
    if P % k:
        raise VerlConfigError(f"mini_batches_per_step: {P} prompts do not split into {k} mini-batches of "
                              "whole prompt groups")
    rows = P * m // k  # kept rows per mini-batch
    if rows % n:
        raise VerlConfigError(f"actor_rollout_ref.actor.ppo_mini_batch_size: a mini-batch of {P}/{k} prompts "
                              f"x {m} kept = {rows} rows is not a multiple of rollout.n = {n}, so verl's "
                              "mini-batch (ppo_mini_batch_size x rollout.n rows) cannot equal it; choose P x "
                              "m / k divisible by n")
    if rows % dp:
        raise VerlConfigError(f"data parallel size: {rows} rows per mini-batch do not split over {dp} ranks; "
                              "verl would pad the batch with synthetic rows")
    return {"data.train_batch_size": P, "actor_rollout_ref.rollout.n": n,
            "actor_rollout_ref.actor.ppo_mini_batch_size": rows // n}


def check_batch_settings(train_batch_size: int, rollout_n: int, ppo_mini_batch_size: int, num_kept: int,
                         data_parallel_size: int = 1, parameter_sync_step: int = 1) -> None:
    """Refuse a verl config whose kept rows would be padded or split (see :func:`verl_batch_arguments`)."""
    sampled = train_batch_size // max(parameter_sync_step, 1)  # prompts per sample() call
    rows, mini_batch = sampled * num_kept, ppo_mini_batch_size * rollout_n
    if rows % mini_batch or rows % data_parallel_size or mini_batch % num_kept:
        raise VerlConfigError(
            f"PODS batch arithmetic: {sampled} prompts x num_kept {num_kept} = {rows} kept rows per update, "
            f"but verl's actor mini-batch is ppo_mini_batch_size {ppo_mini_batch_size} x rollout.n "
            f"{rollout_n} = {mini_batch} rows over {data_parallel_size} rank(s): verl would pad with "
            "synthetic rows or split a group. Use podsrl.integrations.verl.verl_batch_arguments to choose "
            "data.train_batch_size, rollout.n and ppo_mini_batch_size")


TRAINER_MODES = ("sync", "colocate_async", "separate_async")  # trainer.v1.trainer_mode in verl 0.9


def sampler_overrides(prompts_per_step: int, num_generations: int, num_kept: int,
                      mini_batches_per_step: int = 1, data_parallel_size: int = 1,
                      downsampling_rule: str = "max_variance", trainer_mode: str = "sync") -> list[str]:
    """The Hydra overrides that switch a verl GRPO command to PODS: the sampler, its options
    and the batch settings of :func:`verl_batch_arguments`. An unknown trainer mode or rule is
    refused here, not on the cluster."""
    if trainer_mode not in TRAINER_MODES:
        raise VerlConfigError(f"trainer_mode: {trainer_mode!r} is not one of verl's "
                              f"{', '.join(TRAINER_MODES)}")
    RULES.resolve(downsampling_rule)  # a registered name, or module:function (raises naming the field)
    name = "PODSReplayBuffer" if trainer_mode == "sync" else "PODSReplayBufferAsync"
    batch = verl_batch_arguments(prompts_per_step, num_generations, num_kept, mini_batches_per_step,
                                 data_parallel_size)
    return ["trainer.v1.sampler.custom_sampler.path=pkg://podsrl.integrations.verl",
            f"trainer.v1.sampler.custom_sampler.name={name}",
            f"+trainer.v1.sampler.sampler_kwargs.num_kept={num_kept}",
            f"+trainer.v1.sampler.sampler_kwargs.downsampling_rule={downsampling_rule}",
            *(f"{key}={value}" for key, value in batch.items())]


def main(argv: list[str] | None = None) -> int:
    """``python -m podsrl.integrations.verl_core PROMPTS N M [--mini_batches K] [--dp D]``:
    print the overrides to append to a ``python -m verl.trainer.main_ppo`` command."""
    parser = argparse.ArgumentParser(prog="python -m podsrl.integrations.verl_core", description=main.__doc__)
    parser.add_argument("prompts_per_step", type=int)
    parser.add_argument("num_generations", type=int, help="n: rollouts generated per prompt (rollout.n)")
    parser.add_argument("num_kept", type=int, help="m: rollouts per prompt trained on")
    parser.add_argument("--mini_batches", type=int, default=1, help="actor mini-batches per step")
    parser.add_argument("--dp", type=int, default=1, help="actor data-parallel ranks (GPUs)")
    parser.add_argument("--rule", default="max_variance", help="downsampling_rule")
    parser.add_argument("--trainer_mode", default="sync",
                        help=f"trainer.v1.trainer_mode: {', '.join(TRAINER_MODES)}")
    args = parser.parse_args(argv)
    try:
        print(" ".join(sampler_overrides(args.prompts_per_step, args.num_generations, args.num_kept,
                                         args.mini_batches, args.dp, args.rule, args.trainer_mode)))
    except ValueError as err:  # VerlConfigError, or the rule registry's refusal
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

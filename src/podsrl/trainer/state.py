"""What a run learns and counts besides its weights, in one place: :class:`RunState`, whose
``parts`` (name -> object with ``state_dict`` / ``load_state_dict``) a checkpoint writes and
restores, a step snapshots at its start and an abandoned step rolls back, so checkpointing
one more thing is one entry at set-up; and the rollout seeds (reproducible; the order of the
training prompts is podsrl.prompt_selection's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


def sampling_seed(seed: int, step: int, first_prompt: int) -> int:
    """The RNG seed of the rollouts of one chunk of a step's prompts.

    Seeding per chunk by the chunk's position in the step's batch, not by process, makes
    the samples independent of how the batch is split: a run over W processes draws the
    same rollouts as one process generating the same chunks (generation_batch_size)."""
    return hash((seed, step, first_prompt)) % 2**63


class Stateful(Protocol):
    """A part of the run that learns or draws across steps. ``state_dict`` is a snapshot
    (copies, not live references) of tensors and plain data; ``load_state_dict`` raises on a
    state that is not its own (the checkpoint does not fit).

    Optional members, read where present: ``per_process`` (True: each process keeps its own
    state, :class:`PerProcess`; absent means False) and ``check_state(state)`` (raise ValueError,
    before anything is loaded, on a state that does not fit)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class GeneratorState:
    """A seeded ``torch.Generator`` as a :class:`Stateful` part (a rule's draws)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}  # get_state returns a copy

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


class PerProcess:
    """A part whose state is each process's own (the engine's length predictor learns from the
    process's prompts): a checkpoint keeps one per process, and a run resumed on more
    processes than wrote it starts that part afresh on the extra ones."""

    per_process = True

    def __init__(self, inner) -> None:
        self.inner = inner

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def check_state(self, state: dict) -> None:
        check = getattr(self.inner, "check_state", None)
        if check:
            check(state)


@dataclass
class RunState:
    """The counters and the learned parts a checkpoint restores besides the weights, the
    optimizer and the scheduler, so a resumed run repeats an uninterrupted one."""

    # name -> part: the prompt selector, the group-size policy, the engine, RNG streams
    parts: dict[str, Stateful]
    step: int = 0  # optimizer steps done
    train_seconds: float = 0.0  # generation + reward + selection + update, evaluation excluded

    def snapshot(self) -> dict[str, dict]:
        """Every part's state now (copies): what :meth:`roll_back` puts back."""
        return {name: part.state_dict() for name, part in self.parts.items()}

    def roll_back(self, snapshot: dict[str, dict]) -> None:
        for name, part in self.parts.items():
            part.load_state_dict(snapshot[name])

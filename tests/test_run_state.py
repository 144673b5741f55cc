"""A run's learned parts live in one mapping (RunState.parts): one more part, added in one
place, is checkpointed, restored on resume and rolled back with an abandoned step, with no
other change to the trainer."""

import dataclasses

import pytest
import torch

from podsrl.contracts import UserCodeError
from podsrl.trainer import TrainingStopped, train, training
from podsrl.trainer.checkpoints import list_checkpoints
from tests.conftest import quick


class Tally:
    """A learned part: counts the steps whose advantages were computed; fails at ``fail_at``."""

    def __init__(self, fail_at: int = 0) -> None:
        self.count, self.fail_at = 0, fail_at

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


@pytest.fixture
def tally(monkeypatch):
    """Every run set up from here on gets the same Tally as one more learned part (the one
    line a maintainer writes), counted inside the step, before its update."""
    part, set_up = Tally(), training.set_up

    def set_up_with_a_tally(cfg, reward_funcs=None):
        run = set_up(cfg, reward_funcs)
        run.state.parts["tally"] = part  # the one line
        advantages = run.stages.advantages

        def counted(rewards: torch.Tensor) -> torch.Tensor:
            part.count += 1
            if part.count == part.fail_at:
                raise UserCodeError(f"advantage_estimator: failed at step {run.state.step}")
            return advantages(rewards)
        run.stages = dataclasses.replace(run.stages, advantages=counted)
        return run
    monkeypatch.setattr(training, "set_up", set_up_with_a_tally)
    return part


def saved_tallies(run_dir) -> list[int]:
    return [torch.load(path / "parts.pt", weights_only=True)[0]["tally"]["count"]
            for path in list_checkpoints(run_dir / "checkpoints")]


def test_one_more_learned_part_is_checkpointed_and_restored(random_model_dir, tmp_path, tally):
    out = tmp_path / "run"
    train(quick(random_model_dir, out, max_steps=3, save_total_limit=5))
    assert tally.count == 3 and saved_tallies(out) == [1, 2, 3]
    tally.count = 0  # a fresh process: the part starts afresh, then the checkpoint restores it
    train(quick(random_model_dir, out, max_steps=5, save_total_limit=5, resume=True))
    assert tally.count == 5 and saved_tallies(out) == [1, 2, 3, 4, 5]


def test_one_more_learned_part_is_rolled_back_with_an_abandoned_step(random_model_dir, tmp_path, tally):
    out = tmp_path / "run"
    tally.fail_at = 3  # step 3 counts, then fails before its update
    with pytest.raises(TrainingStopped, match="stopped in step 3: advantage_estimator: failed at step 3"):
        train(quick(random_model_dir, out, max_steps=4, save_steps=0))
    assert tally.count == 2  # step 3's count rolled back with the step
    assert saved_tallies(out) == [2]  # the abandoned step's checkpoint: the last finished step, as it was

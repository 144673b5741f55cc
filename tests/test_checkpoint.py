"""Checkpoints on their own: exact round trip, all-or-nothing restore, no code execution on
load, fsync around the rename, pruning to the newest ``keep``."""

import os
import random

import numpy as np
import pytest
import torch

from podsrl.prompt_selection import ShuffledPass
from podsrl.rollout import SlotsEngine, SlotsOptions
from podsrl.trainer import checkpoints as ckpt
from podsrl.trainer.checkpoints import list_checkpoints, load_checkpoint, save_checkpoint
from podsrl.trainer.state import GeneratorState, PerProcess


def make_state(seed: int):
    """A model, AdamW with state (two steps taken), a warm-up scheduler and the learned parts:
    a generator and a prompt selector (``seed`` prompts into its pass)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.9, 0.99), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
    for _ in range(2):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    selector = ShuffledPass(10)
    selector.take(seed % 10)
    return model, optimizer, scheduler, {"rule": GeneratorState(torch.Generator().manual_seed(seed)),
                                         "prompt_selector": selector}


def snapshot(model, optimizer, scheduler, parts):
    """Everything a restore may change, as comparable plain values."""
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizer": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                          for i, s in optimizer.state_dict()["state"].items()},
            "scheduler": scheduler.state_dict()["last_epoch"], "python": random.getstate(),
            "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)), "torch": torch.get_rng_state(),
            "rule": parts["rule"].generator.get_state(), "prompt_selector": parts["prompt_selector"].state_dict()}


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def save(tmp_path, state, step=1, save_total_limit=3, part_states=None):
    model, optimizer, scheduler, parts = state
    return save_checkpoint(tmp_path / "checkpoints", step=step, weights=ckpt.trainable_state(model),
                           optimizer_state=optimizer.state_dict(), scheduler=scheduler,
                           part_states=part_states or [{name: part.state_dict() for name, part in parts.items()}],
                           save_total_limit=save_total_limit, trainer_state={"train_seconds": 1.5})


def seed_streams(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_round_trip_restores_every_part_exactly(tmp_path):
    saved_state = make_state(3)
    seed_streams(1)
    path = save(tmp_path, saved_state)
    expected = snapshot(*saved_state)
    other = make_state(7)
    seed_streams(2)
    trainer_state = load_checkpoint(path, model=other[0], optimizer=other[1], scheduler=other[2], parts=other[3])
    assert trainer_state["step"] == 1 and trainer_state["train_seconds"] == 1.5 and trainer_state["fresh"] == []
    assert other[3]["prompt_selector"].state_dict() == {"epoch": 0, "position": 3}
    assert same(snapshot(*other), expected)


def break_optimizer_groups(path):
    rest = torch.load(path / "optimizer.pt", weights_only=True)
    rest["optimizer"]["param_groups"][0]["params"] = rest["optimizer"]["param_groups"][0]["params"][:-1]
    torch.save(rest, path / "optimizer.pt")


def break_optimizer_shapes(path):
    rest = torch.load(path / "optimizer.pt", weights_only=True)
    rest["optimizer"]["state"][0]["exp_avg"] = torch.zeros(7)  # torch itself would load this
    torch.save(rest, path / "optimizer.pt")


def break_rng(path):
    rest = torch.load(path / "optimizer.pt", weights_only=True)
    del rest["rng"]["torch"]
    torch.save(rest, path / "optimizer.pt")


def drop_a_part(path):
    parts = torch.load(path / "parts.pt", weights_only=True)
    del parts[0]["rule"]
    torch.save(parts, path / "parts.pt")


def break_a_part(path):
    parts = torch.load(path / "parts.pt", weights_only=True)
    parts[0]["prompt_selector"] = {"posterior": {}}  # another selector's state
    torch.save(parts, path / "parts.pt")


def break_trainer_state(path):
    (path / "trainer_state.json").write_text('{"step": 1}')


@pytest.mark.parametrize("damage", [break_optimizer_groups, break_optimizer_shapes, break_rng, drop_a_part,
                                    break_a_part, break_trainer_state])
def test_a_bad_part_is_refused_before_anything_changes(tmp_path, damage):
    path = save(tmp_path, make_state(0))
    damage(path)
    target = make_state(7)
    seed_streams(3)
    before = snapshot(*target)
    with pytest.raises(ValueError, match=f"checkpoint {path}"):
        load_checkpoint(path, model=target[0], optimizer=target[1], scheduler=target[2], parts=target[3])
    assert same(snapshot(*target), before)


def test_a_failure_while_applying_is_rolled_back(tmp_path, monkeypatch):
    path = save(tmp_path, make_state(0))
    target = make_state(7)
    seed_streams(3)
    before = snapshot(*target)

    def fail(state):
        raise RuntimeError("disk went away")

    monkeypatch.setattr(ckpt, "restore_rng", lambda *a: fail(None))  # after weights, optimizer, scheduler
    with pytest.raises(RuntimeError, match="disk went away"):
        load_checkpoint(path, model=target[0], optimizer=target[1], scheduler=target[2], parts=target[3])
    monkeypatch.undo()
    assert same(snapshot(*target), before)


class Payload:
    """Unpickling this runs ``os.makedirs(marker)``: code in a checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker,)


@pytest.mark.parametrize("file", ["optimizer.pt", "trainable.pt"])
def test_a_planted_pickle_is_refused_and_never_runs(tmp_path, file):
    path = save(tmp_path, make_state(0))
    marker = tmp_path / "pwned"
    torch.save({"optimizer": Payload(str(marker))}, path / file)
    target = make_state(7)
    with pytest.raises(Exception, match="Weights only load failed|Unsupported global"):
        load_checkpoint(path, model=target[0], optimizer=target[1], scheduler=target[2], parts=target[3])
    assert not marker.exists()


def test_files_and_folders_are_synced_around_the_rename(tmp_path, monkeypatch):
    synced = []
    real = ckpt.fsync

    def record(path):
        synced.append((path.name, (tmp_path / "checkpoints" / "step_0000001").exists()))
        real(path)

    monkeypatch.setattr(ckpt, "fsync", record)
    save(tmp_path, make_state(0))
    assert synced == [("trainable.pt", False), ("optimizer.pt", False), ("parts.pt", False),
                      ("trainer_state.json", False), ("step_0000001.tmp", False), ("checkpoints", True)]


def test_only_the_newest_save_total_limit_checkpoints_remain(tmp_path):
    state = make_state(0)
    for step in (1, 2, 3, 10, 11):
        save(tmp_path, state, step=step, save_total_limit=2)
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_0000010", "step_0000011"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000010", "step_0000011"]


def test_slots_length_predictor_round_trips_and_mismatches_are_refused(tmp_path):
    engine = SlotsEngine(SlotsOptions(schedule="shortest_first"))
    features = engine.predictor.features([[1, 2, 3], [4, 5, 6, 7, 8]])
    engine.predictor.update(features, torch.tensor([[3, 4], [9, 11]]))
    path = save(tmp_path, make_state(0), part_states=[{"generation_engine": engine.state_dict()}])
    fresh = SlotsEngine(engine.options)
    target = make_state(7)

    def load(engine, rank=0):
        return load_checkpoint(path, model=target[0], optimizer=target[1], scheduler=target[2],
                               parts={"generation_engine": PerProcess(engine)}, rank=rank)
    assert load(fresh)["fresh"] == []
    assert torch.equal(fresh.predictor.predict(features), engine.predictor.predict(features))
    fifo = SlotsEngine(SlotsOptions())
    with pytest.raises(ValueError, match="keeps no state"):
        load(fifo)
    # a checkpoint of fewer processes holds no state for rank 1: the engine stays fresh, and says so
    other = SlotsEngine(engine.options)
    assert load(other, rank=1)["fresh"] == ["generation_engine"]
    assert other.predictor.seen == 0

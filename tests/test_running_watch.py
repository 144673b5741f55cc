"""Watchers of running samples (kind ``prune_running``, #72) on the slots engine: shown a running
sample at the lengths they ask for, with its pooled last hidden state, they stop the samples they
name; refused where the engine or its options cannot run them."""

from __future__ import annotations

import pytest
import torch

from podsrl.rollout import PRUNE_RUNNING, HFEngine, HFOptions, SlotsOptions, generate_in_slots
from podsrl.rollout.base import refuse_watchers
from podsrl.tasks import TaskOptions, build_task, render_prompt


class StopPromptZero:
    """A rule of the test's own: every sample of prompt 0 that reaches 3 tokens stops; every
    sample is shown at 3 and 6 tokens, and what it was shown is kept."""

    kind = PRUNE_RUNNING

    def __init__(self):
        self.shown: list[tuple[tuple[int, int], int, torch.Tensor]] = []

    def lengths(self, prompt: int) -> tuple[int, ...]:
        return (3, 6)

    def __call__(self, samples, lengths, features, running):
        assert set(samples) <= set(running)  # those shown are running
        self.shown += list(zip(samples, lengths, features))
        return [sample for sample, length in zip(samples, lengths) if sample[0] == 0 and length == 3]


def test_a_watcher_of_running_samples_sees_their_states_and_stops_the_ones_it_names(tiny):
    prompts = [render_prompt(tiny.tokenizer, ex) for ex in build_task(TaskOptions(task_level=3)).train[:4]]
    watcher = StopPromptZero()
    torch.manual_seed(0)
    rollouts = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 4,
                                 SlotsOptions(max_completion_length=12, micro_group=6, schedule="round_robin"),
                                 watchers=(watcher,))
    lengths = rollouts.completion_mask.sum(-1)  # [P, n]
    stopped = {sample for sample, length, _ in watcher.shown if sample[0] == 0 and length == 3}
    assert stopped, "prompt 0 had no sample reach 3 tokens: the test checks nothing"
    for prompt in range(4):
        for sample in range(4):
            if (prompt, sample) in stopped:  # stopped: not generated, no tokens
                assert not rollouts.generated[prompt, sample] and lengths[prompt, sample] == 0
            else:
                assert rollouts.generated[prompt, sample] and lengths[prompt, sample] > 0
                assert prompt != 0 or lengths[prompt, sample] < 3  # prompt 0's survivors ended before 3
    assert {length for _, length, _ in watcher.shown} <= {3, 6}
    assert rollouts.stats["watched_samples"] == len(watcher.shown)
    assert rollouts.stats["pruned_tokens"] == 3 * len(stopped)  # each had drawn its 3 tokens
    # a sample shown at 3 tokens had fed its first two: the pooled state is their last hidden states' mean
    (prompt, sample), _, features = next(item for item in watcher.shown if item[0] not in stopped and item[1] == 3)
    ids = torch.cat([rollouts.prompt_ids[prompt][rollouts.prompt_mask[prompt].bool()],
                     rollouts.completion_ids[prompt, sample, :2]])
    with torch.no_grad():
        hidden = tiny.model(ids[None], output_hidden_states=True).hidden_states[-1][0, -2:]  # [2, D]
    assert torch.allclose(features, hidden.float().mean(0), atol=1e-4)


class StopUnstartedOfPromptOne:
    """At the first sample shown, names every sample of prompt 1 (a finished one stays as it is)."""

    kind = PRUNE_RUNNING

    def __init__(self):
        self.running_then: set | None = None

    def lengths(self, prompt: int) -> tuple[int, ...]:
        return (2,)

    def __call__(self, samples, lengths, features, running):
        if self.running_then is not None:
            return []
        self.running_then = set(running)
        return [(1, s) for s in range(8)]


def test_named_samples_that_have_not_started_never_start(tiny):
    prompts = [render_prompt(tiny.tokenizer, ex) for ex in build_task(TaskOptions(task_level=3)).train[:4]]
    watcher = StopUnstartedOfPromptOne()
    torch.manual_seed(0)
    rollouts = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 8,
                                 SlotsOptions(max_completion_length=12, micro_group=6, schedule="round_robin"),
                                 watchers=(watcher,))
    # round robin over 4 prompts in 6 slots: at the first check prompt 1 has samples running and most pending
    running = {s for p, s in watcher.running_then if p == 1}
    assert running and len(running) < 8
    generated = set(rollouts.generated[1].nonzero()[:, 0].tolist())
    assert not generated & running  # the running ones stopped
    lengths = rollouts.completion_mask[1].sum(-1)
    assert all(int(lengths[s]) == 0 for s in range(8) if s not in generated)
    # what was generated of prompt 1 had finished before the check, on its first token
    assert all(int(lengths[s]) < 2 for s in generated)
    assert rollouts.generated[[0, 2, 3]].all()


def test_engines_and_options_that_cannot_run_it_refuse_it_in_one_line():
    with pytest.raises(ValueError, match=r"^generation_engine hf runs no watcher of kind prune_running \(it declares "
                                         r"none\)$"):
        refuse_watchers(HFEngine(HFOptions()), (StopPromptZero(),))
    assert "length_aware parks every sample" in SlotsOptions(schedule="length_aware").watch_refusal(PRUNE_RUNNING)
    assert SlotsOptions(schedule="round_robin").watch_refusal(PRUNE_RUNNING) == ""


def test_a_call_runs_one_watcher_of_running_samples(tiny):
    with pytest.raises(ValueError, match="2 watchers of kind prune_running; a call runs one"):
        generate_in_slots(tiny.model, tiny.tokenizer, ["1+1="], 2, SlotsOptions(max_completion_length=4),
                          watchers=(StopPromptZero(), StopPromptZero()))


class StopResumed:
    """Shown every running sample at every length; stops those in ``targets`` the first time."""

    kind = PRUNE_RUNNING

    def __init__(self, targets):
        self.targets, self.stopped = set(targets), {}

    def lengths(self, prompt: int) -> tuple[int, ...]:
        return tuple(range(1, 9))

    def __call__(self, samples, lengths, features, running):
        named = [(sample, length) for sample, length in zip(samples, lengths)
                 if sample in self.targets and sample not in self.stopped]
        self.stopped.update(named)
        return [sample for sample, _ in named]


def test_a_carried_sample_stopped_after_it_resumes_is_dropped_and_counted(tiny):
    """Partial rollouts: a sample cut off in one call and stopped in the next loses every token,
    the earlier call's too; it counts as not generated, and its tokens as pruned."""
    from podsrl.rollout import SlotsEngine

    prompts = [render_prompt(tiny.tokenizer, ex) for ex in build_task(TaskOptions()).train[:6]]
    engine = SlotsEngine(SlotsOptions(max_completion_length=8, temperature=0.0, micro_group=4, schedule="round_robin"))

    def call(prompts, carried, quota, version, watchers=()):
        return engine.generate_partial(tiny.model, tiny.tokenizer, prompts, 3, carried=carried, quota=quota,
                                       version=version, watchers=watchers)
    first = call(prompts, {}, 1, 1)
    order = sorted(first.carried)
    carried = {i: first.carried[p] for i, p in enumerate(order)}
    targets = {(i, s) for i, group in carried.items() for s in group.cut_off}
    assert targets, "with 4 slots for 18 samples some must be cut off"
    watcher = StopResumed(targets)
    second = call([prompts[p] for p in order], carried, len(order), 2, watchers=(watcher,))
    assert watcher.stopped and set(watcher.stopped) <= targets
    for i, s in targets - set(watcher.stopped):  # never running after a step: it ended on its first token back
        g = second.complete.index(i)
        assert second.rollouts.completion_mask[g, s].sum() == len(carried[i].completions[s]) + 1
    for (i, s), length in watcher.stopped.items():
        assert length > len(carried[i].completions[s])  # shown after it resumed
        g = second.complete.index(i)
        assert not second.rollouts.generated[g, s] and second.rollouts.completion_mask[g, s].sum() == 0
    assert second.rollouts.stats["pruned_tokens"] == sum(watcher.stopped.values())


# A user's own watcher of running samples: every sample past the first m of its group stops at
# 2 tokens, so every group keeps m generated samples.
PAST_M = """
class PastM:
    kind = "prune_running"

    def __init__(self, prompts, tokenizer, step, *, keep=4):
        self.keep = keep

    def lengths(self, prompt):
        return (2,)

    def __call__(self, samples, lengths, features, running):
        return [(prompt, sample) for prompt, sample in samples if sample >= self.keep]

class Garbage(PastM):
    def __call__(self, samples, lengths, features, running):
        return [prompt for prompt, _ in samples]
"""
RUN = dict(method="pods", generation_engine="slots", generation_schedule="round_robin", generation_micro_group=8,
           num_generations=8, num_kept=4, prompts_per_step=4, max_steps=2, eval_steps=0, eval_prompts=4,
           eval_samples=1, save_steps=0, progress=False)


@pytest.mark.slow
def test_a_users_watcher_of_running_samples_is_configured_checked_and_acted_on_in_a_run(tmp_path):
    import json

    from podsrl.trainer import TrainingStopped, train
    from podsrl.trainer.config import Config, make_config, validate

    path = tmp_path / "prune.py"
    path.write_text(PAST_M)
    with pytest.raises(ValueError, match=r"^generation_watchers: .*:PastM stops running samples, and method grpo-ga "
                                         r"trains on every sample"):
        validate(Config(**{**RUN, "method": "grpo-ga", "generation_watchers": f"{path}:PastM"}))
    with pytest.raises(ValueError, match=r"^generation_watchers: .*:PastM: .*length_aware parks every sample"):
        validate(Config(**{**RUN, "generation_schedule": "length_aware", "generation_watchers": f"{path}:PastM"}))
    cfg = make_config(overrides={**{k: str(v) for k, v in RUN.items()}, "generation_watchers": f"{path}:PastM",
                                 "output_dir": str(tmp_path / "run")})
    train(cfg)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    generated = [r["rollouts_generated"] for r in steps if "rollouts_generated" in r]
    assert len(generated) == 2 and all(4 * 4 <= g < 4 * 8 for g in generated)  # stopped some, kept m each
    bad = make_config(overrides={**{k: str(v) for k, v in RUN.items()}, "generation_watchers": f"{path}:Garbage",
                                 "output_dir": str(tmp_path / "bad")})
    with pytest.raises(TrainingStopped, match=r"stopped in step 1: generation_watchers: .*:Garbage returned "
                                              r"\[0, 1, .*\], expected a list of \(prompt, sample\) pairs"):
        train(bad)

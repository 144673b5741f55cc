"""Watchers of running samples (kind ``prune_running``, #72) on the slots engine: shown a running
sample at the lengths they ask for, with its pooled last hidden state, they stop the samples they
name; refused where the engine or its options cannot run them."""

from __future__ import annotations

import pytest
import torch

from podsrl.rollout import PRUNE_RUNNING, HFEngine, HFOptions, SlotsOptions, generate_in_slots
from podsrl.rollout.base import refuse_watchers
from podsrl.rollout.partial import PartialCall
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
        return engine(tiny.model, tiny.tokenizer, prompts, 3, watchers=watchers,
                      partial=PartialCall(carried, quota, version))
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


# --- a user's watcher held to the kind's contract where it is called (#80) ---------------------------
LENGTHS = """
class Lengths:
    kind = "prune_running"

    def __init__(self, prompts, tokenizer, step, *, value=(2,), raises=False):
        self.value = (2.5, float("nan")) if value == "2.5, nan" else value  # a spec's arguments are JSON
        self.raises = raises

    def lengths(self, prompt):
        if self.raises:
            raise OSError("lengths broke")
        return self.value

    def __call__(self, samples, lengths, features, running):  # pairs come as JSON lists
        return [tuple(pair) for pair in self.value] if isinstance(self.value, list) else self.value

class Lengthless:
    kind = "prune_running"

    def __init__(self, prompts, tokenizer, step):
        pass

    def __call__(self, samples, lengths, features, running):
        return []

def lengthless(prompts, tokenizer, step):  # a factory function: what it builds is known only then
    return Lengthless(prompts, tokenizer, step)
lengthless.kind = "prune_running"
"""


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.py"
    path.write_text(LENGTHS)
    return path


def checked(path, tiny, name="Lengths", **kwargs):
    """A user's watcher as a run's call of 2 prompts x 4 samples gets it."""
    from podsrl.rollout import WatcherFactory
    from podsrl.tasks import prepare_split

    split = prepare_split(build_task(TaskOptions()).train[:2], tiny.tokenizer, system_prompt="",
                          use_chat_template=False, max_prompt_tokens=512)
    return WatcherFactory({"name": f"{path}:{name}", **kwargs})(split, tiny.tokenizer, 0, 4)


@pytest.mark.parametrize("value, shown", [(None, "None"), ("24", "'24'"), ("2.5, nan", r"\(2.5, nan\)"),
                                          ([4, 2], r"\[4, 2\]"), ([2, 2], r"\[2, 2\]"), ([0, 3], r"\[0, 3\]"),
                                          ([True], r"\[True\]")])
def test_a_watchers_lengths_must_be_ascending_ints_of_one_or_more(lengths_file, tiny, value, shown):
    from podsrl.contracts import UserCodeError

    watcher = checked(lengths_file, tiny, value=value)
    with pytest.raises(UserCodeError, match=rf"^generation_watchers: .*:Lengths\(.*\) returned {shown} from "
                                            rf"lengths\(1\), expected strictly ascending completion lengths, "
                                            rf"ints >= 1$"):
        watcher.lengths(1)


def test_a_watchers_lengths_that_raise_fail_in_one_line_naming_it(lengths_file, tiny):
    from podsrl.contracts import UserCodeError

    assert checked(lengths_file, tiny, value=[3, 9]).lengths(0) == (3, 9)
    with pytest.raises(UserCodeError, match=r"^generation_watchers: .*:Lengths\(.*\) failed: OSError: lengths "
                                            r"broke, at "):
        checked(lengths_file, tiny, value=[2], raises=True).lengths(0)


@pytest.mark.parametrize("value, shown", [([[0, 4]], r"\[\(0, 4\)\]"), ([[0, 999]], r"\[\(0, 999\)\]"),
                                          ([[0, -1]], r"\[\(0, -1\)\]"), ([[2, 0]], r"\[\(2, 0\)\]"),
                                          ([[0, 1.0]], r"\[\(0, 1.0\)\]"), ([[0, 1, 2]], r"\[\(0, 1, 2\)\]"),
                                          ("pairs", "'pairs'")])
def test_a_watcher_may_name_only_the_calls_samples(lengths_file, tiny, value, shown):
    from podsrl.contracts import UserCodeError

    watcher = checked(lengths_file, tiny, value=value)
    with pytest.raises(UserCodeError, match=rf"^generation_watchers: .*:Lengths\(.*\) returned {shown}, expected "
                                            rf"a list of \(prompt, sample\) pairs of the call, prompt in \[0, 2\) "
                                            rf"and sample in \[0, 4\)$"):
        watcher([(0, 0)], [2], torch.zeros(1, 4), [(0, 0)])
    assert checked(lengths_file, tiny, value=[[1, 3]])([(0, 0)], [2], torch.zeros(1, 4), [(0, 0)]) == [(1, 3)]


def test_a_watcher_without_the_method_its_kind_calls_is_refused_at_validation_or_when_built(lengths_file, tiny):
    from podsrl.contracts import UserCodeError
    from podsrl.trainer.config import Config, validate

    with pytest.raises(ValueError, match=r"^generation_watchers: .*:Lengthless is a watcher of kind 'prune_running' "
                                         r"without the method lengths\(\) its kind calls"):
        validate(Config(**{**RUN, "generation_watchers": f"{lengths_file}:Lengthless"}))
    validate(Config(**{**RUN, "generation_watchers": f"{lengths_file}:lengthless"}))  # a function: known when called
    with pytest.raises(UserCodeError, match=r"^generation_watchers: .*:lengthless returned a watcher of kind "
                                            r"'prune_running' without the method lengths\(\) its kind calls"):
        checked(lengths_file, tiny, name="lengthless")


class StopEverything:
    """Stops every running sample at its first check, and every sample not yet started."""

    kind = PRUNE_RUNNING

    def lengths(self, prompt: int) -> tuple[int, ...]:
        return (2,)

    def __call__(self, samples, lengths, features, running):
        return [(p, s) for p in range(3) for s in range(4)]


def test_a_watcher_that_stops_every_sample_leaves_rollouts_with_none_generated(tiny):
    """(It ended in 'cannot reshape tensor of 0 elements'; the run's check of m then says it in one line.)"""
    prompts = [render_prompt(tiny.tokenizer, ex) for ex in build_task(TaskOptions(task_level=3)).train[:3]]
    torch.manual_seed(0)
    rollouts = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 4,
                                 SlotsOptions(max_completion_length=12, micro_group=4, schedule="round_robin"),
                                 watchers=(StopEverything(),))
    finished_early = rollouts.generated.sum()  # those that ended on their first token, before any check
    assert rollouts.completion_mask.sum() == finished_early
    assert rollouts.stats["pruned_samples"] == 12 - finished_early > 0


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

class Everything(PastM):
    def __call__(self, samples, lengths, features, running):
        return list(running)
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
    # what it stopped is logged as podsrl's own pruning logs it: every sample not generated, 2 tokens each
    pruned = [(r["pruned_samples"], r["pruned_tokens"]) for r in steps if "rollouts_generated" in r]
    assert pruned == [(4 * 8 - g, 2 * (4 * 8 - g)) for g in generated]
    bad = make_config(overrides={**{k: str(v) for k, v in RUN.items()}, "generation_watchers": f"{path}:Garbage",
                                 "output_dir": str(tmp_path / "bad")})
    with pytest.raises(TrainingStopped, match=r"stopped in step 1: generation_watchers: .*:Garbage returned "
                                              r"\[0, 1, .*\], expected a list of \(prompt, sample\) pairs"):
        train(bad)
    everything = make_config(overrides={**{k: str(v) for k, v in RUN.items()}, "output_dir": str(tmp_path / "all"),
                                        "generation_watchers": f"{path}:Everything"})
    with pytest.raises(TrainingStopped, match=r"stopped in step 1: generation_watchers: .*:Everything stopped a group "
                                              r"with \d samples generated, fewer than num_kept = 4; a watcher must "
                                              r"leave each group at least m samples"):
        train(everything)

"""Every extension kind keeps its contract at the boundary (podsrl.contracts): a wrong
signature is refused at start-up, a wrong output on the call that returns it, both in one line
naming the field and the function; user code that raises, or hangs while a stop is asked
for, ends the run with the last finished step checkpointed."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import textwrap
import time

import pytest
import torch

from podsrl.algorithms.advantages import ADVANTAGES
from podsrl.algorithms.loss import LOSSES
from podsrl.algorithms.select import RULES, Groups, max_variance, select
from podsrl.contracts import UserCodeError
from podsrl.prompt_selection import PROMPT_SELECTORS, PromptSelectionOptions, add_selector_record
from podsrl.rollout import ENGINES, HFOptions
from podsrl.trainer import TrainingStopped, train
from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.trainer.config import make_config, validate


def user_file(tmp_path, source: str, name: str = "mine.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


# --- signatures, at start-up ------------------------------------------------------------------
WRONG_SIGNATURES = {
    "downsampling_rule": "def wrong(rewards):\n    return rewards\n",
    "advantage_estimator": "def wrong(rewards):\n    return rewards\n",
    "loss_type": "def wrong(per_token, mask):\n    return per_token.sum()\n",
    "prompt_selector": "class wrong:\n    def __init__(self):\n        pass\n",
    "generation_engine": "class wrong:\n    def __init__(self, a, b):\n        pass\n",
}


@pytest.mark.parametrize("field", sorted(WRONG_SIGNATURES))
def test_a_wrong_signature_is_refused_before_any_work_naming_field_and_function(tmp_path, field):
    spec = f"{user_file(tmp_path, WRONG_SIGNATURES[field])}:wrong"
    with pytest.raises(ValueError) as refused:
        validate(make_config(overrides={field: spec, "output_dir": str(tmp_path / "run")}))
    message = str(refused.value)
    assert message.startswith(f"{field}: {spec} must accept (") and "\n" not in message
    assert not (tmp_path / "run").exists()


def test_a_reward_without_trls_signature_is_refused_before_the_model_loads(tmp_path, random_model_dir):
    spec = user_file(tmp_path, "def wrong(completions):\n    return [0.0] * len(completions)\n") + ":wrong"
    cfg = make_config(overrides={"model": random_model_dir, "reward_funcs": spec, "output_dir": str(tmp_path / "run")})
    with pytest.raises(ValueError, match=r"reward_funcs: .*wrong must accept \(prompts, completions, \*\*kwargs\)"):
        train(cfg)
    assert not (tmp_path / "run").exists()


# --- rules: what comes back -------------------------------------------------------------------
def rule_returning(value):
    def rule(rewards, m, generator=None):
        return value(rewards, m) if callable(value) else value
    return rule


BAD_INDICES = {
    "one column, m=2": (lambda r, m: torch.zeros(r.shape[0], 1, dtype=torch.long),
                        r"shape \[3, 1\], expected \[3, 2\]"),
    "m+2 columns": (lambda r, m: torch.zeros(r.shape[0], m + 2, dtype=torch.long), r"shape \[3, 4\]"),
    "an index twice": (lambda r, m: torch.zeros(r.shape[0], m, dtype=torch.long), "an index twice within one group"),
    "out of range": (lambda r, m: torch.full((r.shape[0], m), 6), r"index 6, outside 0..5"),
    "negative": (lambda r, m: torch.tensor([[0, -1]] * r.shape[0]), r"index -1, outside 0..5"),
    "floats": (lambda r, m: torch.zeros(r.shape[0], m), "dtype torch.float32, expected integer indices"),
    "bools": (lambda r, m: torch.ones(r.shape[0], m, dtype=torch.bool), "expected integer indices"),
    "a list": (lambda r, m: [[0, 1]] * r.shape[0], "a list, not a torch.Tensor"),
    "None": (lambda r, m: None, "a NoneType, not a torch.Tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD_INDICES))
def test_a_rules_wrong_indices_are_one_line_naming_the_rule(case):
    make, expected = BAD_INDICES[case]
    rule = rule_returning(make)
    with pytest.raises(UserCodeError, match=expected) as refused:
        select(rule, torch.rand(3, 6), 2)
    assert str(refused.value).startswith("downsampling_rule: ") and "rule_returning.<locals>.rule" in str(refused.value)


def test_any_valid_subset_passes_and_comes_back_sorted_within_each_group():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        num_prompts, n = int(torch.randint(1, 5, ())), int(torch.randint(1, 9, ()))
        m = int(torch.randint(1, n + 1, ()))
        chosen = torch.stack([torch.randperm(n, generator=generator)[:m] for _ in range(num_prompts)])  # [P, m]
        keep = select(rule_returning(chosen.int()), torch.rand(num_prompts, n), m)
        assert keep.dtype == torch.long and torch.equal(keep, chosen.sort(dim=1).values)


def test_a_groups_rule_may_not_keep_a_sample_early_stop_skipped():
    def keeps_the_last(groups, m, generator=None):
        return torch.arange(6 - m, 6).expand(groups.rewards.shape[0], m)
    keeps_the_last.takes_groups = True
    generated = torch.ones(2, 6, dtype=torch.bool)
    generated[1, 5] = False
    with pytest.raises(UserCodeError, match="a sample early stop never generated"):
        select(keeps_the_last, Groups(torch.rand(2, 6), generated), 2)


def test_a_rule_that_raises_is_named_with_the_line_in_the_users_file(tmp_path):
    spec = user_file(tmp_path, "def rule(rewards, m, generator=None):\n    return 1 / 0\n") + ":rule"
    with pytest.raises(UserCodeError, match=rf"downsampling_rule: {spec} failed: ZeroDivisionError: .*mine.py:2"):
        select(spec, torch.rand(2, 4), 2)


def test_the_built_in_rules_pass_unchanged():
    rewards = torch.rand(5, 8)
    assert torch.equal(select("max_variance", rewards, 3), max_variance(rewards, 3))
    assert RULES.resolve("max_variance") is max_variance  # resolving still gives the function itself


# --- estimators and losses --------------------------------------------------------------------
@pytest.mark.parametrize("output, expected", [
    (lambda r: r * float("nan"), "non-finite value"),
    (lambda r: r[:, :1], r"shape \[2, 1\], expected \[2, 3\]"),
    (lambda r: r.long(), "expected a floating-point tensor"),
    (lambda r: r.tolist(), "a list, not a torch.Tensor"),
])
def test_an_estimators_wrong_output_is_one_line(output, expected):
    estimator = ADVANTAGES.checked(lambda rewards, scale_by_std: output(rewards))
    with pytest.raises(UserCodeError, match=expected) as refused:
        estimator(torch.rand(2, 3), True)
    assert str(refused.value).startswith("advantage_estimator: ")


def test_the_group_estimator_passes_its_own_check():
    rewards = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    assert torch.equal(ADVANTAGES.checked("group")(rewards, True), ADVANTAGES["group"](rewards, True))


def per_token_terms(finite: bool = True) -> torch.Tensor:
    terms = torch.rand(2, 4, requires_grad=True)
    return terms * (1 if finite else float("nan"))


@pytest.mark.parametrize("output, expected", [
    (lambda t, mask: t.sum() * float("nan"), "nan from finite per-token terms"),
    (lambda t, mask: t.sum().detach(), "a loss without a gradient"),
    (lambda t, mask: t.sum(1), r"shape \[2\], expected \[\]"),
    (lambda t, mask: 0.5, "a float, not a torch.Tensor"),
])
def test_a_losss_wrong_output_is_one_line(output, expected):
    loss = LOSSES.checked(lambda t, mask, sequences, tokens: output(t, mask))
    with pytest.raises(UserCodeError, match=expected) as refused:
        loss(per_token_terms(), torch.ones(2, 4), 2, 8.0)
    assert str(refused.value).startswith("loss_type: ")


def test_a_non_finite_loss_from_non_finite_terms_is_the_models_and_passes_to_the_skip():
    """The step-skip guarantee (docs/reliability.md, non-finite steps) stays: only a loss that
    turns finite terms into NaN is the loss function's fault."""
    for name in ("grpo", "dapo"):
        assert torch.isnan(LOSSES.checked(name)(per_token_terms(finite=False), torch.ones(2, 4), 2, 8.0))


# --- prompt selectors and engines -------------------------------------------------------------
SELECTOR = """
class Picky:
    learns = False

    def __init__(self, size, options):
        self.size = size

    def take(self, count, step, group_size):
        return {take}

    def observe(self, step, indices, correct):
        pass

    def record(self):
        return {record}

    def state_dict(self):
        return {state}

    def load_state_dict(self, state):
        pass
"""


def selector(tmp_path, take="list(range(count))", record="{}", state="{}"):
    name = f"selector_{len(list(tmp_path.glob('selector_*.py')))}.py"  # a file is loaded once: a new one each time
    spec = user_file(tmp_path, SELECTOR.format(take=take, record=record, state=state), name) + ":Picky"
    return PROMPT_SELECTORS.checked(spec)(10, PromptSelectionOptions(prompts_per_step=4))


@pytest.mark.parametrize("take, expected", [
    ("[0, 1]", "2 prompt indices, expected 4"),
    ("[0, 1, 2, -1]", "prompt index -1, outside 0..9"),
    ("[0, 1, 2, 10]", "prompt index 10, outside 0..9"),
    ("[0.0, 1.0, 2.0, 3.0]", "0.0 among its prompt indices, expected integers"),
    ("None", "a NoneType, expected a list of 4 prompt indices"),
    ("[3, 3, 3, 3]", "prompt index 3 4 times among its 4; a step's prompts are distinct"),
    ("[0, 1, 2, 1]", "prompt index 1 2 times among its 4"),
])
def test_a_selectors_take_must_give_count_indices_into_the_train_split(tmp_path, take, expected):
    with pytest.raises(UserCodeError, match=expected) as refused:
        selector(tmp_path, take=take).take(4, 1, 4)
    assert str(refused.value).startswith("prompt_selector: ")


def test_a_selector_repeats_prompts_only_where_the_train_split_has_too_few(tmp_path):
    """10 train prompts: a step of 12 must repeat some, so repeats pass there."""
    assert selector(tmp_path, take="[i % 10 for i in range(count)]").take(12, 1, 4) == [*range(10), 0, 1]


def test_numpy_and_tensor_indices_are_accepted(tmp_path):
    assert selector(tmp_path, take="__import__('numpy').arange(count)").take(4, 1, 4) == [0, 1, 2, 3]
    assert selector(tmp_path, take="__import__('torch').arange(count)").take(4, 1, 4) == [0, 1, 2, 3]


def test_a_selectors_record_may_not_overwrite_the_trainers_metrics(tmp_path):
    numbers = selector(tmp_path, record="{'loss': 0.0}").record()
    record = {"step": 1, "loss": 0.25}
    with pytest.raises(UserCodeError, match="the metric 'loss' .* a name the trainer writes itself"):
        add_selector_record(numbers, record)
    assert record["loss"] == 0.25
    with pytest.raises(UserCodeError, match=r"x='a' from record\(\), expected a finite number"):
        selector(tmp_path, record="{'x': 'a'}").record()


def test_a_selector_state_that_is_not_json_is_refused_at_set_up_not_at_the_first_checkpoint(tmp_path):
    with pytest.raises(UserCodeError, match=r"Picky.state_dict\(\) returned a state that is not JSON"):
        selector(tmp_path, state="{'rng': object()}")


def test_a_selector_missing_a_method_is_refused(tmp_path):
    spec = user_file(tmp_path, "class Half:\n    def __init__(self, size, options):\n        pass\n") + ":Half"
    with pytest.raises(ValueError, match=r"prompt_selector: .*Half has no method take\(\)"):
        PROMPT_SELECTORS.checked(spec)(10, PromptSelectionOptions())


def test_an_engines_rollouts_must_have_the_group_shape(tmp_path, tiny):
    source = """
    from podsrl.rollout import HFEngine

    class Short(HFEngine):
        def __call__(self, model, tokenizer, prompts, num_samples, watchers=()):
            return super().__call__(model, tokenizer, prompts[:1], num_samples, watchers)
    """
    engine = ENGINES.checked(user_file(tmp_path, source) + ":Short")(HFOptions(max_completion_length=3))
    with pytest.raises(UserCodeError, match=r"generation_engine: .*Short returned completion_ids of shape \[1, 2, "):
        engine(tiny.model, tiny.tokenizer, ["1+1=", "2+2="], 2)
    assert engine.state_dict() == {}  # the rest is the engine's own


def test_what_an_engine_can_do_is_read_from_its_capabilities_not_its_name(tmp_path):
    """A user's engine that subclasses the slots engine inherits its early stop, schedules and
    memory cap; one that declares nothing has none of them, and each refusal says why."""
    source = """
    from podsrl.rollout import SlotsEngine

    class MySlots(SlotsEngine):
        pass

    class Bare:
        def __init__(self, options):
            pass

        def __call__(self, model, tokenizer, prompts, num_samples, watchers=()):
            raise NotImplementedError

        def state_dict(self):
            return {}

        def check_state(self, state):
            pass

        def load_state_dict(self, state):
            pass
    """
    path = user_file(tmp_path, source)
    early_stop = dict(method="pods", group_early_stop="true", generation_micro_group="8",
                      generation_schedule="shortest_first")
    validate(make_config(overrides={"generation_engine": f"{path}:MySlots", "generation_memory_mb": "100",
                                    **early_stop}))
    with pytest.raises(ValueError) as refused:  # #57: the line did not name the engine
        make_config(overrides={"generation_engine": f"{path}:Bare", **early_stop})
    assert str(refused.value) == (f"group_early_stop: generation_engine {path}:Bare does not stop groups early (its "
                                  f"capabilities declare no watcher kind 'stop_groups'); use generation_engine slots")
    with pytest.raises(ValueError, match=r"^generation_memory_mb: caps what the hf and slots engines decode at once; "
                                         r"generation_engine .*:Bare sizes its own memory"):
        make_config(overrides={"generation_engine": f"{path}:Bare", "generation_memory_mb": "100"})
    with pytest.raises(ValueError, match=r"^group_early_stop: generation_engine hf does not stop groups early"):
        make_config(overrides={"generation_engine": "hf", **early_stop})


# --- in a run: failures and hangs end it with the last finished step checkpointed ---------------
# each kind's user code, failing (raise) or hanging after asking the trainer to stop (hang) on
# its call in step 2; the rest of the time it does what the built-in does
KINDS = {
    "downsampling_rule": ("""
        from podsrl.algorithms.select import max_variance
        def component(rewards, m, generator=None):
            misbehave()
            return max_variance(rewards, m)
    """, ":component"),
    "downsampling_rule (groups)": ("""
        from podsrl.algorithms.select import max_variance, takes_groups
        @takes_groups
        def component(groups, m, generator=None):
            misbehave()
            return max_variance(groups.selectable_rewards(), m)
    """, ":component"),
    "advantage_estimator": ("""
        from podsrl.algorithms.advantages import group_advantages
        def component(rewards, scale_by_std):
            misbehave()
            return group_advantages(rewards, scale_by_std)
    """, ":component"),
    "loss_type": ("""
        from podsrl.algorithms.loss import sequence_mean
        def component(per_token, mask, num_sequences, num_tokens):
            misbehave()
            return sequence_mean(per_token, mask, num_sequences, num_tokens)
    """, ":component"),
    "prompt_selector": ("""
        from podsrl.prompt_selection import ShuffledPass
        class Component(ShuffledPass):
            def take(self, count, step=0, group_size=0):
                misbehave()
                return super().take(count, step, group_size)
    """, ":Component"),
    "generation_engine": ("""
        from podsrl.rollout import HFEngine
        class Component(HFEngine):
            def __call__(self, *args, **kwargs):
                misbehave()
                return super().__call__(*args, **kwargs)
    """, ":Component"),
    "reward_funcs": ("""
        def component(prompts, completions, **columns):
            misbehave(trainer=os.getppid())  # in the reward worker: the trainer is its parent
            return [float(len(c) % 2) for c in completions]
    """, ":component"),
    "generation_watchers": ("""
        class Component:  # built once per engine call, so its second build is in step 2
            kind = "stop_groups"
            def __init__(self, prompts, tokenizer, step):
                misbehave()
            def __call__(self, prompt_index, completion_ids):
                return []
    """, ":Component"),
    "generation_watchers (lengths)": ("""
        class Component:  # built once per engine call: lengths misbehaves on its first call of the call
            kind = "prune_running"
            def __init__(self, prompts, tokenizer, step):
                self.first = True
            def lengths(self, prompt):
                if self.first:
                    self.first = False
                    misbehave()
                return (2,)
            def __call__(self, samples, lengths, features, running):
                return []
    """, ":Component"),
}
# what a kind needs besides its field: a watcher runs on the slots engine
SLOTS = dict(generation_engine="slots", generation_schedule="round_robin", generation_micro_group=4)
NEEDS = {"generation_watchers": SLOTS, "generation_watchers (lengths)": SLOTS}
MISBEHAVE = """
import os, signal, time
calls = [0]
def misbehave(trainer=None):
    calls[0] += 1
    if calls[0] == 2:
        if {hang}:
            os.kill(trainer or os.getpid(), signal.SIGTERM)  # as a scheduler does, while it hangs
            time.sleep(600)
        raise {error}("broken on purpose")
"""


def misbehaving_run(tmp_path, random_model_dir, kind, hang, error="RuntimeError"):
    source, attr = KINDS[kind]
    field = kind.split()[0]  # "downsampling_rule (groups)": the field, and which form
    spec = user_file(tmp_path, MISBEHAVE.format(hang=hang, error=error) + textwrap.dedent(source),
                     f"{field}_component.py") + attr
    values = dict(model=random_model_dir, task="parity", max_steps=3, prompts_per_step=4, num_generations=4,
                  num_kept=2, max_completion_length=6, eval_prompts=4, eval_samples=1, eval_steps=0, save_steps=1,
                  progress=False, output_dir=str(tmp_path / "run"), **{field: spec}, **NEEDS.get(kind, {}))
    return make_config(overrides={k: str(v) for k, v in values.items()}), spec


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_user_code_that_raises_stops_the_run_naming_it_with_the_last_step_checkpointed(tmp_path, random_model_dir,
                                                                                       kind):
    cfg, spec = misbehaving_run(tmp_path, random_model_dir, kind, hang=False)
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg)
    message = str(stopped.value)
    assert message.startswith("stopped in step 2: ") and "broken on purpose" in message and "\n" not in message
    assert kind == "reward_funcs" or f"{kind.split()[0]}: {spec} failed: RuntimeError" in message
    assert [c.name for c in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step_0000001"]
    assert [r["step"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())] == [0, 1]


@pytest.mark.parametrize("kind", ["generation_watchers", "generation_watchers (lengths)", "loss_type"])
def test_a_keyboard_interrupt_user_code_raises_is_its_failure_not_a_signal(tmp_path, random_model_dir, kind):
    """No signal was sent: the run stops as on any failure of that code, naming it, with the last
    finished step checkpointed (it was reported as 'stopped by SIGINT; the run had not begun')."""
    cfg, spec = misbehaving_run(tmp_path, random_model_dir, kind, hang=False, error="KeyboardInterrupt")
    before = signal.getsignal(signal.SIGINT)  # (a background job starts with SIGINT ignored)
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg)
    assert stopped.value.signum is None
    assert str(stopped.value).startswith(f"stopped in step 2: {kind.split()[0]}: {spec} failed: KeyboardInterrupt: "
                                         f"broken on purpose (raised by the code, no signal was sent), at ")
    assert [c.name for c in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step_0000001"]
    assert signal.getsignal(signal.SIGINT) == before  # the run's handler is gone


def test_a_loss_that_fails_before_the_first_checkpoint_says_to_run_the_command_again_not_to_resume(
        tmp_path, random_model_dir):
    """The loss runs inside the update: a failure there leaves no step to checkpoint, and with no
    checkpoint yet --resume would be refused, so the line says what works (the same command)."""
    spec = user_file(tmp_path, "def boom(per_token, mask, num_sequences, num_tokens):\n"
                               "    raise RuntimeError('boom')\n") + ":boom"
    cfg = make_config(overrides={k: str(v) for k, v in dict(
        model=random_model_dir, task="parity", max_steps=3, prompts_per_step=4, num_generations=4, num_kept=2,
        max_completion_length=6, eval_prompts=4, eval_samples=1, eval_steps=0, save_steps=5, progress=False,
        output_dir=str(tmp_path / "run"), loss_type=spec).items()})
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg)
    message = str(stopped.value)
    assert message.startswith("stopped in step 1: ") and "boom" in message and "\n" not in message
    assert message.endswith("; no checkpoint yet: fix it, then run the same command again to start afresh "
                            "(podsrl reuses the folder)"), message
    assert "--resume" not in message and not list_checkpoints(tmp_path / "run" / "checkpoints")


def engine_run(tmp_path, random_model_dir, source, **overrides):
    """A 3-step run generating with the user's engine ``ext.py:MyEngine`` (``source``)."""
    spec = user_file(tmp_path, source, "ext.py") + ":MyEngine"
    values = dict(model=random_model_dir, task="parity", max_steps=3, prompts_per_step=4, num_generations=4,
                  num_kept=2, max_completion_length=6, eval_prompts=4, eval_samples=1, eval_steps=0, save_steps=1,
                  progress=False, output_dir=str(tmp_path / "run"), generation_engine=spec, **overrides)
    return make_config(overrides={k: str(v) for k, v in values.items()})


@pytest.mark.slow
def test_a_user_engine_over_the_memory_cap_in_step_1_says_what_works_and_it_does(tmp_path, random_model_dir):
    """#57: the advice was 'fix it, then continue with --resume true', and that resume refused
    the raised cap; the estimate read '~0 MB'. Nothing is trained before step 1, so no step-0
    checkpoint holds the run to a resume: the same command, cap raised, starts afresh."""
    source = "from podsrl.rollout import HFEngine\nclass MyEngine(HFEngine):\n    pass\n"
    with pytest.raises(TrainingStopped) as stopped:
        train(engine_run(tmp_path, random_model_dir, source, generation_memory_mb=0.001))
    message = str(stopped.value)
    assert message.startswith("stopped in step 1: generation_engine: ") and "\n" not in message
    assert re.search(r"needs ~0\.\d+ MB to decode at once, over the cap of 0\.001 MB", message), message
    assert message.endswith("; no checkpoint yet: fix it, then run the same command again to start afresh (podsrl "
                            "reuses the folder)"), message
    assert not list_checkpoints(tmp_path / "run" / "checkpoints")
    assert train(engine_run(tmp_path, random_model_dir, source, generation_memory_mb=10)).steps == 3


FAILS_OVER_A_SETTING = """
from pathlib import Path
from podsrl.rollout import HFEngine
class MyEngine(HFEngine):
    calls = 0
    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 2 and Path(__file__).with_name("bug").exists():  # the bug: fixed once removed
            raise MemoryError("generation_memory_mb: this step's group needs more than the cap")
        return super().__call__(*args, **kwargs)
"""


@pytest.mark.slow
def test_a_user_engine_failing_over_a_setting_a_resume_keeps_says_a_change_means_a_new_run(tmp_path,
                                                                                         random_model_dir):
    """After a checkpoint, a component whose error names a setting a resume may not change
    says so: a resume with it changed is refused (as said), the same command resumes."""
    from podsrl.run_folder.claim import RunDirError

    (tmp_path / "bug").touch()
    with pytest.raises(TrainingStopped) as stopped:
        train(engine_run(tmp_path, random_model_dir, FAILS_OVER_A_SETTING, generation_memory_mb=10))
    assert str(stopped.value).endswith(
        f"checkpoint of step 1 in {tmp_path / 'run' / 'checkpoints'}: fix it (a resume keeps the run's "
        f"generation_memory_mb: with another generation_memory_mb, start a new run in another --output_dir), then "
        f"continue with the same command plus --resume true"), str(stopped.value)
    with pytest.raises(RunDirError, match="in generation_memory_mb: run 10.0, now 20.0"):
        train(engine_run(tmp_path, random_model_dir, FAILS_OVER_A_SETTING, generation_memory_mb=20, resume=True))
    (tmp_path / "bug").unlink()
    assert train(engine_run(tmp_path, random_model_dir, FAILS_OVER_A_SETTING, generation_memory_mb=10,
                            resume=True)).steps == 3

@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_sigterm_ends_the_run_within_seconds_while_user_code_hangs(tmp_path, random_model_dir, kind):
    cfg, spec = misbehaving_run(tmp_path, random_model_dir, kind, hang=True)
    start = time.monotonic()
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg)
    assert time.monotonic() - start < 60  # the hang is 600 s and the reward timeout 300 s
    assert stopped.value.signum == signal.SIGTERM
    assert f"stopped in step 2: by SIGTERM in {kind.split()[0]} " in str(stopped.value)
    assert [c.name for c in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step_0000001"]
    assert signal.getsignal(signal.SIGTERM) is not None and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_second_signal_outside_a_step_is_one_line_with_the_last_checkpoint(tmp_path, random_model_dir,
                                                                             monkeypatch):
    """StopNow raised by a second signal while the run evaluates (outside any step) is the
    same one-line stop, exit code included, never a traceback."""
    from podsrl.interrupts import StopNow
    from podsrl.trainer.jobs import RunEvaluation

    evaluate, calls = RunEvaluation.__call__, []

    def evaluate_then_interrupted(run):
        calls.append(run.state.step)
        if run.state.step == 2:
            raise StopNow(signal.SIGINT)
        return evaluate(run)
    monkeypatch.setattr(RunEvaluation, "__call__", evaluate_then_interrupted)
    cfg, _ = misbehaving_run(tmp_path, random_model_dir, "advantage_estimator", hang=False)
    cfg = dataclasses.replace(cfg, advantage_estimator="group", eval_steps=2)
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg)
    assert stopped.value.signum == signal.SIGINT and calls == [0, 2]
    assert str(stopped.value).startswith("stopped by SIGINT after step 2; last checkpoint: ")


def test_a_second_signal_before_the_first_checkpoint_says_to_start_again_not_to_resume(tmp_path, random_model_dir,
                                                                                       monkeypatch):
    """Stopped at once in the initial evaluation, a run has no checkpoint: the line says to
    run the same command again, and that command starts the run afresh in the same folder."""
    from podsrl.interrupts import StopNow
    from podsrl.trainer.jobs import RunEvaluation

    evaluate = RunEvaluation.__call__

    def interrupted(run):
        raise StopNow(signal.SIGINT, "evaluation")
    monkeypatch.setattr(RunEvaluation, "__call__", interrupted)
    cfg, _ = misbehaving_run(tmp_path, random_model_dir, "advantage_estimator", hang=False)
    cfg = dataclasses.replace(cfg, advantage_estimator="group")
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg)
    assert str(stopped.value) == ("stopped by SIGINT in evaluation after step 0; last checkpoint: none; nothing to "
                                  "resume: run the same command again to start afresh (podsrl reuses the folder)")
    monkeypatch.setattr(RunEvaluation, "__call__", evaluate)
    assert train(cfg).steps == 3


def test_trls_reward_signature_with_named_columns_passes():
    """Named parameters are dataset columns (``answer``), passed as keywords: accepted, as are
    podsrl's own reward functions; only a function that cannot take the keywords is refused."""
    from podsrl.contracts import check_reward_signature
    from podsrl.rewards import REWARDS

    def with_answer(prompts, completions, answer, **columns):
        return [0.0] * len(completions)
    for name, fn in [*REWARDS.items(), ("with_answer", with_answer)]:
        check_reward_signature(fn, "reward_funcs", name)

"""What watches generation, from outside podsrl (#71): a user's watcher of a kind the slots
engine declares (``stop_groups``), and a user's engine declaring a kind of its own with the
watcher for it. Each is configured through ``generation_watchers``, refused in one line on an
engine that does not declare its kind, and acted on in a run."""

import json
import textwrap

import pytest

from podsrl.contracts import UserCodeError
from podsrl.rollout import PRUNE_RUNNING, STOP_GROUPS, Capabilities, SlotsEngine, WatcherFactory, capabilities
from podsrl.tasks import TaskOptions, build_task, prepare_split
from podsrl.trainer import train
from podsrl.trainer.config import Config, make_config, validate

# A rule of the user's own: a group needs no more samples once `enough` of them finished.
# Every call's reports are appended to `log` (one JSON line per call), so the test sees it acted.
WATCHER = """
import json

class Enough:
    kind = "stop_groups"

    def __init__(self, prompts, tokenizer, step, *, enough=4, log=""):
        self.finished = [0] * len(prompts.prompts)
        self.enough, self.log = enough, log

    def __call__(self, prompt_index, completion_ids):
        for prompt in prompt_index:
            self.finished[prompt] += 1
        stopped = [p for p in sorted(set(prompt_index)) if self.finished[p] == self.enough]
        if self.log:
            with open(self.log, "a") as out:
                out.write(json.dumps({"reported": list(prompt_index), "stopped": stopped}) + "\\n")
        return stopped

class Wrong:
    kind = "stop_groups"

    def __init__(self, prompts, tokenizer, step):
        self.prompts = len(prompts.prompts)

    def __call__(self, prompt_index, completion_ids):
        return [self.prompts]  # not a prompt of the call

class Unkinded:
    def __init__(self, prompts, tokenizer, step):
        pass
"""

# A capability the built-in engines lack: a watcher that caps each call's completions at a
# length of its choosing, and an engine (the slots engine, extended) that declares and honours it.
CAPPED = """
import dataclasses
from podsrl.rollout import Capabilities, SlotsEngine, STOP_GROUPS

class Capped(SlotsEngine):
    capabilities = Capabilities(watches={STOP_GROUPS, "cap_length"}, partial_rollouts=True)

    def __call__(self, model, tokenizer, prompts, num_samples, watchers=(), partial=None):
        caps = [w.tokens(len(prompts)) for w in watchers if w.kind == "cap_length"]
        if caps:
            self.options = dataclasses.replace(self.options, max_completion_length=min(caps))
        return super().__call__(model, tokenizer, prompts, num_samples,
                                tuple(w for w in watchers if w.kind != "cap_length"), partial=partial)

class Three:
    kind = "cap_length"

    def __init__(self, prompts, tokenizer, step):
        pass

    def tokens(self, prompts):
        return 3

    def __call__(self, prompt_index, completion_ids):
        return []
"""

RUN = dict(method="pods", generation_engine="slots", generation_schedule="round_robin", generation_micro_group=8,
           num_generations=8, num_kept=4, prompts_per_step=4, max_steps=2, eval_steps=0, eval_prompts=4,
           eval_samples=1, save_steps=0, progress=False)


def user_file(tmp_path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_users_stop_groups_watcher_is_configured_and_acted_on_in_a_run(tmp_path):
    path = user_file(tmp_path, "watch.py", WATCHER)
    log = tmp_path / "reports.jsonl"
    spec = json.dumps([{"name": f"{path}:Enough", "enough": 4, "log": str(log)}])
    cfg = make_config(overrides={**{k: str(v) for k, v in RUN.items()}, "generation_watchers": spec,
                                 "output_dir": str(tmp_path / "run")})
    train(cfg)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    stopped = [prompt for call in calls for prompt in call["stopped"]]
    assert calls and stopped  # it saw samples finish and stopped groups
    steps = [r for r in metrics(tmp_path / "run") if "rollouts_generated" in r]
    assert len(steps) == 2
    # a group it stopped keeps its finished 4 and those running at the time: fewer than 8 somewhere
    assert any(r["rollouts_generated"] < 4 * 8 for r in steps) and all(r["rollouts_generated"] >= 4 * 4
                                                                          for r in steps)


@pytest.mark.slow
def test_a_users_watcher_composes_with_partial_rollouts_and_early_stop_in_one_run(tmp_path):
    """The one generation path (#82): a watcher from outside podsrl rides the same hook as early
    stop, in the calls partial rollouts stop at a quota; each acts, and the run trains."""
    path = user_file(tmp_path, "watch.py", WATCHER)
    log = tmp_path / "reports.jsonl"
    spec = json.dumps([{"name": f"{path}:Enough", "enough": 6, "log": str(log)}])
    overrides = {**{k: str(v) for k, v in RUN.items()}, "max_steps": "3", "generation_watchers": spec,
                 "group_early_stop": "true", "partial_rollouts": "true", "partial_extra_prompts": "2",
                 "max_completion_length": "12", "output_dir": str(tmp_path / "run")}
    train(make_config(overrides=overrides))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) >= 3 and any(call["stopped"] for call in calls)  # it saw every step's samples, and stopped
    steps = [r for r in metrics(tmp_path / "run") if "rollouts_generated" in r]
    assert len(steps) == 3
    assert any(r["partial_groups_carried"] > 0 for r in steps)  # partial rollouts carried groups on
    assert any(r["rollouts_generated"] < 4 * 8 for r in steps)  # groups stopped early: fewer than n generated
    assert all(r["rollouts_generated"] >= 4 * 4 for r in steps)  # each kept group had its m to select from


def test_a_watcher_is_refused_on_an_engine_that_does_not_declare_its_kind(tmp_path):
    path = user_file(tmp_path, "watch.py", WATCHER)
    with pytest.raises(ValueError) as refused:
        validate(Config(**{**RUN, "generation_engine": "hf", "generation_watchers": f"{path}:Enough"}))
    assert str(refused.value) == (f"generation_watchers: {path}:Enough is a watcher of kind 'stop_groups', and "
                                  f"generation_engine hf runs none of that kind (it declares none)")
    with pytest.raises(ValueError, match=r"^generation_watchers: .*:Enough stops groups early, and method grpo-ga "
                                         r"trains on every sample"):
        validate(Config(**{**RUN, "method": "grpo-ga", "generation_watchers": f"{path}:Enough"}))
    with pytest.raises(ValueError, match=r"^generation_watchers: .*:Enough: generation_schedule fifo starts"):
        validate(Config(**{**RUN, "generation_schedule": "fifo", "generation_watchers": f"{path}:Enough"}))
    with pytest.raises(ValueError, match=r"^generation_watchers: .*:Unkinded declares no kind"):
        validate(Config(**{**RUN, "generation_watchers": f"{path}:Unkinded"}))


def test_a_new_capability_from_outside_is_declared_by_its_engine_refused_elsewhere_and_acted_on(tmp_path):
    path = user_file(tmp_path, "capped.py", CAPPED)
    capped = dict(RUN, generation_engine=f"{path}:Capped", generation_watchers=f"{path}:Three")
    validate(Config(**capped))
    with pytest.raises(ValueError, match=r"^generation_watchers: .*:Three is a watcher of kind 'cap_length', and "
                                         r"generation_engine slots runs none of that kind "
                                         r"\(it declares prune_running, stop_groups\)$"):
        validate(Config(**{**capped, "generation_engine": "slots"}))
    train(Config(**capped, max_completion_length=12, output_dir=str(tmp_path / "run")))
    lengths = [r["completion_len"] for r in metrics(tmp_path / "run") if "completion_len" in r]
    assert lengths and all(0 < length <= 3 for length in lengths)  # the watcher's cap, not the run's 12


def test_a_watcher_that_returns_garbage_fails_in_one_line_naming_it(tmp_path, tiny):
    path = user_file(tmp_path, "watch.py", WATCHER)
    split = prepare_split(build_task(TaskOptions()).train[:2], tiny.tokenizer, system_prompt="",
                          use_chat_template=False, max_prompt_tokens=512)
    watcher = WatcherFactory(f"{path}:Wrong")(split, tiny.tokenizer, 0, 4)
    assert watcher.kind == STOP_GROUPS
    with pytest.raises(UserCodeError, match=r"^generation_watchers: .*:Wrong returned \[2\], expected a list of "
                                            r"prompt indices in \[0, 2\)$"):
        watcher([0], [[1, 2]])


def test_capabilities_are_declared_once_and_the_former_attributes_are_refused():
    assert capabilities(SlotsEngine) == Capabilities(watches={STOP_GROUPS, PRUNE_RUNNING}, partial_rollouts=True)
    assert capabilities(object()) == Capabilities()  # declares nothing: can do nothing of it

    class Former:
        early_stop_refusal = ""

    with pytest.raises(ValueError, match=r"^generation_engine: Former declares early_stop_refusal as attributes; "
                                         r"declare capabilities = podsrl.rollout.Capabilities"):
        capabilities(Former)

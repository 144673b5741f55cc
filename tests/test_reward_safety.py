"""Reward functions cannot take the trainer down: user functions run in a worker process
that a timeout kills (the process always exits), SystemExit / KeyboardInterrupt / os._exit
inside them are failures of the function, malformed return values and overflowing sums are
refused, reward files cannot shadow modules, import failures are one line, and every
failure under the 'raise' policy is a one-line RewardError."""

import faulthandler
import importlib
import json
import math
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from podsrl.rewards import DEFAULT_REWARD_TIMEOUT, REWARDS, RewardError, RewardStack, in_process, load_reward_fn
from podsrl.rewards import stack as stack_module
from podsrl.rewards import worker as worker_module
from podsrl.rewards.stack import runs_in_worker
from podsrl.scoring import TrainerProgress, _not_recorded
from podsrl.tasks.jsonl import build_jsonl

ROOT = Path(__file__).resolve().parents[1]


def pid_reward(prompts, completions, **_):
    """The process it runs in, as a reward: which worker served the call."""
    return [float(os.getpid())] * len(completions)


def sleepy(prompts, completions, **_):
    time.sleep(10**6)


def crc_like(prompts, completions, **_):
    return [float(sum(map(ord, c)) % 7) - 3.0 for c in completions]


# --- 1. a hang is killed at its timeout, and the process always exits --------------------------
HANGS = {
    "sleep": "time.sleep(10**6)",
    "busy": "while True: pass",
    "ignores_sigterm": "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(10**6)",
    "with_a_child": "Path(os.environ['CHILD_PID']).write_text(str(subprocess.Popen(['sleep', '1000']).pid)); "
                    "time.sleep(10**6)",
}


def run_python(code: str, env: dict | None = None, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``code`` in a fresh interpreter; also the seconds from its START line to its exit."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)
    ended = time.time()
    starts = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("START ")]
    return proc, ended - starts[0] if starts else math.inf


PRELUDE = """
import os, signal, subprocess, sys, time
from pathlib import Path
from podsrl.rewards import RewardError, RewardStack
"""


@pytest.mark.slow
def test_hung_functions_are_killed_and_the_process_exits_under_the_zero_policy(tmp_path):
    code = PRELUDE + "".join(f"\ndef {name}(prompts, completions, **kw):\n    {body}\n" for name, body in HANGS.items())
    code += f"""
def fine(prompts, completions, **kw):
    return [1.0] * len(completions)

idle = RewardStack([fine], [1.0])  # a worker alive and idle at exit must not hold the exit up either
idle(["p"], ["a"], {{}})
print("START", time.time(), flush=True)
for fn in [{", ".join(HANGS)}]:
    stack = RewardStack([fn, fine], [1.0, 1.0], error_policy="zero", timeout=0.5)
    print("RESULT", fn.__name__, stack(["p", "q"], ["a", "b"], {{}}).tolist(), stack.failures, flush=True)
"""
    proc, seconds = run_python(code, env={"CHILD_PID": str(tmp_path / "child.pid")})
    assert proc.returncode == 0, proc.stderr
    results = [line.split(maxsplit=2)[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert results == [[name, "[1.0, 1.0] 2"] for name in HANGS]  # zeros from the hung one, counted; `fine` adds 1
    assert seconds < len(HANGS) * (0.5 + worker_module._GRACE) + 5, seconds
    child = int((tmp_path / "child.pid").read_text())
    assert not _alive(child), "what the hung function started is killed with it"


@pytest.mark.parametrize("body, message", [
    (HANGS["sleep"], "reward function bad timed out after 0.5s on a batch of 2 completions"),
    ("sys.exit(0)", r"reward function bad failed on prompt index 0 \(SystemExit: 0\)"),
    ("raise SystemExit", r"reward function bad failed on prompt index 0 \(SystemExit\)"),
    ("os._exit(0)", r"reward function bad failed on prompt index 0 \(its worker process ended \(exit code 0\)\)"),
    ("raise KeyboardInterrupt", r"reward function bad failed on prompt index 0 \(KeyboardInterrupt\)"),
])
@pytest.mark.slow
def test_under_the_raise_policy_the_process_ends_with_a_reward_error_and_a_nonzero_code(body, message):
    code = PRELUDE + f"""
def bad(prompts, completions, **kw):
    {body}

stack = RewardStack([bad], [1.0], timeout=0.5)
print("START", time.time(), flush=True)
stack(["p", "q"], ["a", "b"], {{}})
"""
    proc, seconds = run_python(code)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert re.search(r"RewardError: " + message + "$", proc.stderr.strip().splitlines()[-1]), proc.stderr
    assert seconds < 0.5 + worker_module._GRACE + 5, seconds


@pytest.mark.slow
def test_a_worker_stuck_in_a_function_dies_with_a_killed_trainer(tmp_path):
    code = PRELUDE + """
def stuck(prompts, completions, **kw):
    time.sleep(10**6)

stack = RewardStack([stuck], [1.0], timeout=10**5)
print("WORKER", stack._worker.process.pid, flush=True)
stack(["p"], ["a"], {})
"""
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    worker = int(trainer.stdout.readline().split()[1])
    time.sleep(0.5)  # the call is under way
    assert _alive(worker)
    trainer.kill()
    trainer.wait(10)
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its parent's wait is missing


def test_one_worker_serves_every_call_and_a_fresh_one_follows_a_timeout(monkeypatch):
    def maybe_hang(prompts, completions, **_):
        if "hang" in completions:
            time.sleep(10**6)
        return pid_reward(prompts, completions)

    stack = RewardStack([maybe_hang], [1.0], error_policy="zero", timeout=0.3)
    first = {stack(["p"], [text], {})[0].item() for text in "abcde"}
    assert len(first) == 1 and first != {float(os.getpid())}, "a persistent worker, not the trainer"
    assert stack(["p"], ["hang"], {}).tolist() == [0.0] and stack.failures == 1
    after = stack(["p"], ["a"], {})[0].item()
    assert after not in first and after != os.getpid()
    stack.close()
    assert stack._worker.process is None


def test_a_ctrl_c_in_the_trainer_mid_call_stops_the_worker_and_the_next_call_is_not_out_of_step():
    def slow_then_pid(prompts, completions, **_):
        if "slow" in completions:
            time.sleep(1.0)
            return [-1.0]
        return pid_reward(prompts, completions)

    stack = RewardStack([slow_then_pid], [1.0])
    before = stack(["p"], ["a"], {})[0].item()

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):  # a real Ctrl-C stays an interrupt of the trainer
            stack(["p"], ["slow"], {})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    after = stack(["p"], ["a"], {})[0].item()  # not the slow call's late -1.0
    assert after not in (before, -1.0)


# --- 2. a default timeout for user functions; podsrl's own run in the trainer ---------------------
@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_a_timeout_of_zero_or_less_means_the_default_for_user_functions(monkeypatch, timeout):
    assert RewardStack([crc_like], [1.0], timeout=timeout).user_timeout == DEFAULT_REWARD_TIMEOUT == 300.0
    monkeypatch.setattr(stack_module, "DEFAULT_REWARD_TIMEOUT", 0.3)
    with pytest.raises(RewardError, match=r"^reward function sleepy timed out after 0.3s on a batch of 1 "):
        RewardStack([sleepy], [1.0], timeout=timeout)(["p"], ["a"], {})


def test_podsrl_functions_run_in_the_trainer_and_user_functions_in_a_worker(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    task = build_jsonl(str(data), str(data))
    own = [*REWARDS.values(), task.correct_fn, task.format_fn]
    assert not any(runs_in_worker(fn) for fn in own)
    assert RewardStack(own, [1.0] * len(own))._worker is None, "no process for podsrl's own functions"
    assert all(runs_in_worker(fn) for fn in (crc_like, lambda prompts, completions, **_: [], sleepy))
    assert not runs_in_worker(in_process(lambda prompts, completions, **_: []))
    assert REWARDS["arithmetic_format"](["p"], ["Answer: 3"]) == [1.0]  # unchanged, called directly


# --- 3. SystemExit, KeyboardInterrupt and os._exit are failures of the function -----------------
EXITS = ["sys.exit(0)", "sys.exit(1)", "raise SystemExit", "raise KeyboardInterrupt", "os._exit(0)", "os._exit(3)",
         "os.kill(os.getpid(), signal.SIGKILL)"]


def _exiting(body: str):
    namespace = {"os": os, "sys": sys, "signal": signal, "faulthandler": faulthandler}
    exec(f"def exits(prompts, completions, **kw):\n    if 'bad' in completions:\n        {body}\n"
         f"    return [1.0] * len(completions)\n", namespace)
    return namespace["exits"]


@pytest.mark.parametrize("body", EXITS)
def test_exits_inside_a_function_are_its_failures_under_both_policies(body):
    with pytest.raises(RewardError, match=r"^reward function exits failed on prompt index 1 \(") as raised:
        RewardStack([_exiting(body)], [1.0])(["p"] * 3, ["ok", "bad", "ok"], {})
    assert "\n" not in str(raised.value)
    zero = RewardStack([_exiting(body)], [1.0], error_policy="zero")
    assert zero(["p"] * 3, ["ok", "bad", "ok"], {}).tolist() == [1.0, 0.0, 1.0] and zero.failures == 1
    assert zero(["p"], ["ok"], {}).tolist() == [1.0], "a fresh worker serves the next call"


@pytest.mark.parametrize("body", ["sys.exit(0)", "raise SystemExit(2)"])
def test_system_exit_in_a_function_run_in_the_trainer_is_a_failure_too(body):
    with pytest.raises(RewardError, match=r"exits failed on prompt index 0 \(SystemExit"):
        RewardStack([in_process(_exiting(body))], [1.0])(["p"], ["bad"], {})


# --- 4. return values ------------------------------------------------------------------------
def _returning(value):
    def returns(prompts, completions, **_):
        return value
    return returns


REFUSED = [  # what one completion's call returned, and how the error names it
    (["1.0"], "str '1.0' at index 0"), ("1", "returned str,"), ({"a": 1.0}, "returned dict,"),
    ([True], "bool True at index 0"), (np.array([False]), "bool False at index 0"), (None, "returned NoneType,"),
    ([[1.0]], r"list \[1.0\] at index 0"), ({1.0}, "returned set,"), ((x for x in [1.0]), "returned generator,"),
    (np.zeros((1, 1)), r"ndarray of shape \(1, 1\)"), (np.zeros(2), "returned 2 values for 1 completions"),
    (torch.zeros(2), "returned 2 values for 1 completions"), (torch.tensor(1.0), r"Tensor of shape \(\)"),
    ([1 + 2j], r"complex \(1\+2j\) at index 0"), ([float("inf")], "returned inf"), ([float("-inf")], "returned -inf"),
    (1.0, "returned float,"), ([], "returned 0 values for 1 completions"),
]


@pytest.mark.parametrize("where", ["worker", "trainer"])
@pytest.mark.parametrize("value, found", REFUSED, ids=[f"refused{i}" for i in range(len(REFUSED))])
def test_malformed_return_values_are_refused_naming_the_function_and_what_it_returned(value, found, where):
    fn = _returning(value) if where == "worker" else in_process(_returning(value))
    with pytest.raises(RewardError, match=f"^reward function returns failed on prompt index 0 .*{found}") as raised:
        RewardStack([fn], [1.0])(["p"], ["a"], {})
    assert "\n" not in str(raised.value)


ACCEPTED = [
    ([1, 2.5], [1.0, 2.5]), ((0.5, None), [0.5, None]), ([np.float32(0.5), np.int64(3)], [0.5, 3.0]),
    (np.array([0.25, -1.0]), [0.25, -1.0]), (torch.tensor([2.0, float("nan")]), [2.0, None]),
    ([float("nan"), None], [None, None]), ([torch.tensor(1.5), np.float64(-2.0)], [1.5, -2.0]),
]


@pytest.mark.parametrize("value, expected", ACCEPTED)
def test_numbers_in_lists_tuples_arrays_and_tensors_are_accepted(value, expected):
    rewards = RewardStack([_returning(value)], [2.0])(["p", "q"], ["a", "b"], {})
    assert [None if math.isnan(r) else r for r in rewards.tolist()] == [None if e is None else 2 * e for e in expected]


@pytest.mark.parametrize("policy", ["raise", "zero"])
def test_a_weighted_sum_past_float32_is_an_error_never_a_silent_inf(policy):
    """Every combination of large finite values and weights: the reward is within
    +/-REWARD_LIMIT (its group's mean and variance stay finite in float32), or the sample
    fails naming the functions that contributed to it."""
    rng = random.Random(0)
    magnitudes = [1e308, -1e308, 3e38, 2e38, -3e38, 1e38, 1e15, -1e16, 1.0, -5.0, 1e-300, None]
    for _ in range(60):
        values = [[rng.choice(magnitudes) for _ in range(4)] for _ in range(2)]
        weights = [rng.choice([10.0, 1.0, -1.0, 0.5]) for _ in range(2)]
        fns = [in_process(_returning(v)) for v in values]
        for fn, name in zip(fns, ("big", "small")):
            fn.__name__ = name
        sums = [_float32(sum(w * v[i] for w, v in zip(weights, values) if v[i] is not None)) for i in range(4)]
        bad = [i for i in range(4) if not abs(sums[i]) <= stack_module.REWARD_LIMIT
               and any(v[i] is not None for v in values)]
        stack = RewardStack(fns, weights, error_policy=policy)
        if bad and policy == "raise":
            names = [n for n, v in zip(("big", "small"), values) if v[bad[0]] is not None]
            plural = "s" if len(names) > 1 else ""
            with pytest.raises(RewardError, match=f"^reward function{plural} {', '.join(names)}: "
                                                  f"the weighted sum is .* on prompt "
                                                  f"index {bad[0]} "):
                stack(["p"] * 4, list("abcd"), {})
            continue
        rewards = stack(["p"] * 4, list("abcd"), {})
        assert not rewards.isinf().any() and stack.failures == len(bad)
        assert all(rewards[i] == 0.0 for i in bad)


def test_a_reward_of_1e38_is_refused_and_failures_never_count_as_applied():
    """1e38 is a finite float32, but a group of them has an infinite mean and variance: NaN
    advantages, null metrics and nothing trained. It is refused like an overflowing sum; under
    'zero' it, and every failure, scores 0 without counting as a reward that applied."""
    huge = in_process(_returning([1e38, 1.0]))
    with pytest.raises(RewardError, match=r"the weighted sum is 1e\+38 on prompt index 0 \(beyond \+/-1e\+15"):
        RewardStack([huge], [1.0])(["p", "q"], ["a", "b"], {})
    zero = RewardStack([huge], [1.0], error_policy="zero")
    assert zero(["p", "q"], ["a", "b"], {}).tolist() == [0.0, 1.0]
    assert (zero.failures, zero.applied) == (1, 1)

    def broken(prompts, completions, **kwargs):
        raise RuntimeError("down")

    failing = RewardStack([in_process(broken), in_process(_returning([None, None]))], [1.0, 1.0],
                          error_policy="zero")
    assert failing(["p", "q"], ["a", "b"], {}).tolist() == [0.0, 0.0]
    assert (failing.failures, failing.applied) == (2, 0)


def _float32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float64).float().item()


# --- the worker gets the inputs as they were, and gives the same rewards ---------------------------
def test_a_worker_gets_exactly_the_inputs_and_gives_the_rewards_of_the_trainer(tmp_path):
    record = tmp_path / "seen.pkl"

    def spy(prompts, completions, **kwargs):
        record.write_bytes(pickle.dumps({"prompts": prompts, "completions": completions,
                                         **{k: v for k, v in kwargs.items() if not callable(v)},
                                         "callbacks": {k: v(1, x=2) for k, v in kwargs.items() if callable(v)}}))
        return [float(len(str(c))) for c in completions]

    prompts = [[{"role": "user", "content": "1/3 in \u00e9"}], "plain text \x00"]
    completions = [[{"role": "assistant", "content": "0.333\u2026"}], ""]
    columns = {"completion_ids": [[1, 2, 9], []], "answer": [0.1, None],
               "meta": [{"k": [1, (2, 3)]}, {"k": float("nan")}]}
    state = TrainerProgress(global_step=3, max_steps=7, epoch=0.5)
    local = []
    shared = {"trainer_state": state, "log_extra": _not_recorded, "log_metric": lambda *a, **k: local.append(a)}
    in_worker = RewardStack([spy], [1.0])(prompts, completions, columns, shared)
    seen = pickle.loads(record.read_bytes())
    assert seen["prompts"] == prompts and seen["completions"] == completions
    assert seen["completion_ids"] == columns["completion_ids"] and seen["answer"] == [0.1, None]
    assert seen["meta"][0] == {"k": [1, (2, 3)]} and math.isnan(seen["meta"][1]["k"])
    assert seen["trainer_state"] == state
    assert seen["callbacks"] == {"log_extra": None, "log_metric": None}, "callbacks become no-ops there"
    in_trainer = RewardStack([in_process(spy)], [1.0])(prompts, completions, columns, shared)
    assert torch.equal(in_worker, in_trainer)


def test_inputs_that_cannot_reach_the_worker_are_a_reward_error_whatever_the_policy():
    for policy in ("raise", "zero"):
        with pytest.raises(RewardError, match="reward function crc_like: its inputs cannot be sent to its worker"):
            RewardStack([crc_like], [1.0], error_policy=policy)(["p"], ["a"], {"lock": [threading.Lock()]})


# --- 5. reward files cannot shadow modules ------------------------------------------------------
REWARD_FILE = "def reward(prompts, completions, **kw):\n    return [0.5] * len(completions)\n"


@pytest.mark.parametrize("stem", ["json", "random", "math", "pickle", "podsrl", "torch"])
def test_a_reward_file_named_like_a_module_does_not_shadow_it(tmp_path, stem):
    original = importlib.import_module(stem)
    path = tmp_path / f"{stem}.py"
    path.write_text(REWARD_FILE)
    fn = load_reward_fn(f"{path}:reward")
    assert sys.modules[stem] is original and fn.__module__ != stem
    assert load_reward_fn(f"{path}:reward") is fn, "the same file gives the same function"
    assert json.loads(json.dumps({"a": [1]})) == {"a": [1]}
    other = tmp_path / "elsewhere" / f"{stem}.py"
    other.parent.mkdir()
    other.write_text(REWARD_FILE)
    assert load_reward_fn(f"{other}:reward") is not fn, "another file of that name is another module"
    assert RewardStack([fn], [1.0])(["p"], ["a"], {}).tolist() == [0.5]


# --- 6. a reward module that fails to import is one line naming it ----------------------------------
@pytest.mark.parametrize("source, error", [
    ("def reward(:\n    pass\n", r"SyntaxError: .*line 1"),
    ("import no_such_module_podsrl_test\n",
     r"ModuleNotFoundError: No module named 'no_such_module_podsrl_test', line 1"),
    ("x = 1\ny = undefined_name\n", r"NameError: name 'undefined_name' is not defined, line 2"),
    ("\n\nraise RuntimeError('bad\\nconfig')\n", r"RuntimeError: bad config, line 3"),
    ("import sys\nsys.exit(3)\n", r"SystemExit: 3, line 2"),
    ("1 / 0\n", r"ZeroDivisionError: division by zero, line 1"),
    ("from json import no_such_name\n", r"ImportError: cannot import name 'no_such_name' from 'json'"),
])
def test_a_reward_file_that_fails_to_import_is_one_line_naming_it(tmp_path, monkeypatch, source, error):
    monkeypatch.chdir(tmp_path)
    Path("my_rewards.py").write_text(source)
    with pytest.raises(ValueError, match=r"^reward_funcs: cannot load \./my_rewards\.py \(" + error) as raised:
        load_reward_fn("./my_rewards.py:reward")
    assert "\n" not in str(raised.value)
    Path("my_rewards.py").write_text(REWARD_FILE)  # fixed: loads now (nothing half-loaded is kept)
    assert load_reward_fn("./my_rewards.py:reward")(["p"], ["a"]) == [0.5]


def test_a_reward_module_that_fails_to_import_is_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / "failing_rewards_pkg.py").write_text("import sys\nsys.exit('no GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"^reward_funcs: cannot import module 'failing_rewards_pkg' "
                                         r"\(SystemExit: no GPU\)$"):
        load_reward_fn("failing_rewards_pkg:reward")


# --- 7. every failure under 'raise' is a one-line RewardError -------------------------------------
def _raises_multiline(prompts, completions, **_):
    raise ValueError("first line\nsecond line")


@pytest.mark.parametrize("fn", [_raises_multiline,
                                _exiting("faulthandler.disable(); os.kill(os.getpid(), signal.SIGSEGV)"),
                                _returning("x"), _returning([1e308]), sleepy,
                                in_process(_raises_multiline), in_process(_returning([float("nan"), 1.0, 2.0]))])
def test_every_failure_is_a_one_line_reward_error(fn):
    with pytest.raises(RewardError) as raised:
        RewardStack([fn], [10.0], timeout=0.3)(["p"], ["bad"], {})
    assert "\n" not in str(raised.value) and str(raised.value).startswith("reward function")

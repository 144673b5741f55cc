"""Shared fixtures: the shipped tiny model, and a tiny *random* model (built in seconds,
saved as an HF folder)."""

import signal
import zlib

import pytest
import torch

from podsrl.build.tiny import make_model, train_tokenizer
from podsrl.models import load_model
from podsrl.provenance import machine_description
from podsrl.tasks import TASKS, Task
from podsrl.tasks.arithmetic import build_arithmetic
from podsrl.trainer.config import make_config


@pytest.fixture(scope="module")
def tiny():
    """The shipped tiny model, loaded once per test module (tests may switch it to eval)."""
    return load_model("tiny")


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    task = build_arithmetic(level=3, num_train=500, num_test=50, seed=0)
    tokenizer = train_tokenizer([ex.prompt + f"Answer: {ex.answer}" for ex in task.train] + ["-"])
    model = make_model(tokenizer, hidden_size=32, num_layers=2, seed=0)
    path = tmp_path_factory.mktemp("random_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def pytest_report_header(config):
    return f"machine: {machine_description()}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The machine and its CPU kind below the summary too (the suite runs with -q, which drops
    the header): bfloat16's speed and rounding differ between AVX2, AVX-512 BF16 and AMX CPUs,
    and CI runs on whichever kind the submitter has, so a report says which one it ran on."""
    terminalreporter.write_line(f"machine: {machine_description()}")


@pytest.fixture(autouse=True)
def _two_threads(monkeypatch):
    # the same thread count everywhere keeps float reductions, and so runs, reproducible: a run's
    # own count follows the free cores unless fixed (podsrl.trainer.cores), so fix it for runs in
    # this process and in the processes the tests start
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")


def crc_parity(prompts, completions, **_columns):
    """A reward a random model earns half the time: parity of the completion's CRC32.
    It gives every group reward variance, hence non-zero advantages and real gradients."""
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


def _parity_task(options, with_train=True):
    task = build_arithmetic(level=3, num_train=200, num_test=options.eval_prompts, seed=options.data_seed)
    return Task(name="parity", train=task.train, test=task.test, correct_fn=crc_parity, format_fn=crc_parity,
                extract_fn=lambda completion: completion)


TASKS["parity"] = _parity_task  # registered by name, as users register their own tasks


def quick(model_dir, output_dir, **overrides):
    """A run of two steps on the parity task, checkpointing every step: seconds on a tiny model."""
    values = dict(model=model_dir, max_steps=2, prompts_per_step=4, num_generations=6, num_kept=3,
                  max_completion_length=6, eval_prompts=8, eval_samples=1, eval_steps=0, save_steps=1,
                  progress=False, output_dir=str(output_dir), learning_rate=1e-3, warmup_steps=0, task="parity")
    values.update(overrides)
    return make_config(overrides={k: str(v) for k, v in values.items()})


def default_signals() -> None:
    """For subprocess's ``preexec_fn`` in a test that signals its child: the child starts with
    SIGINT and SIGTERM at their default dispositions, whatever this process inherited. A shell
    starts a background job (``pytest ... &`` in a script) with SIGINT ignored, and an ignored
    signal stays ignored across exec, so the test's Ctrl-C would never arrive (subprocess's
    ``restore_signals`` restores only SIGPIPE, SIGXFZ and SIGXFSZ)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)

"""Fault injection: run `podsrl train` (or `podsrl export`, where a case says so) through a
catalogue of bad inputs and faults, each in a fresh process with a deadline, and judge how each ended.

Verdicts: `clean error` (non-zero exit, a one-line `podsrl train: ...` message, no traceback),
`handled` (the run went on or finished as documented), `traceback`, `hang` (killed at the
deadline), `silent` (exit 0 where the input should have been refused, or without the warning
the case expects), `data lost` (a file
that existed before the case changed or vanished), `wrong: ...` (it ended as expected but
left something other than what the case checks afterwards). Target: only the first two.

    python benchmarks/fault_catalogue.py [--only SUBSTRING] [--deadline 120] [--jobs 2] [--record NAME]

Each case works in its own temporary folder; the tiny built-in model keeps a case to seconds, and
``--jobs`` cases run at once (the cases find their processes by their own folders, not by name).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

from podsrl.models.loading import TINY_DIR  # noqa: E402
from podsrl.provenance import machine_description  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "data"
JSONL = ["--task", "jsonl", "--prompt_column", "question", "--answer_column", "answer"]
QUICK = ["--max_steps", "2", "--prompts_per_step", "4", "--num_generations", "4", "--num_kept", "2",
         "--max_completion_length", "6", "--eval_prompts", "8", "--eval_samples", "1", "--eval_steps", "0",
         "--save_steps", "1", "--progress", "false"]
EVAL = ["--eval_prompts", "8", "--eval_samples", "1", "--max_completion_length", "6"]  # podsrl eval's, quick
# podsrl compare's, quick (#57's): one pods arm, one seed, two steps
COMPARE = ["--methods", "pods", "--seeds", "1", "--budget_steps", "2", "--eval_prompts", "20", "--eval_samples", "1",
           "--prompts_per_step", "4", "--num_generations", "8", "--num_kept", "4", "--max_completion_length", "6",
           "--progress", "false"]


@dataclass
class Case:
    name: str
    fault: str  # the class: output folder, resume, reward, numbers, files
    expect: str  # "refuse" (a clean error) or "succeed" (handled)
    args: Callable[[Path], list[str]]  # podsrl train options, given the case's folder
    prepare: Callable[[Path], None] = lambda work: None
    protected: Callable[[Path], list[Path]] = lambda work: []  # files that must survive unchanged
    background: list[str] = field(default_factory=list)  # a process started first (a lock holder)
    command: str = "train"  # the podsrl subcommand run: train (after QUICK's options), export, eval, compare
    file_size_limit: int = 0  # bytes any file may grow to (RLIMIT_FSIZE): a full disk as writes see it; 0 = none
    venv: str = ""  # the environment whose podsrl runs the case, in the repository ('' = this one's)
    after: Callable[[Path], str] = lambda work: ""  # what is wrong with what the case left, in words ('' = nothing)
    says: str = ""  # text stderr must hold (a handled case's warning, a refusal's cause), else silent / wrong
    # a program other than podsrl: its argv before args (scripts in the repository, run with the
    # case's Python; "accelerate" = that environment's launcher), and how its clean error begins
    program: tuple[str, ...] = ()
    error_prefix: str = ""

    def clean_error_prefix(self) -> str:
        return self.error_prefix or f"podsrl {self.command}:"

    def argv(self, work: Path) -> list[str]:
        if not self.program:
            options = [*QUICK, *self.args(work)] if self.command == "train" else self.args(work)
            return [*podsrl_command(self.venv), self.command, *options]
        python = REPO / self.venv / "bin" / "python" if self.venv else Path(sys.executable)
        head = [str(python.parent / "accelerate") if part == "accelerate" else str(REPO / part)
                if part.endswith(".py") else part for part in self.program]
        return [*([] if head[0].endswith("accelerate") else [str(python)]), *head, *self.args(work)]


def podsrl_command(venv: str = "") -> list[str]:
    """The installed `podsrl` command, as users run it (`python -m` would put the case's
    folder first on sys.path, so a reward file named json.py there would shadow json for
    Python itself, podsrl or not); ``venv``: that environment's (vLLM's lives in .venv-vllm)."""
    python = REPO / venv / "bin" / "python" if venv else Path(sys.executable)
    script = python.parent / "podsrl"
    return [str(script)] if script.exists() else [str(python), "-m", "podsrl.cli"]


def finished_run(work: Path) -> None:
    _train(["--output_dir", str(work / "run")])


def stopped_run(work: Path) -> None:
    """What a run leaves when it stops before its first checkpoint (its start files and logs):
    a finished run without its checkpoints, model, summary and plot."""
    finished_run(work)
    shutil.rmtree(work / "run" / "checkpoints")
    shutil.rmtree(work / "run" / "model")
    for name in ("summary.json", "accuracy.png"):
        (work / "run" / name).unlink()


def killed_run(work: Path) -> None:
    """What a run killed after its last checkpoint leaves: a finished run without its model,
    summary and plot."""
    finished_run(work)
    shutil.rmtree(work / "run" / "model")
    for name in ("summary.json", "accuracy.png"):
        (work / "run" / name).unlink()


def older_checkpoints(work: Path) -> None:
    """A finished run whose checkpoints an older podsrl wrote: no parts.pt (before 2026-11-28)."""
    finished_run(work)
    for parts in (work / "run" / "checkpoints").glob("step_*/parts.pt"):
        parts.unlink()


def compared(work: Path, *extra: str) -> list[str]:
    """podsrl compare's options for a quick comparison in work/cmp."""
    return [*COMPARE, "--output_dir", str(work / "cmp"), *extra]


def finished_comparison(work: Path) -> None:
    subprocess.run([*podsrl_command(), "compare", *compared(work)], check=True, capture_output=True, text=True,
                   timeout=600)


def another_start(run: Path) -> None:
    """A copied run folder made another run: its first start a second later (a copy is the same
    run, which podsrl plot counts once)."""
    entries = json.loads((run / "environment.json").read_text())
    entries[0]["unix_time"] += 1.0
    (run / "environment.json").write_text(json.dumps(entries, indent=2))


def runs_one_without_evaluations(work: Path) -> None:
    """Two finished runs in work/runs, the second's log stripped of its evaluations."""
    finished_run(work)
    (work / "runs").mkdir()
    shutil.move(work / "run", work / "runs" / "a")
    shutil.copytree(work / "runs" / "a", work / "runs" / "b")
    another_start(work / "runs" / "b")
    records = [json.loads(line) for line in (work / "runs" / "b" / "metrics.jsonl").read_text().splitlines()]
    (work / "runs" / "b" / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if not k.startswith("eval_")}) + "\n" for r in records))


def two_smollm2_conversions(work: Path) -> None:
    """Two finished runs in work/runs recorded as SmolLM2's: one of podsrl before #57 (no EOS
    recorded: the old conversion's, <|im_start|>), one of the fixed conversion (EOS id 2). The
    tiny model stands in for SmolLM2 (the check reads what the runs recorded, not the weights)."""
    runs_one_without_evaluations(work)
    shutil.rmtree(work / "runs" / "b")
    shutil.copytree(work / "runs" / "a", work / "runs" / "b")
    another_start(work / "runs" / "b")
    for name, eos in (("a", {}), ("b", {"eos_token_id": 2, "eos_token": "<|im_end|>"})):
        run = work / "runs" / name
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "model": "smollm2-135m-instruct",
                                                     "method": "pods" if name == "b" else "grpo"}, indent=2))
        entries = json.loads((run / "environment.json").read_text())
        (run / "environment.json").write_text(json.dumps(
            [{**{k: v for k, v in e.items() if not k.startswith("eos_")}, **eos} for e in entries], indent=2))


def exported_run(work: Path) -> None:
    """A finished run and its export in work/hf."""
    finished_run(work)
    subprocess.run([*podsrl_command(), "export", str(work / "run"), str(work / "hf")], check=True,
                   capture_output=True, text=True, timeout=600)


def linked_export(work: Path) -> None:
    """An export in work/hf holding a user's my_eval.csv, and a link work/lnk to it."""
    exported_run(work)
    (work / "hf" / "my_eval.csv").write_text("prompt,correct\n")
    (work / "lnk").symlink_to("hf")


def link_kept(work: Path) -> str:
    """What is wrong after an export onto work/lnk: the link replaced, or a hidden leftover beside it."""
    hidden = sorted(p.name for p in work.iterdir() if p.name.startswith("."))
    return ("lnk is no longer a link" if not (work / "lnk").is_symlink() else
            f"left {', '.join(hidden)}" if hidden else "")


def umask_modes(folder_mode: int = 0):
    """What is wrong with work/hf's permissions: the folder not ``folder_mode`` (0: the umask's),
    an exported file not the umask's."""
    def check(work: Path) -> str:
        mask = os.umask(0o022)
        os.umask(mask)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [work / "hf", *(work / "hf").iterdir()]}
        wanted = {name: 0o666 & ~mask for name in modes} | {"hf": folder_mode or 0o777 & ~mask}
        return ", ".join(f"{name} {oct(modes[name])}, not {oct(wanted[name])}" for name in modes
                         if modes[name] != wanted[name])
    return check


def child_setup(limit: int):
    """For subprocess's preexec_fn: SIGINT and SIGTERM at their default dispositions (the cases'
    Ctrl-C and SIGTERM must arrive even when the catalogue runs as a background job, which a
    shell starts with SIGINT ignored, kept so across exec); with ``limit``, files stop growing at
    ``limit`` bytes (writes fail with EFBIG, as with ENOSPC on a full disk; SIGXFSZ ignored, so
    it is an error, not a kill)."""
    def apply() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        if limit:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _train(options: list[str]) -> None:
    subprocess.run([*podsrl_command(), "train", *QUICK, *options], check=True,
                   capture_output=True, text=True, timeout=600)


def reward_file(source: str, name: str = "my_rewards.py"):
    def prepare(work: Path) -> None:
        (work / name).write_text(textwrap.dedent(source))
    return prepare


def damaged_model(damage: Callable[[Path], None]):
    def prepare(work: Path) -> None:
        shutil.copytree(TINY_DIR, work / "model")
        damage(work / "model")
    return prepare


def truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def run_files(work: Path) -> list[Path]:
    return [p for p in (work / "run").rglob("*") if p.is_file() and p.name != ".podsrl.lock"]


def out(work: Path, *extra: str) -> list[str]:
    return ["--output_dir", str(work / "run"), *extra]


def reward_case(name: str, body: str, policy: str = "raise", file: str = "my_rewards.py", expect: str = "refuse"):
    source = f"import os, sys, time\ndef reward(prompts, completions, **kw):\n    {body}\n"
    return Case(name, "reward", expect, lambda w: out(w, "--reward_funcs", f"{w / file}:reward", "--reward_timeout",
                                                      "3", "--reward_error_policy", policy),
                reward_file(source, file))


def train_file(work: Path, name: str) -> list[str]:
    """Options of a jsonl-task run training on work/NAME, held out on the examples' test file."""
    return out(work, *JSONL, "--train_data", str(work / name), "--test_data", str(EXAMPLES / "sums_test.jsonl"))


def ctrl_c_after(seconds: float) -> list[str]:
    """A background process that sends the case's podsrl process (found by its working folder)
    a SIGINT, as a Ctrl-C does, ``seconds`` after it started."""
    watcher = ("import os, signal, sys, time\nwork = os.path.realpath(sys.argv[1])\nprint('watching', flush=True)\n"
               "while True:\n    for pid in filter(str.isdigit, os.listdir('/proc')):\n        try:\n"
               "            found = os.readlink(f'/proc/{pid}/cwd') == work\n        except OSError:\n"
               "            continue\n        if found:\n"
               f"            time.sleep({seconds})\n            os.kill(int(pid), signal.SIGINT)\n"
               "            time.sleep(600)\n    time.sleep(0.01)\n")
    return ["-c", watcher]


def extension_case(name: str, field: str, source: str, attr: str = "component", expect: str = "refuse"):
    """A user's component for ``field`` in ext.py (``misbehave()`` fails or hangs on the second
    call as ``source`` asks; ``hang()`` sends the run a SIGTERM first, as a scheduler would)."""
    helpers = ("import os, signal, sys, time\nimport torch\ncalls = [0]\n"
               "def second():\n    calls[0] += 1\n    return calls[0] == 2\n"
               "def hang(pid=None):\n    os.kill(pid or os.getpid(), signal.SIGTERM)\n    time.sleep(10**6)\n")
    return Case(name, "extension", expect, lambda w: out(w, f"--{field}", f"{w / 'ext.py'}:{attr}"),
                reward_file(helpers + textwrap.dedent(source), "ext.py"))


CAPPED_ENGINE = "from podsrl.rollout import HFEngine\nclass MyEngine(HFEngine):\n    pass\n"


def capped_engine(work: Path, cap: str) -> list[str]:
    """A run generating with a user's engine (a subclass of HFEngine) under a memory cap."""
    return out(work, "--generation_engine", f"{work / 'ext.py'}:MyEngine", "--generation_memory_mb", cap)


def engine_over_its_cap(work: Path) -> None:
    """A run whose user engine went over its memory cap in step 1, as the advice then finds it."""
    reward_file(CAPPED_ENGINE, "ext.py")(work)
    subprocess.run([*podsrl_command(), "train", *QUICK, *capped_engine(work, "0.001")], cwd=work,
                   capture_output=True, text=True, timeout=600, preexec_fn=child_setup(0))


# #69: bounds, contracts, messages and evaluation's terms
EARLY_STOP = ["--group_early_stop", "true", "--generation_engine", "slots", "--generation_schedule", "round_robin",
              "--generation_micro_group", "4"]


def bounded_reward(bounds: str, value: str = "0.5") -> Callable[[Path], None]:
    """my_rewards.py: a reward declaring ``bounds`` (source text) and returning ``value``."""
    return reward_file(f"def reward(prompts, completions, **kw):\n    return [{value}] * len(completions)\n"
                       f"reward.reward_bounds = {bounds}\n")


def bounded_case(name: str, bounds: str, value: str = "0.5") -> "Case":
    return Case(name, "reward", "refuse", lambda w: out(w, "--reward_funcs", f"{w / 'my_rewards.py'}:reward",
                                                        *EARLY_STOP), bounded_reward(bounds, value))


def two_runs(work: Path) -> None:
    finished_run(work)
    _train(["--output_dir", str(work / "other")])


def no_nan_in_report(folder: str) -> Callable[[Path], str]:
    def check(work: Path) -> str:
        report = work / folder / "compare.md"
        return "" if report.exists() and "nan" not in report.read_text().lower() else f"{report}: nan or missing"
    return check


def nan_evaluation(work: Path) -> None:
    """Two finished runs in work/runs (seeds of one arm), the second's evaluations after step 0 logged as NaN."""
    finished_run(work)
    (work / "runs").mkdir()
    shutil.move(work / "run", work / "runs" / "a")
    shutil.copytree(work / "runs" / "a", work / "runs" / "b")
    another_start(work / "runs" / "b")
    metrics = work / "runs" / "b" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    records = [{**r, "eval_accuracy": float("nan")} if "eval_accuracy" in r and r["step"] else r for r in records]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))


def live_run(work: Path) -> None:
    """A run folder as a run in progress leaves it: no final model yet."""
    killed_run(work)


def _lock_holder() -> list[str]:
    return ["-c", "import sys, time; from pathlib import Path; from podsrl.run_folder.claim import RunLock; "
                  "RunLock(Path(sys.argv[1]) / 'run').acquire(); print('locked', flush=True); time.sleep(600)"]


RULE = "from podsrl.algorithms.select import max_variance\ndef component(rewards, m, generator=None):\n"
ESTIMATOR = ("from podsrl.algorithms.advantages import group_advantages\n"
             "def component(rewards, scale_by_std):\n")
LOSS = ("from podsrl.algorithms.loss import sequence_mean\n"
        "def component(per_token, mask, num_sequences, num_tokens):\n")
SELECTOR = ("from podsrl.prompt_selection import ShuffledPass\nclass component(ShuffledPass):\n"
            "    def take(self, count, step=0, group_size=0):\n        taken = super().take(count, step, group_size)\n")
ENGINE = ("from podsrl.rollout import HFEngine\nclass component(HFEngine):\n"
          "    def __call__(self, *args, **kwargs):\n        made = super().__call__(*args, **kwargs)\n")
REQUIRED_ALPHA = ("from podsrl.algorithms.select import max_variance\n"
                  "def rule(rewards, m, generator=None, *, alpha):\n    return max_variance(rewards, m)\n")
EXTENSION_CASES = [
    extension_case("rule returns [P, 1]", "downsampling_rule", RULE + "    return max_variance(rewards, m)[:, :1]\n"),
    extension_case("rule returns [P, m + 2]", "downsampling_rule",
                   RULE + "    return torch.zeros(rewards.shape[0], m + 2, dtype=torch.long)\n"),
    extension_case("rule repeats an index", "downsampling_rule",
                   RULE + "    return torch.zeros(rewards.shape[0], m, dtype=torch.long)\n"),
    extension_case("rule returns an out-of-range index", "downsampling_rule",
                   RULE + "    return max_variance(rewards, m) + rewards.shape[1]\n"),
    extension_case("rule returns negative indices", "downsampling_rule",
                   RULE + "    return -1 - max_variance(rewards, m)\n"),
    extension_case("rule returns floats", "downsampling_rule", RULE + "    return max_variance(rewards, m).float()\n"),
    extension_case("rule returns a list", "downsampling_rule", RULE + "    return max_variance(rewards, m).tolist()\n"),
    extension_case("rule takes one argument", "downsampling_rule", "def component(rewards):\n    return rewards\n"),
    extension_case("rule raises in step 2", "downsampling_rule",
                   RULE + "    if second():\n        raise RuntimeError('boom')\n"
                          "    return max_variance(rewards, m)\n"),
    extension_case("rule hangs, then SIGTERM", "downsampling_rule",
                   RULE + "    if second():\n        hang()\n    return max_variance(rewards, m)\n"),
    extension_case("estimator returns NaN", "advantage_estimator", ESTIMATOR + "    return rewards * float('nan')\n"),
    extension_case("estimator returns the wrong shape", "advantage_estimator",
                   ESTIMATOR + "    return rewards[:, :1]\n"),
    extension_case("estimator calls sys.exit", "advantage_estimator", ESTIMATOR + "    sys.exit(0)\n"),
    extension_case("estimator hangs, then SIGTERM", "advantage_estimator",
                   ESTIMATOR + "    if second():\n        hang()\n"
                               "    return group_advantages(rewards, scale_by_std)\n"),
    extension_case("loss returns NaN", "loss_type", LOSS + "    return per_token.sum() * float('nan')\n"),
    extension_case("loss returns a vector", "loss_type", LOSS + "    return per_token.sum(1)\n"),
    extension_case("loss detached", "loss_type", LOSS + "    return per_token.sum().detach()\n"),
    extension_case("loss hangs, then SIGTERM", "loss_type",
                   LOSS + "    if second():\n        hang()\n    return sequence_mean(per_token, mask, num_sequences, "
                          "num_tokens)\n"),
    extension_case("selector takes too few", "prompt_selector", SELECTOR + "        return taken[:1]\n"),
    extension_case("selector takes a negative index", "prompt_selector",
                   SELECTOR + "        return [-1] + taken[1:]\n"),
    extension_case("selector takes an out-of-range index", "prompt_selector",
                   SELECTOR + "        return [10**6] + taken[1:]\n"),
    extension_case("selector records 'loss'", "prompt_selector",
                   SELECTOR + "        return taken\n    def record(self):\n        return {'loss': 0.0}\n"),
    extension_case("selector state not JSON", "prompt_selector",
                   SELECTOR + "        return taken\n    def state_dict(self):\n        return {'rng': object()}\n"),
    extension_case("selector hangs, then SIGTERM", "prompt_selector",
                   SELECTOR + "        if second():\n            hang()\n        return taken\n"),
    extension_case("engine returns too few groups", "generation_engine",
                   ENGINE + "        return made.at_prompts([0])\n"),
    extension_case("engine hangs, then SIGTERM", "generation_engine",
                   ENGINE + "        if second():\n            hang()\n        return made\n"),
    extension_case("reward hangs, then SIGTERM to the trainer", "reward_funcs",
                   "def component(prompts, completions, **kw):\n    if second():\n        hang(os.getppid())\n"
                   "    return [0.5] * len(completions)\n"),
    extension_case("reward without TRL's signature", "reward_funcs",
                   "def component(completions):\n    return [0.5] * len(completions)\n"),
]


CASES = [
    # 1. output folders
    Case("output_dir empty", "output folder", "refuse", lambda w: ["--output_dir", ""]),
    Case("output_dir is a file", "output folder", "refuse", lambda w: ["--output_dir", str(w / "notes.txt")],
         lambda w: (w / "notes.txt").write_text("notes"), lambda w: [w / "notes.txt"]),
    Case("output_dir is a model folder", "output folder", "refuse", lambda w: ["--output_dir", str(w / "model")],
         damaged_model(lambda folder: None), lambda w: list((w / "model").iterdir())),
    Case("output_dir is the current folder with files", "output folder", "refuse", lambda w: ["--output_dir", "."],
         lambda w: (w / "thesis.tex").write_text("x"), lambda w: [w / "thesis.tex"]),
    Case("output_dir holds a finished run", "output folder", "refuse", out, finished_run, run_files),
    Case("a second process on a locked folder", "output folder", "refuse", out, protected=run_files,
         background=["-c", "import sys, time; from pathlib import Path; from podsrl.run_folder.claim import RunLock; "
                     "RunLock(Path(sys.argv[1]) / 'run').acquire(); print('locked', flush=True); time.sleep(600)"]),
    Case("a stale lock of a killed run, then resume", "output folder", "succeed", lambda w: out(w, "--resume", "true",
         "--max_steps", "3"),
         lambda w: (finished_run(w), (w / "run" / ".podsrl.lock").write_text("pid 999999 on gone, started then\n"))),
    # 2. resume
    Case("resume, no checkpoint", "resume", "refuse", lambda w: out(w, "--resume", "true", "--max_steps", "3"),
         lambda w: (finished_run(w), shutil.rmtree(w / "run" / "checkpoints")), run_files),
    Case("resume, every checkpoint corrupt", "resume", "refuse",
         lambda w: out(w, "--resume", "true", "--max_steps", "3"),
         lambda w: (finished_run(w), [truncate(p, 0.5) for p in (w / "run" / "checkpoints").rglob("trainable.pt")]),
         run_files),
    Case("resume with another learning rate", "resume", "refuse",
         lambda w: out(w, "--resume", "true", "--learning_rate", "0.5"), finished_run, run_files),
    Case("resume with LoRA switched on", "resume", "refuse", lambda w: out(w, "--resume", "true", "--lora_rank", "4"),
         finished_run, run_files),
    Case("resume of a nonexistent run", "resume", "refuse", lambda w: out(w, "--resume", "true")),
    Case("resume after a cut-off metrics line", "resume", "succeed",
         lambda w: out(w, "--resume", "true", "--max_steps", "3"),
         lambda w: (finished_run(w), open(w / "run" / "metrics.jsonl", "a").write('{"step": 3, "rew'))),
    Case("resume of a finished run", "resume", "succeed", lambda w: out(w, "--resume", "true"), finished_run,
         lambda w: [p for p in run_files(w) if p.name not in ("environment.json", "config.json")]),
    # 3. reward functions
    reward_case("reward hangs", "time.sleep(10**6)"),
    reward_case("reward hangs, zero policy (no reward ever applies)", "time.sleep(10**6)", policy="zero"),
    reward_case("reward calls sys.exit(0)", "sys.exit(0)"),
    reward_case("reward raises KeyboardInterrupt", "raise KeyboardInterrupt"),
    reward_case("reward calls os._exit(0)", "os._exit(0)"),
    reward_case("reward returns strings", "return ['1.0'] * len(completions)"),
    reward_case("reward returns dicts", "return [{'r': 1}] * len(completions)"),
    reward_case("reward returns bools", "return [True] * len(completions)"),
    reward_case("reward returns too few", "return [1.0]"),
    reward_case("reward returns None", "return None"),
    reward_case("reward overflows", "return [1e308] * len(completions)"),
    Case("reward file named json.py", "reward", "succeed",
         lambda w: out(w, "--reward_funcs", f"{w / 'json.py'}:reward"),
         reward_file("def reward(prompts, completions, **kw):\n    return [len(c) / 10 for c in completions]\n",
                     "json.py")),
    Case("reward file with a syntax error", "reward", "refuse", lambda w: out(w, "--reward_funcs",
                                                                            f"{w / 'bad.py'}:reward"),
         reward_file("def reward(:\n", "bad.py")),
    Case("reward file raising at import", "reward", "refuse",
         lambda w: out(w, "--reward_funcs", f"{w / 'bad.py'}:reward"), reward_file("raise RuntimeError('boom')\n",
                                                                                    "bad.py")),
    # 4. numbers
    *[Case(f"{field_name} {value}", "numbers", "refuse", lambda w, f=field_name, v=value: out(w, f"--{f}", v))
      for field_name, value in [("learning_rate", "nan"), ("temperature", "inf"), ("warmup_steps", "nan"),
                                ("correct_weight", "inf"), ("reward_weights", "nan"), ("lora_dropout", "1.0"),
                                ("seed", "-1"), ("seed", str(2 ** 64)), ("num_kept", "1"), ("dtype", "float16"),
                                ("top_p", "0"), ("max_grad_norm", "-1")]],
    # 5. files
    Case("model weights truncated", "files", "refuse", lambda w: out(w, "--model", str(w / "model")),
         damaged_model(lambda f: truncate(f / "model.safetensors", 0.5))),
    Case("model folder without a tokenizer", "files", "refuse", lambda w: out(w, "--model", str(w / "model")),
         damaged_model(lambda f: [(f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")])),
    Case("model weights only pickled", "files", "refuse", lambda w: out(w, "--model", str(w / "model")),
         damaged_model(lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"))),
    # 6. extensions: rules, estimators, losses, prompt selectors, engines, rewards
    *EXTENSION_CASES,
    # 7. dead ends, runs that learned nothing, inputs worth a warning
    Case("re-run of a run that stopped before its first checkpoint", "dead end", "succeed", out, stopped_run),
    Case("resume of a run that stopped before its first checkpoint", "dead end", "refuse",
         lambda w: out(w, "--resume", "true"), stopped_run, run_files),
    Case("re-run beside a cut-off config.json", "dead end", "succeed", out,
         lambda w: ((w / "run").mkdir(), (w / "run" / "config.json").write_text('{\n  "model": "ti'))),
    Case("pass_rate pool smaller than prompts_per_step", "dead end", "refuse",
         lambda w: out(w, "--prompt_selector", "pass_rate", "--max_train_prompts", "2")),
    reward_case("no reward ever applies (NaN)", "return [float('nan')] * len(completions)"),
    reward_case("every reward call fails, zero policy", "raise RuntimeError('boom')", policy="zero"),
    Case("train file is the test file", "warning", "succeed",
         lambda w: out(w, *JSONL, "--train_data", str(EXAMPLES / "sums_test.jsonl"), "--test_data",
                       str(EXAMPLES / "sums_test.jsonl"))),
    Case("eval_prompts above the test set", "warning", "succeed",
         lambda w: out(w, *JSONL, "--train_data", str(EXAMPLES / "sums_train.jsonl"), "--test_data",
                       str(EXAMPLES / "sums_test.jsonl"), "--eval_prompts", "100000")),
    Case("a key twice in a YAML config", "warning", "refuse", lambda w: out(w, "--config", str(w / "twice.yaml")),
         lambda w: (w / "twice.yaml").write_text("learning_rate: 1e-3\nlearning_rate: 2e-3\n")),
    # #50: config, components, held-out data and resume
    Case("a key twice in a YAML flow mapping", "config", "refuse", lambda w: out(w, "--config", str(w / "flow.yaml")),
         lambda w: (w / "flow.yaml").write_text("downsampling_rule: {name: random, name: max_variance}\n")),
    Case("a key twice in a component's JSON", "config", "refuse",
         lambda w: out(w, "--downsampling_rule", '{"name": "random", "name": "max_variance"}')),
    Case("advantage estimator eps -1", "components", "refuse",
         lambda w: out(w, "--advantage_estimator", '{"name": "group", "eps": -1}')),
    Case("a keyword-only argument of a user rule", "components", "succeed",
         lambda w: out(w, "--downsampling_rule", json.dumps({"name": f"{w / 'kw.py'}:rule", "alpha": 2})),
         reward_file("from podsrl.algorithms.select import max_variance\n"
                     "def rule(rewards, m, generator=None, *, alpha=1.0):\n    return max_variance(rewards, m)\n",
                     "kw.py")),
    Case("a keyword-only argument without a default of a user rule, set", "components", "succeed",
         lambda w: out(w, "--downsampling_rule", json.dumps({"name": f"{w / 'kw.py'}:rule", "alpha": 2})),
         reward_file(REQUIRED_ALPHA, "kw.py")),
    Case("a keyword-only argument without a default of a user rule, not set", "components", "refuse",
         lambda w: out(w, "--downsampling_rule", f"{w / 'kw.py'}:rule"), reward_file(REQUIRED_ALPHA, "kw.py")),
    Case("reward_funcs: a name, then a JSON mapping with arguments", "components", "succeed",
         lambda w: out(w, "--reward_funcs", f'arithmetic_correct,{{"name": "{w / "kw.py"}:reward", "bonus": 2}}'),
         reward_file("def reward(prompts, completions, bonus=1.0, **kw):\n    return [bonus * len(c) / 10 for c in "
                     "completions]\n", "kw.py")),
    Case("test prompts a reordered subset of the train prompts", "warning", "succeed",
         lambda w: out(w, *JSONL, "--train_data", str(EXAMPLES / "sums_train.jsonl"), "--test_data",
                       str(w / "subset.jsonl")),
         lambda w: (w / "subset.jsonl").write_text(
             "".join((EXAMPLES / "sums_train.jsonl").read_text().splitlines(keepends=True)[7::-1]))),
    Case("resume from another prompt selector's checkpoints", "resume", "refuse",
         lambda w: out(w, "--resume", "true", "--prompt_selector", "pass_rate"),
         lambda w: (finished_run(w), (w / "run" / "config.json").write_text(json.dumps(
             {**json.loads((w / "run" / "config.json").read_text()), "prompt_selector": "pass_rate"}))), run_files),
    Case("a second eval in the default folder", "eval", "succeed", lambda w: [*EVAL, "--eval_temperature", "0"],
         lambda w: subprocess.run([*podsrl_command(), "eval", *EVAL], cwd=w, check=True, capture_output=True,
                                  timeout=600),
         lambda w: [p for p in (w / "runs").rglob("*") if p.is_file()], command="eval"),
    Case("compare with a JSON rule with arguments beside a name", "compare", "succeed",
         lambda w: ["--methods", "pods", "--seeds", "1", "--budget_minutes", "0.02", "--output_dir", str(w / "cmp"),
                    "--rules", f'max_variance,{{"name": "{w / "kw.py"}:rule", "alpha": 2}}', *QUICK[2:14]],
         reward_file("from podsrl.algorithms.select import max_variance\n"
                     "def rule(rewards, m, generator=None, alpha=1.0):\n    return max_variance(rewards, m)\n",
                     "kw.py"), command="compare"),
    # #50: data loss and full disks
    Case("re-run of a stopped run beside a user's file in tracking/", "data loss", "succeed", out,
         lambda w: (stopped_run(w), (w / "run" / "tracking").mkdir(),
                    (w / "run" / "tracking" / "notes.txt").write_text("notes\n")),
         lambda w: [w / "run" / "tracking" / "notes.txt"]),
    Case("re-run of a stopped run beside a user's rollouts.jsonl", "data loss", "refuse", out,
         lambda w: (stopped_run(w), (w / "run" / "rollouts.jsonl").write_text("my notes\n")), run_files),
    Case("export --overwrite beside a user's file", "data loss", "succeed",
         lambda w: [str(w / "run"), str(w / "hf"), "--overwrite"],
         lambda w: (exported_run(w), (w / "hf" / "my_eval.csv").write_text("prompt,correct\n")),
         lambda w: [w / "hf" / "my_eval.csv"], command="export"),
    Case("export --overwrite over a user-edited README.md", "data loss", "refuse",
         lambda w: [str(w / "run"), str(w / "hf"), "--overwrite"],
         lambda w: (exported_run(w), (w / "hf" / "README.md").write_text("# my notes\n")),
         lambda w: list((w / "hf").iterdir()), command="export"),
    # #57: engines: early stop with one that declares nothing
    Case("group_early_stop with a user engine that declares no capabilities", "components", "refuse",
         lambda w: out(w, "--generation_engine", f"{w / 'ext.py'}:Plain", "--group_early_stop", "true",
                       "--generation_micro_group", "4", "--generation_schedule", "round_robin"),
         reward_file("from podsrl.rollout import SlotsEngine\nclass Plain:\n    def __init__(self, options):\n"
                     "        self.inner = SlotsEngine(options)\n    def __call__(self, *args, **kwargs):\n"
                     "        return self.inner(*args, **kwargs)\n    def state_dict(self):\n        return {}\n"
                     "    def check_state(self, state):\n        pass\n    def load_state_dict(self, state):\n"
                     "        pass\n", "ext.py")),
    # #57: options the run does not read: warned (a config copied between engines is common), the run goes on
    Case("vllm options given to the hf engine", "warning", "succeed",
         lambda w: out(w, "--vllm_enforce_eager", "true", "--vllm_gpu_memory_utilization", "0.5"),
         says="warning: generation_engine hf does not read vllm_gpu_memory_utilization = 0.5 (read by vllm)"),
    Case("generation_micro_group given to the hf engine", "warning", "succeed",
         lambda w: out(w, "--generation_micro_group", "4"),
         says="warning: generation_engine hf does not read generation_micro_group = 4 (read by slots)"),
    Case("generation_micro_group given to the vllm engine", "warning", "succeed",
         lambda w: out(w, "--generation_engine", "vllm", "--vllm_enforce_eager", "true", "--generation_micro_group",
                       "4"), venv=".venv-vllm",
         says="warning: generation_engine vllm does not read generation_micro_group = 4 (read by slots)"),
    Case("dynamic_sampling_rounds without dynamic_sampling", "warning", "succeed",
         lambda w: out(w, "--dynamic_sampling_rounds", "5"),
         says="warning: dynamic_sampling_rounds = 5: read only with dynamic_sampling true"),
    # #57: files that are not UTF-8 or not their format, named with their line
    Case("train data: bytes not UTF-8 in JSON Lines without a .jsonl suffix", "files", "refuse",
         lambda w: train_file(w, "rows.txt"),
         lambda w: (w / "rows.txt").write_bytes((EXAMPLES / "sums_train.jsonl").read_bytes().replace(b"What",
                                                                                                   b"Wh\xe4t"))),
    Case("train data: bytes not UTF-8 in a CSV file", "files", "refuse", lambda w: train_file(w, "rows.csv"),
         lambda w: (w / "rows.csv").write_bytes(b'question,answer\n"What is 1 + 1?",2\n"caf\xe9",3\n')),
    Case("train data: a corrupt parquet file", "files", "refuse", lambda w: train_file(w, "rows.parquet"),
         lambda w: (w / "rows.parquet").write_bytes(b"PAR1" + b"\0garbage" * 50)),
    Case("a config YAML not in UTF-8", "config", "refuse", lambda w: out(w, "--config", str(w / "latin.yaml")),
         lambda w: (w / "latin.yaml").write_bytes(b"learning_rate: 1.0e-3  # caf\xe9\n")),
    Case("export of a run whose config.json is cut off", "files", "refuse", lambda w: [str(w / "run"), str(w / "hf")],
         lambda w: (finished_run(w), (w / "run" / "config.json").write_text('{\n  "model": "ti')), run_files,
         command="export"),
    # #57: exports onto links, and their permissions
    Case("export --overwrite onto a link to an earlier export", "data loss", "succeed",
         lambda w: [str(w / "run"), str(w / "lnk"), "--overwrite"], linked_export,
         lambda w: [w / "hf" / "my_eval.csv"], command="export", after=link_kept),
    Case("export gets the umask's permissions", "files", "succeed", lambda w: [str(w / "run"), str(w / "hf")],
         finished_run, command="export", after=umask_modes()),
    Case("export --overwrite keeps the folder's permissions", "files", "succeed",
         lambda w: [str(w / "run"), str(w / "hf"), "--overwrite"], lambda w: (exported_run(w), (w / "hf").chmod(0o750)),
         command="export", after=umask_modes(0o750)),
    Case("export to a full disk (file size limit)", "full disk", "refuse", lambda w: [str(w / "run"), str(w / "hf")],
         finished_run, command="export", file_size_limit=1_000_000),
    Case("a full disk while logging the steps (file size limit)", "full disk", "refuse",
         lambda w: out(w, "--max_steps", "20", "--save_steps", "0", "--log_rollouts", "4"), file_size_limit=20_000),
    # #57: compare and plot
    Case("compare over a user's compare.md", "data loss", "refuse", compared,
         lambda w: ((w / "cmp").mkdir(), (w / "cmp" / "compare.md").write_text("# mine\n")),
         lambda w: [w / "cmp" / "compare.md"], command="compare"),
    Case("plot over an edited earlier report", "data loss", "refuse",
         lambda w: [str(w / "cmp"), "--output_dir", str(w / "cmp")],
         lambda w: (finished_comparison(w), open(w / "cmp" / "compare.md", "a").write("my notes\n")),
         lambda w: [p for p in (w / "cmp").rglob("*") if p.is_file()], command="plot"),
    *[Case(f"compare re-run with {' '.join(extra)} over runs of another command", "compare", "refuse",
           lambda w, e=extra: compared(w, *e), finished_comparison,
           lambda w: [p for p in (w / "cmp").rglob("*") if p.is_file()], command="compare")
      for extra in (["--learning_rate", "0.001"], ["--budget_steps", "3"])],
    Case("plot beside a run without evaluations", "compare", "succeed",
         lambda w: [str(w / "runs"), "--output_dir", str(w / "plots")], runs_one_without_evaluations,
         lambda w: [p for p in (w / "runs").rglob("*") if p.is_file()], command="plot"),
    Case("plot of runs of two SmolLM2 conversions", "compare", "refuse",
         lambda w: [str(w / "runs"), "--output_dir", str(w / "plots")], two_smollm2_conversions,
         lambda w: [p for p in (w / "runs").rglob("*") if p.is_file()], command="plot"),
    Case("compare --baseline naming no arm", "compare", "refuse", lambda w: compared(w, "--baseline", "bogus"),
         command="compare"),
    # #50: the vllm engine (run by .venv-vllm's podsrl), and advice that works
    Case("vllm_max_model_length below prompt + completion", "vllm", "refuse",
         lambda w: out(w, "--generation_engine", "vllm", "--vllm_enforce_eager", "true", "--vllm_max_model_length",
                       "24", "--max_completion_length", "16"), venv=".venv-vllm"),
    Case("vllm_max_model_length below the prompt", "vllm", "refuse",
         lambda w: out(w, "--generation_engine", "vllm", "--vllm_enforce_eager", "true", "--vllm_max_model_length",
                       "8"), venv=".venv-vllm"),
    Case("a loss that fails before the first checkpoint", "advice", "refuse",
         lambda w: out(w, "--loss_type", f"{w / 'boom.py'}:boom", "--save_steps", "5"),
         reward_file("def boom(per_token, mask, num_sequences, num_tokens):\n    raise RuntimeError('boom')\n",
                     "boom.py")),
    # #57: resume auto, as job scripts on preemptible machines pass it at every start
    Case("resume auto of a new folder", "resume", "succeed", lambda w: out(w, "--resume", "auto")),
    Case("resume auto of a run killed after a checkpoint", "resume", "succeed",
         lambda w: out(w, "--resume", "auto", "--max_steps", "3"), killed_run),
    Case("resume auto of a run that stopped before its first checkpoint", "resume", "succeed",
         lambda w: out(w, "--resume", "auto"), stopped_run),
    Case("resume auto in a folder holding a user's file", "resume", "refuse", lambda w: out(w, "--resume", "auto"),
         lambda w: ((w / "run").mkdir(), (w / "run" / "notes.txt").write_text("mine\n")), run_files),
    # #57: advice that was a dead end
    Case("a user's engine over the memory cap in step 1", "advice", "refuse", lambda w: capped_engine(w, "0.001"),
         reward_file(CAPPED_ENGINE, "ext.py")),
    Case("its advice followed: the same command, the cap raised", "advice", "succeed",
         lambda w: capped_engine(w, "10"), engine_over_its_cap),
    Case("resume of checkpoints from before parts.pt", "advice", "refuse",
         lambda w: out(w, "--resume", "true", "--max_steps", "3"), older_checkpoints, run_files),
    Case("export of a checkpoint from before parts.pt", "advice", "succeed",
         lambda w: [str(w / "run"), str(w / "hf"), "--checkpoint", "step_0000002"], older_checkpoints,
         command="export"),
    # #50: runs that end as successes but learned nothing, and Ctrl-C before the first step
    reward_case("constant reward (every advantage 0)", "return [1.0] * len(completions)"),
    Case("SIGINT while the libraries import", "interrupt", "refuse", out, background=ctrl_c_after(1.0)),
    Case("SIGINT while the config is checked (the reward file loads)", "interrupt", "refuse",
         lambda w: out(w, "--reward_funcs", f"{w / 'my_rewards.py'}:reward"),
         reward_file("import os, signal\nfrom pathlib import Path\nsent = Path(__file__).with_suffix('.sent')\n"
                     "if not sent.exists():  # the trainer imports it first; not again in the reward worker\n"
                     "    sent.touch()\n    os.kill(os.getpid(), signal.SIGINT)\n"
                     "def reward(prompts, completions, **kw):\n    return [len(c) / 10 for c in completions]\n")),
    Case("SIGINT during set-up (a user's engine is built)", "interrupt", "refuse",
         lambda w: out(w, "--generation_engine", f"{w / 'ext.py'}:component"),
         reward_file("import os, signal\nfrom podsrl.rollout import HFEngine\nclass component(HFEngine):\n"
                     "    def __init__(self, *args, **kwargs):\n        os.kill(os.getpid(), signal.SIGINT)\n"
                     "        super().__init__(*args, **kwargs)\n", "ext.py")),
    # #57: the GPU kit where there is no GPU, the TRL example without vLLM, FSDP where transformers is too old
    Case("GPU kit: stage a folder with no piece", "gpu kit", "refuse", lambda w: ["stage", str(w / "no" / "such")],
         program=("benchmarks/gpu_kit.py",), error_prefix="stage:"),
    Case("GPU kit: run with nothing carried, no GPU", "gpu kit", "refuse",
         lambda w: ["run", str(w / "out"), "--carried", str(w / "carried"), "--work", str(w / "work")],
         program=("benchmarks/gpu_kit.py",), error_prefix="run:"),
    Case("TRL example --use_vllm without vLLM", "advice", "refuse",
         lambda w: ["--offline", "--use_vllm", "--output_dir", str(w / "trl")], program=("examples/trl_pods.py",),
         error_prefix="trl_pods.py:"),
    Case("FSDP with transformers 5.17 (.venv-vllm)", "launcher", "refuse",
         lambda w: ["launch", "--config_file", str(REPO / "configs/accelerate/fsdp.yaml"), "--num_processes", "2",
                    "-m", "podsrl.cli", "train", *QUICK, *out(w)],
         program=("accelerate",), venv=".venv-vllm"),
    # #69: settings bounded by the data, the model and the memory; user contracts; messages; eval's terms
    Case("partial_extra_prompts beyond the train split", "numbers", "refuse",
         lambda w: out(w, "--generation_engine", "slots", "--partial_rollouts", "true", "--partial_extra_prompts",
                       "100000")),
    Case("num_generations beyond this machine's memory", "numbers", "refuse",
         lambda w: out(w, "--num_generations", "1000000")),
    Case("max_completion_length beyond this machine's memory", "numbers", "refuse",
         lambda w: out(w, "--max_completion_length", "10000000")),
    Case("lora_rank above the model's hidden size", "numbers", "refuse", lambda w: out(w, "--lora_rank", "4096")),
    Case("reward_timeout of a year", "numbers", "refuse", lambda w: out(w, "--reward_timeout", "31536000")),
    Case("generation_batch_size below one prompt group", "numbers", "refuse",
         lambda w: out(w, "--generation_batch_size", "2")),
    Case("build script --output a dangling link", "files", "refuse", lambda w: ["--output", str(w / "link")],
         lambda w: (w / "link").symlink_to(w / "nowhere"), program=("scripts/build_tiny.py",), error_prefix="--output"),
    Case("build script --output under a dangling link", "files", "refuse",
         lambda w: ["--output", str(w / "link" / "tiny")], lambda w: (w / "link").symlink_to(w / "nowhere"),
         program=("scripts/build_tiny_chain.py",), error_prefix="--output"),
    bounded_case("reward_bounds given as strings", "('0', '1')"),
    bounded_case("reward_bounds of three numbers", "(0.0, 1.0, 2.0)"),
    bounded_case("reward_bounds reversed", "(1.0, 0.0)"),
    bounded_case("a reward outside its declared bounds", "(0.0, 1.0)", "1.5"),
    Case("a full disk at a checkpoint (file size limit)", "full disk", "refuse", out, file_size_limit=2_000_000),
    Case("resume true on a folder holding only a user's file", "advice", "refuse", lambda w: out(w, "--resume", "true"),
         lambda w: ((w / "run").mkdir(), (w / "run" / "notes.txt").write_text("mine\n")), run_files),
    Case("eval of tiny-chain on the chain task (its own budget)", "eval", "succeed",
         lambda w: ["--model", "tiny-chain", "--task", "chain", "--eval_prompts", "4", "--eval_temperature", "0",
                    "--output_dir", str(w / "eval")], command="eval"),
    Case("eval with a budget that cuts every answer", "eval", "succeed",
         lambda w: ["--model", "tiny-chain", "--task", "chain", "--max_completion_length", "8", "--eval_prompts", "4",
                    "--eval_temperature", "0", "--output_dir", str(w / "eval")], command="eval",
         says="warning: max_completion_length:"),
    Case("eval of a run's model/ without --task", "eval", "succeed",
         lambda w: ["--model", str(w / "run" / "model"), "--eval_prompts", "4", "--output_dir", str(w / "eval")],
         finished_run, command="eval", says="'s model; from its config.json"),
    Case("eval of a running run's model/", "eval", "refuse",
         lambda w: ["--model", str(w / "run" / "model"), "--output_dir", str(w / "eval")], live_run, run_files,
         background=_lock_holder(), command="eval"),
    Case("plot with an evaluation logged as NaN", "compare", "succeed",
         lambda w: [str(w / "runs"), "--output_dir", str(w / "plots")], nan_evaluation, command="plot",
         after=no_nan_in_report("plots")),
    extension_case("selector takes the same prompt four times", "prompt_selector",
                   SELECTOR + "        return [taken[0]] * len(taken)\n"),
    Case("export --checkpoint of another run's checkpoint", "files", "refuse",
         lambda w: [str(w / "run"), str(w / "hf"), "--checkpoint", str(w / "other" / "checkpoints" / "step_0000002")],
         two_runs, command="export"),
    Case("plot of one run under two names", "compare", "succeed",
         lambda w: [str(w / "run"), str(w / "again"), "--output_dir", str(w / "plots")],
         lambda w: (finished_run(w), (w / "again").symlink_to(w / "run")), command="plot", says="counted once"),
    Case("vLLM's KV cache too small for one sequence", "vllm", "refuse",
         lambda w: out(w, "--generation_engine", "vllm", "--vllm_enforce_eager", "true", "--vllm_kv_cache_memory_mb",
                       "0.001"), venv=".venv-vllm"),
    Case("TRL example --use_vllm with vLLM (.venv-vllm)", "advice", "succeed",
         lambda w: ["--offline", "--use_vllm", "--max_steps", "2", "--output_dir", str(w / "trl")],
         program=("examples/trl_pods.py",), venv=".venv-vllm"),
]


# #80: watchers of generation (#71's stop_groups, #72's prune_running) held to their kind's contract
# at every method, settings that can never act, old runs' settings, eval's options, copied runs
SLOTS = ["--generation_engine", "slots", "--generation_schedule", "round_robin", "--generation_micro_group", "4"]
PRUNING = [*SLOTS, "--group_early_stop", "true", "--prune_running", "true"]
PRUNE_WATCHER = """
import os, signal, time
calls = [0]
def second():
    calls[0] += 1
    return calls[0] == 2
def hang():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10**6)
class Watch:
    kind = "prune_running"
    def __init__(self, prompts, tokenizer, step):
        pass
    def lengths(self, prompt):
        {lengths}
    def __call__(self, samples, lengths, features, running):
        {call}
"""


BARE_WATCHER = """
class Bare:
    kind = "prune_running"
    def __init__(self, prompts, tokenizer, step):
        pass
    def __call__(self, samples, lengths, features, running):
        return []
"""
INTERRUPTING_WATCHER = """
class Interrupting:
    kind = "stop_groups"
    def __init__(self, prompts, tokenizer, step):
        pass
    def __call__(self, prompt_index, completion_ids):
        raise KeyboardInterrupt
"""


def watcher_case(name: str, lengths: str = "return (2,)", call: str = "return []", expect: str = "refuse",
                 says: str = "", extra: tuple[str, ...] = (), after=lambda work: "") -> Case:
    """A run with a user's prune_running watcher whose ``lengths`` and ``__call__`` bodies are given."""
    return Case(name, "watcher", expect, lambda w: out(w, *SLOTS, "--generation_watchers", f"{w / 'watch.py'}:Watch",
                                                       *extra),
                reward_file(PRUNE_WATCHER.format(lengths=lengths, call=call), "watch.py"), says=says, after=after)


def logged(*names: str) -> Callable[[Path], str]:
    """What is wrong with work/run's step records: a name of ``names`` missing from one."""
    def check(work: Path) -> str:
        steps = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()][1:]
        missing = sorted({name for r in steps for name in names if name not in r})
        return f"steps without {', '.join(missing)}" if missing or not steps else ""
    return check


def run_in_former_layout(work: Path) -> None:
    """A finished run whose config.json is as 3353d05 wrote it: the hf engine's own batch_size
    (gone in 46aaa97), trained as generation_batch_size 8 trains today (2 groups of 4 a call)."""
    _train(["--output_dir", str(work / "run"), "--generation_batch_size", "8"])
    config = json.loads((work / "run" / "config.json").read_text())
    config.update(generation_engine={"name": "hf", "batch_size": 8}, generation_batch_size=0)
    (work / "run" / "config.json").write_text(json.dumps(config, indent=2) + "\n")


ROUND_SIX = [
    watcher_case("prune watcher stops every running sample", call="return list(running)",
                 says="stopped a group with"),
    watcher_case("prune watcher's lengths() returns None", lengths="return None",
                 says="returned None from lengths("),
    watcher_case("prune watcher's lengths() returns a string", lengths="return '24'",
                 says="returned '24' from lengths("),
    watcher_case("prune watcher's lengths() raises", lengths="raise OSError('lengths broke')",
                 says="failed: OSError: lengths broke"),
    watcher_case("prune watcher's lengths() returns (2.5, nan)", lengths="return (2.5, float('nan'))",
                 says="returned (2.5, nan) from lengths("),
    watcher_case("prune watcher's lengths() hangs under a SIGTERM", lengths="if second():\n            hang()\n"
                 "        return (2,)", says="by SIGTERM in generation_watchers"),
    watcher_case("prune watcher names sample 999", call="return [(0, 999)]", says="returned [(0, 999)]"),
    watcher_case("prune watcher names sample -1", call="return [(0, -1)]", says="returned [(0, -1)]"),
    watcher_case("prune watcher names prompts, not pairs", call="return [p for p, _ in samples]",
                 says="expected a list of (prompt, sample) pairs"),
    Case("prune watcher class without lengths()", "watcher", "refuse",
         lambda w: out(w, *SLOTS, "--generation_watchers", f"{w / 'watch.py'}:Bare"),
         reward_file(BARE_WATCHER, "watch.py"), says="without the method lengths()"),
    watcher_case("a user's prune watcher logs what it pruned", call="return [(p, s) for p, s in samples if s >= 2]",
                 expect="succeed", after=logged("pruned_samples", "pruned_tokens")),
    watcher_case("prune watcher with method grpo-ga", extra=("--method", "grpo-ga"),
                 says="stops running samples, and method grpo-ga"),
    watcher_case("prune watcher beside prune_running", extra=("--group_early_stop", "true", "--prune_running", "true",
                                                              "--correct_weight", "1", "--format_weight", "0"),
                 says="generation_watchers names one too"),
    Case("stop_groups watcher raises KeyboardInterrupt", "watcher", "refuse",
         lambda w: out(w, *SLOTS, "--generation_watchers", f"{w / 'watch.py'}:Interrupting"),
         reward_file(INTERRUPTING_WATCHER, "watch.py"), says="failed: KeyboardInterrupt"),
    Case("prune_running on the hf engine", "watcher", "refuse",
         lambda w: out(w, "--group_early_stop", "true", "--prune_running", "true"),
         says="generation_engine hf does not stop groups early"),  # what pruning builds on, refused first
    Case("prune_running without group_early_stop", "watcher", "refuse",
         lambda w: out(w, *SLOTS, "--prune_running", "true"), says="needs group_early_stop"),
    Case("prune_running on a correct + format reward", "never acts", "succeed", lambda w: out(w, *PRUNING),
         says="warning: prune_running: the reward sums 2 terms"),
    Case("prune_warmup_steps at max_steps", "never acts", "succeed",
         lambda w: out(w, *PRUNING, "--correct_weight", "1", "--format_weight", "0", "--prune_warmup_steps", "2"),
         says="warning: prune_warmup_steps = 2: the head only watches"),
    Case("prompts_per_step above the train split", "never acts", "refuse",
         lambda w: [*train_file(w, "rows.jsonl"), "--prompts_per_step", "500"],
         lambda w: shutil.copy(EXAMPLES / "sums_train.jsonl", w / "rows.jsonl"),
         says="prompts_per_step: 500 prompts a step, and the train split has 400"),
    Case("prompts_per_step 100000 on the slots engine", "never acts", "refuse",
         lambda w: out(w, *SLOTS[:2], "--generation_micro_group", "16", "--prompts_per_step", "100000"),
         says="podsrl train: error: prompts_per_step:"),
    Case("resume of a run in the former config layout, its own command", "resume", "succeed",
         lambda w: out(w, "--resume", "true", "--max_steps", "3", "--generation_engine",
                       json.dumps({"name": "hf", "batch_size": 8})), run_in_former_layout,
         says="is podsrl's spelling before 46aaa97"),
    Case("resume of a run in the former config layout, today's spelling", "resume", "succeed",
         lambda w: out(w, "--resume", "true", "--max_steps", "3", "--generation_batch_size", "8"),
         run_in_former_layout),
    Case("eval given a training option", "eval", "refuse", lambda w: [*EVAL, "--learning_rate", "5"],
         command="eval", says="learning_rate: podsrl eval does not read it"),
    Case("eval of a run's model/ with a budget on the command line", "eval", "succeed",
         lambda w: ["--model", str(w / "run" / "model"), "--eval_prompts", "4", "--max_completion_length", "4",
                    "--output_dir", str(w / "eval")], finished_run, command="eval",
         says="from the command line: max_completion_length 4"),
    Case("plot of a copied run folder", "compare", "succeed",
         lambda w: [str(w / "run"), str(w / "copy"), "--output_dir", str(w / "plots")],
         lambda w: (finished_run(w), shutil.copytree(w / "run", w / "copy")), command="plot",
         says="is a copy of the run"),
]
CASES += ROUND_SIX


def fingerprint(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "gone" for p in paths}


LAUNCHER_REPORT = "torch/distributed/elastic/multiprocessing/api.py"  # where accelerate's own failure report begins


def said(case: Case, stderr: str) -> str:
    """What the case's program said: under accelerate's launcher, podsrl's processes' lines
    before the launcher's own report of the failed processes."""
    if "accelerate" not in case.program:
        return stderr
    lines = stderr.split("\n")
    return "\n".join(lines[:next((k for k, line in enumerate(lines) if LAUNCHER_REPORT in line), None)])


def judge(case: Case, code: int | None, stderr: str, lost: list[str], wrong: str = "") -> str:
    if lost:
        return "data lost"
    if wrong:
        return f"wrong: {wrong}"
    if code is None:
        return "hang"
    stderr = said(case, stderr)
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if case.expect == "refuse":
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        if code == 0 or not last.startswith(case.clean_error_prefix()):
            return "silent"
        return "clean error" if case.says in stderr else f"wrong: it did not say {case.says!r}"
    if code == 0 and case.says not in stderr:
        return "silent"
    return "handled" if code == 0 else "traceback"


def run_case(case: Case, deadline: float) -> dict:
    if case.venv and not (REPO / case.venv / "bin" / "python").exists():
        return {"case": case.name, "class": case.fault, "exit": "-", "verdict": f"not run (no {case.venv})",
                "last line": f"{case.venv} is built by scripts/test_vllm.sh"}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        case.prepare(work)
        before = fingerprint(case.protected(work))
        holder = None
        if case.background:
            holder = subprocess.Popen([sys.executable, *case.background, str(work)], stdout=subprocess.PIPE,
                                      text=True)
            holder.stdout.readline()
        try:
            done = subprocess.run(case.argv(work), cwd=work, capture_output=True,
                                  text=True, timeout=deadline, preexec_fn=child_setup(case.file_size_limit))
            code, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired as expired:
            code, stderr = None, (expired.stderr or b"").decode(errors="replace")
        finally:
            if holder:
                holder.kill()
                holder.wait()
        after = fingerprint([Path(p) for p in before])
        lost = [p for p in before if before[p] != after[p]]
        wrong = case.after(work)
    last = said(case, stderr).strip().splitlines()[-1] if said(case, stderr).strip() else ""
    return {"case": case.name, "class": case.fault, "exit": "none (killed)" if code is None else code,
            "verdict": judge(case, code, stderr, lost, wrong), "last line": last[:160]}


def run_numbered(index: int, deadline: float) -> dict:
    """The catalogue's case ``index`` (a worker's call: cases hold functions, which do not pickle)."""
    return run_case(CASES[index], deadline)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds before a case counts as a hang")
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (each is one process, mostly "
                                                          "starting up: two halve the time on 2 cores)")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1] / "src"))
    chosen = [index for index, case in enumerate(CASES) if args.only in case.name]
    # forked workers, one thread each: a case's process starts with preexec_fn, unsafe beside threads
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(run_numbered, index, args.deadline) for index in chosen]
        for done in as_completed(futures):
            print(json.dumps(done.result()), flush=True)
    rows = [future.result() for future in futures]  # in the catalogue's order
    skipped = sum(r["verdict"].startswith("not run") for r in rows)
    good = sum(r["verdict"] in ("clean error", "handled") for r in rows)
    lines = ["| case | class | exit | verdict | last line of stderr |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['case']} | {r['class']} | {r['exit']} | {r['verdict']} | `{r['last line'].replace('|', '/')}` |"
              for r in rows]
    lines += ["", f"{good} of {len(rows) - skipped} cases run ended as a clean error or were handled; "
                  f"{len(rows) - skipped - good} ended otherwise" + (f"; {skipped} not run" if skipped else "")
              + f", on {machine_description()}."]
    body = "\n".join(lines)
    print(body)
    if args.record:
        record(args.record, body)
    return 0 if good == len(rows) - skipped else 1


if __name__ == "__main__":
    raise SystemExit(main())

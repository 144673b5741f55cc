"""Fault injection: run `podsrl train` through a catalogue of bad inputs and faults, each in a
fresh process with a deadline, and judge how each ended.

Verdicts: `clean error` (non-zero exit, a one-line `podsrl train: ...` message, no traceback),
`handled` (the run went on or finished as documented), `traceback`, `hang` (killed at the
deadline), `silent` (exit 0 where the input should have been refused), `data lost` (a file
that existed before the case changed or vanished). Target: only the first two.

    python benchmarks/fault_catalogue.py [--only SUBSTRING] [--deadline 120] [--record NAME]

Each case works in its own temporary folder; the tiny built-in model keeps a case to seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

from podsrl.models.loading import TINY_DIR  # noqa: E402

QUICK = ["--max_steps", "2", "--prompts_per_step", "4", "--num_generations", "4", "--num_kept", "2",
         "--max_completion_length", "6", "--eval_prompts", "8", "--eval_samples", "1", "--eval_steps", "0",
         "--save_steps", "1", "--progress", "false"]


@dataclass
class Case:
    name: str
    fault: str  # the class: output folder, resume, reward, numbers, files
    expect: str  # "refuse" (a clean error) or "succeed" (handled)
    args: Callable[[Path], list[str]]  # podsrl train options, given the case's folder
    prepare: Callable[[Path], None] = lambda work: None
    protected: Callable[[Path], list[Path]] = lambda work: []  # files that must survive unchanged
    background: list[str] = field(default_factory=list)  # a process started first (a lock holder)


def podsrl_command() -> list[str]:
    """The installed `podsrl` command, as users run it (`python -m` would put the case's
    folder first on sys.path, so a reward file named json.py there would shadow json for
    Python itself, podsrl or not)."""
    script = Path(sys.executable).parent / "podsrl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "podsrl.cli"]


def finished_run(work: Path) -> None:
    _train(["--output_dir", str(work / "run")])


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
         background=["-c", "import sys, time; from pathlib import Path; from podsrl.trainer.run_dir import RunLock; "
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
    reward_case("reward hangs, zero policy", "time.sleep(10**6)", policy="zero", expect="succeed"),
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
         reward_file("def reward(prompts, completions, **kw):\n    return [0.5] * len(completions)\n", "json.py")),
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
]


def fingerprint(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "gone" for p in paths}


def judge(case: Case, code: int | None, stderr: str, lost: list[str]) -> str:
    if lost:
        return "data lost"
    if code is None:
        return "hang"
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if case.expect == "refuse":
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        return "clean error" if code != 0 and last.startswith("podsrl train:") else "silent"
    return "handled" if code == 0 else "traceback"


def run_case(case: Case, deadline: float) -> dict:
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
            done = subprocess.run([*podsrl_command(), "train", *QUICK, *case.args(work)], cwd=work,
                                  capture_output=True, text=True, timeout=deadline)
            code, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired as expired:
            code, stderr = None, (expired.stderr or b"").decode(errors="replace")
        finally:
            if holder:
                holder.kill()
                holder.wait()
        after = fingerprint([Path(p) for p in before])
        lost = [p for p in before if before[p] != after[p]]
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return {"case": case.name, "class": case.fault, "exit": "none (killed)" if code is None else code,
            "verdict": judge(case, code, stderr, lost), "last line": last[:160]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds before a case counts as a hang")
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1] / "src"))
    rows = []
    for case in (c for c in CASES if args.only in c.name):
        rows.append(run_case(case, args.deadline))
        print(json.dumps(rows[-1]), flush=True)
    good = sum(r["verdict"] in ("clean error", "handled") for r in rows)
    lines = ["| case | class | exit | verdict | last line of stderr |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['case']} | {r['class']} | {r['exit']} | {r['verdict']} | `{r['last line'].replace('|', '/')}` |"
              for r in rows]
    lines += ["", f"{good} of {len(rows)} cases ended as a clean error or were handled; "
                  f"{len(rows) - good} ended otherwise."]
    body = "\n".join(lines)
    print(body)
    if args.record:
        record(args.record, body)
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

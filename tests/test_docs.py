"""The README and docs/ work as written.

- The README's blocks marked ``<!-- docs-check: run -->`` run in order, in one shell, in a
  fresh copy of the repository (tracked files only, sharing this checkout's .venv), and so
  do the python blocks of docs/ (the Python API example).
- Every other ``podsrl`` command in README.md and docs/*.md is parsed and validated by the
  real command-line parser (fields, values, files), as it would be before a run; every
  script they call exists.
- Every repository path they mention exists, and docs/configuration.md is what
  scripts/config_table.py generates from the config.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from podsrl import cli
from podsrl.config import FIELDS
from podsrl.rollout.vllm import vllm_available
from podsrl.tracking import missing_trackers

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- docs-check: (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.DOTALL)


def blocks(path: Path, lang: str) -> list[tuple[str, str]]:
    """(mark, body) of each fenced block of ``lang``; mark is '' without a docs-check comment."""
    return [(m["mark"] or "", m["body"]) for m in FENCE.finditer(path.read_text()) if m["lang"] == lang]


def commands(body: str) -> list[list[str]]:
    """Shell commands of a block: continuation lines joined, comments dropped, simple
    ``for VAR in a b; do ... done`` loops expanded."""
    text = body.replace("\\\n", " ")
    out, loop = [], None
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "for" and words[2] == "in":
            loop = (words[1], [w.rstrip(";") for w in words[3:] if w not in ("do", ";")])
            continue
        if words[0] == "done":
            loop = None
            continue
        if loop:
            out += [[w.replace(f"${loop[0]}", value) for w in words] for value in loop[1]]
        else:
            out.append(words)
    return out


def validate(words: list[str]) -> None:
    """Check one documented command without running it."""
    while "=" in words[0]:  # VAR=value prefixes (CUDA_VISIBLE_DEVICES=...)
        words = words[1:]
    if words[:2] == ["source", ".venv/bin/activate"]:
        return
    if words[0] == "trl":  # TRL's own command line (vllm-serve), installed with podsrl[trl]
        assert shutil.which("trl", path=str(Path(sys.executable).parent)), "the trl command is not installed"
        return
    if words[0] in ("tensorboard", "wandb", "trackio"):  # a tracker's own command line: an optional extra
        if not shutil.which(words[0], path=str(Path(sys.executable).parent)):
            pytest.skip(f"{words[0]} is not installed (pip install 'podsrl[{words[0]}]')")
        return
    if words[0] == "accelerate" and "podsrl.cli" not in words:  # launches a script
        words = ["python", *[w for w in words[2:] if w.endswith(".py")][:1]]
    if words[:2] == ["pip", "install"]:  # podsrl's extras must exist
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        for spec in (w for w in words[2:] if w.startswith("podsrl[")):
            assert set(spec[len("podsrl["):-1].split(",")) <= set(extras), f"{spec}: no such extra"
        return
    if words[0] in ("python", "python3") and words[1] == "-m" and words[2].startswith("verl."):
        pytest.skip("verl's command line: tests/verl composes it with verl's config (scripts/test_verl.sh)")
    if words[0] in ("python", "python3") and words[1:3] == ["-m", "podsrl.integrations.verl_core"]:
        from podsrl.integrations.verl_core import main

        assert main(words[3:]) == 0, words
        return
    if words[0] in ("bash", "python", "python3"):
        script = next(w for w in words[1:] if not w.startswith("-"))
        assert (ROOT / script).is_file(), f"{script}: no such script"
        return
    if words[0] == "accelerate":  # validate what it launches
        words = ["podsrl", *words[words.index("podsrl.cli") + 1:]]
    assert words[0] == "podsrl", f"unexpected command {words[0]!r}"
    command, args = words[1], words[2:]
    # outputs of earlier commands do not exist yet: a run's model folder stands for a model
    args = ["tiny" if a.startswith("runs/") and i and args[i - 1] == "--model" else a for i, a in enumerate(args)]
    if command == "plot":
        assert args and all(a.startswith(("runs/", "--output_dir")) or args[i - 1] == "--output_dir"
                            for i, a in enumerate(args)), args
        return
    if command == "export":  # RUN_DIR is an earlier command's output, as for plot
        parsed = cli.export_parser().parse_args(args)
        assert str(parsed.run_dir).startswith("runs/") and str(parsed.output_dir).startswith("runs/"), args
        return
    if command == "env":
        assert not args, args
        return
    if command == "compare":
        known = {"--methods", "--rules", "--n_values", "--m_values", "--seeds", "--budget_minutes", "--baseline"}
        args = [a for i, a in enumerate(args) if a not in known and (i == 0 or args[i - 1] not in known)]
    assert command in ("train", "eval", "compare"), command
    cfg = cli._parse_config(args, f"podsrl {command}", "")
    assert cfg is not None, f"podsrl {command} {shlex.join(args)} is rejected"


DOCUMENTED = [(page, i, words) for page in PAGES for i, (_, body) in enumerate(blocks(page, "bash"))
              for words in commands(body)]


@pytest.mark.parametrize("page, block, words", DOCUMENTED,
                         ids=[f"{p.name}-{b}-{' '.join(w[:3])}" for p, b, w in DOCUMENTED])
def test_documented_command_is_valid(page, block, words, monkeypatch):
    if any(w.startswith("../shared/data") for w in words) and not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("needs the real data in ../shared/data")
    if "--generation_engine" in words and words[words.index("--generation_engine") + 1] == "vllm" \
            and not vllm_available():
        pytest.skip("vLLM is not installed here (scripts/test_vllm.sh runs the vllm engine in .venv-vllm)")
    missing = missing_trackers(words[words.index("--report_to") + 1]) if "--report_to" in words else []
    if missing:  # optional extras: validating the command would refuse it for that reason alone
        pytest.skip(f"{', '.join(missing)} is not installed (pip install 'podsrl[{missing[0]}]')")
    monkeypatch.chdir(ROOT)
    validate(words)


def test_every_bash_block_yields_commands_to_check():
    """A block the parser cannot read would otherwise go unchecked."""
    empty = [(page.name, i) for page in PAGES for i, (_, body) in enumerate(blocks(page, "bash"))
             if not commands(body)]
    assert not empty and len(DOCUMENTED) >= 20, empty


PATH_REF = re.compile(r"(?<![\w./-])((?:src|tests|benchmarks|scripts|configs|docs|examples)/[\w./-]*[\w/])")
LINK = re.compile(r"\]\(((?!https?://)[^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_path_mentioned_exists(page):
    text = page.read_text()
    missing = [ref for ref in PATH_REF.findall(text) if not (ROOT / ref).exists()]
    missing += [link for link in LINK.findall(text) if not (page.parent / link).exists()]
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_configuration_page_is_generated_from_the_config():
    spec = importlib.util.spec_from_file_location("config_table", ROOT / "scripts" / "config_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert (ROOT / "docs" / "configuration.md").read_text() == table.render(), \
        "docs/configuration.md is stale: run python scripts/config_table.py"
    assert all(f"| `{name}` |" in table.render() for name in FIELDS)


def fresh_copy(target: Path) -> Path:
    """The repository's tracked files (what a fresh clone holds), sharing this .venv."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    # scripts/setup.sh in the copy must find the environment installed (its stamp is the
    # hash of pyproject.toml + requirements.lock), or it would reinstall podsrl into it
    # from the temporary copy
    venv = Path(sys.prefix)
    stamp = venv / ".podsrl-installed"
    digest = hashlib.sha256(b"".join((ROOT / name).read_bytes()
                                     for name in ("pyproject.toml", "requirements.lock"))).hexdigest()
    assert stamp.is_file() and stamp.read_text().strip() == digest, \
        f"run the tests through scripts/test.sh (or scripts/setup.sh first): {venv} has no current install stamp"
    (target / ".venv").symlink_to(venv)
    return target


def test_readme_quick_start_runs_as_written(tmp_path):
    """Every README block marked run, in order, in one shell; then the docs' python blocks."""
    script = "set -euo pipefail\n" + "\n".join(body for page in PAGES[:1] for mark, body in blocks(page, "bash")
                                               if mark == "run")
    copy = fresh_copy(tmp_path / "clone")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{copy / '.venv' / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], cwd=copy, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "held-out accuracy (sampled" in done.stdout
    for run in ("podsrl", "grpo", "my-model", "my-data", "my-reward"):
        assert (copy / "runs" / run / "metrics.jsonl").is_file(), run
    assert (copy / "runs" / "plots" / "accuracy.png").is_file()
    assert (copy / "runs" / "trl-pods" / "model.safetensors").is_file()
    for page in PAGES[1:]:
        for mark, body in blocks(page, "python"):
            ran = subprocess.run([sys.executable, "-c", body], cwd=copy, capture_output=True, text=True, env=env,
                                 timeout=600)
            assert ran.returncode == 0, (page.name, ran.stderr[-3000:])

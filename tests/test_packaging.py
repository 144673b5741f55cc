"""podsrl installs beside verl: its core (the algorithms, the integrations' selection code)
imports no trainer dependency, and the command line says which extra it needs instead of a
traceback when they are missing."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK_TRAIN_STACK = ("import sys\n"
                     "from podsrl.entry import TRAIN_STACK\n"
                     "for name in TRAIN_STACK:\n"
                     "    sys.modules[name] = None  # as if not installed: importing it fails\n")


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.slow
def test_the_core_and_the_verl_selection_code_import_without_the_trainer_stack():
    done = run(BLOCK_TRAIN_STACK + "import podsrl.algorithms, podsrl.integrations.verl_core\n"
                                   "print(podsrl.algorithms.select('max_variance', __import__('torch').tensor("
                                   "[[0., 1., 1., 0.]]), 2).tolist())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[0, 2]]"  # the lowest-index 0 and the highest-index 1


@pytest.mark.slow
def test_the_command_without_the_trainer_stack_names_the_extra():
    done = run(BLOCK_TRAIN_STACK + "from podsrl.entry import main\nraise SystemExit(main(['train']))")
    assert done.returncode == 2
    assert done.stderr.strip().startswith("podsrl: the command line needs podsrl's trainer dependencies, and ")
    assert done.stderr.strip().endswith("is not installed: pip install '.[train]' in a podsrl clone")


def test_the_core_dependencies_are_what_the_core_imports():
    """Core: torch, numpy, packaging; the trainer's stack is the `train` extra, which every
    extra that runs podsrl's trainer (trl, all) includes."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {spec.split(">")[0].split("<")[0].split("=")[0] for spec in project["dependencies"]}
    assert core == {"torch", "numpy", "packaging"}
    extras = project["optional-dependencies"]
    assert "podsrl[train]" in extras["trl"] and "train" in extras["all"][0]
    assert any(spec.startswith("verl[verl-core]") for spec in extras["verl"])

"""Hand-off commands: ``podsrl env`` (versions for bug reports), called in-process."""

import sys
from importlib.metadata import version

from podsrl.cli import main
from podsrl.provenance import REPORTED_PACKAGES, installed


def test_env_reports_the_installed_versions(capsys):
    heavy = {"transformers", "trl", "peft", "datasets", "accelerate", "vllm", "deepspeed", "wandb", "trackio"}
    before = set(sys.modules)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert not (set(sys.modules) - before) & heavy, "env imported a library to read its version"
    assert f"- torch: {version('torch')} " in out
    assert f"- transformers: {version('transformers')}\n" in out
    for name in REPORTED_PACKAGES:
        assert f"- {name}: {installed(name)}" in out
    assert f"- podsrl: {version('podsrl')} (commit " in out

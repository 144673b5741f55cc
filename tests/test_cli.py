"""The command line, run as a user would: in a subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from podsrl.config import FIELDS

ROOT = Path(__file__).resolve().parents[1]


def podsrl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "podsrl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--m", "32", "--n", "16"], "m: must be <= n"),
    (["--eval-every", "3"], "did you mean 'eval_every'"),
    (["--rule", "best"], "rule: unknown rule 'best'"),
    (["--model", "nope"], "model: unknown model 'nope'"),
    (["--config", "missing.yaml"], "config: file not found"),
    (["--n", "0"], "n: must be positive"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_bad_arguments_fail_before_any_work(tmp_path, args, message):
    result = podsrl("train", *args, "--output_dir", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "run").exists(), "nothing may be written for an invalid config"


def test_train_smoke_and_plot(random_model_dir, tmp_path):
    run = tmp_path / "run"
    result = podsrl("train", "--model", random_model_dir, "--steps", "2", "--prompts_per_step", "2",
                    "--n", "4", "--m", "2", "--eval_prompts", "8", "--eval_samples", "1",
                    "--output_dir", str(run), "--progress", "false")
    assert result.returncode == 0, result.stderr
    assert "held-out accuracy" in result.stdout and str(run) in result.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert (run / "accuracy.png").exists()
    again = podsrl("train", "--model", random_model_dir, "--output_dir", str(run))
    assert again.returncode == 2 and "--resume" in again.stderr
    plot = podsrl("plot", str(run), "--output", str(tmp_path / "p.png"))
    assert plot.returncode == 0 and (tmp_path / "p.png").stat().st_size > 0


def test_readme_documents_every_config_field():
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in FIELDS if f"`{name}`" not in readme]
    assert not missing, f"README config table lacks: {missing}"

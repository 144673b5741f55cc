"""What a run directory says about the run, read back from its files (``config.json``,
``metrics.jsonl``, ``environment.json``, ``data.json``) for ``podsrl export`` and its
model card.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from podsrl.metrics import read_metrics

# the fields a model card lists as the run's key settings (the whole config follows them)
CARD_KEYS = ("model", "task", "method", "num_generations", "num_kept", "downsampling_rule",
             "prompts_per_step", "learning_rate", "lr_scheduler_type", "max_steps", "beta", "temperature",
             "max_completion_length", "lora_rank", "lora_alpha", "dtype", "seed")


@dataclass
class RunInfo:
    run_dir: Path
    config: dict
    records: list[dict]  # metrics.jsonl, one per step
    environment: list[dict]  # one entry per start of the run
    data: dict  # data.json: prompts, system prompt, an example prompt ({} when absent)

    def value(self, key: str, default=None):
        return self.config.get(key, default)

    def evals(self, up_to_step: int | None = None) -> list[dict]:
        """The evaluation records (those with ``eval_accuracy``), up to a step if given."""
        return [r for r in self.records if r.get("eval_accuracy") is not None
                and (up_to_step is None or r["step"] <= up_to_step)]


@dataclass
class Source:
    """What ``podsrl export`` exports: the run's final model or one checkpoint."""

    path: Path  # RUN_DIR/model or the checkpoint folder
    label: str  # 'final model', 'checkpoint step_0000050'
    step: int
    train_seconds: float


def read_json(path: Path, kind: type = dict):
    """The JSON document of ``path``, of ``kind`` (an object, a list); anything else (not UTF-8,
    not JSON, cut off, another kind) is a one-line ValueError naming the file and line."""
    raw = path.read_bytes()
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{path} line {line}: not valid UTF-8 (byte "
                         f"{raw[err.start:err.start + 1]!r})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None  # its line and column
    if not isinstance(value, kind):
        raise ValueError(f"{path}: expected a JSON {'object' if kind is dict else kind.__name__}, got "
                         f"{type(value).__name__}")
    return value


def read_run_info(run_dir: Path) -> RunInfo:
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a podsrl run directory (no config.json)")
    metrics, data, environment = (run_dir / "metrics.jsonl", run_dir / "data.json",
                                  run_dir / "environment.json")
    return RunInfo(run_dir=run_dir, config=read_json(config_path),
                   records=read_metrics(metrics) if metrics.is_file() else [],
                   environment=read_json(environment, list) if environment.exists() else [],
                   data=read_json(data) if data.is_file() else {})

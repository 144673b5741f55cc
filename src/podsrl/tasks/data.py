"""Reading rows of a dataset: a local JSONL / JSON / parquet file, or a Hugging Face hub
dataset (``name`` or ``name:config``) when the network is available."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def is_local(spec: str) -> bool:
    return Path(spec).expanduser().suffix in LOCAL_SUFFIXES or Path(spec).expanduser().exists()


def read_rows(spec: str, *, split: str, field_name: str) -> list[dict[str, Any]]:
    """Rows of ``spec`` as dicts. ``field_name`` is the config field that named the data,
    so that every error can point at it (and at the file and line)."""
    if is_local(spec):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{field_name}: file not found: {path}")
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        return _read_json_lines(path, field_name)
    return _read_hub(spec, split=split, field_name=field_name)


def _read_json_lines(path: Path, field_name: str) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    if path.suffix == ".json" and raw.lstrip()[:1] == b"[":
        rows = json.loads(raw.decode("utf-8"))
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{field_name}: {path}: expected a list of objects")
        return rows
    rows = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{field_name}: {path} line {number}: not valid UTF-8 "
                             f"(byte {err.start}: {line[err.start:err.start + 1]!r})") from None
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{field_name}: {path} line {number}: invalid JSON: {err.msg}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{field_name}: {path} line {number}: expected a JSON object")
        row["_line"] = number  # where the row came from, for later error messages
        rows.append(row)
    return rows


def _read_hub(spec: str, *, split: str, field_name: str) -> list[dict[str, Any]]:
    name, _, config = spec.partition(":")
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise ImportError(f"{field_name}: reading {spec!r} from the hub needs the `datasets` package") from None
    try:
        dataset = datasets.load_dataset(name, config or None, split=split)
    except Exception as err:  # the hub raises many types: connection, missing config, ...
        raise OSError(f"{field_name}: could not load hub dataset {spec!r} split {split!r} ({err}). "
                      f"Offline, pass a local .jsonl or .parquet file.") from err
    return [dict(row) for row in dataset]


def require_column(row: dict, column: str, spec: str, field_name: str, index: int) -> Any:
    """``row[column]``, or an error naming the data field, file and line (or row index)."""
    if column not in row or row[column] is None:
        where = f"line {row['_line']}" if "_line" in row else f"row {index}"
        present = sorted(k for k in row if k != "_line")
        raise ValueError(f"{field_name}: {spec} {where}: missing column {column!r} (columns: {present})")
    return row[column]


def require_text(row: dict, column: str, spec: str, field_name: str, index: int) -> str:
    """A non-empty string column. Policy: an empty prompt is a data error and is rejected
    (with the file and line); over-long prompts are dropped and counted later, since
    "too long" depends on the model's tokenizer."""
    value = require_column(row, column, spec, field_name, index)
    if not isinstance(value, str) or not value.strip():
        where = f"line {row['_line']}" if "_line" in row else f"row {index}"
        raise ValueError(f"{field_name}: {spec} {where}: column {column!r} is empty or not text")
    return value

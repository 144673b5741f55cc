"""Reading rows of a dataset through Hugging Face ``datasets``: a local JSON Lines / JSON /
CSV / parquet file (``load_dataset("json", data_files=...)`` and so on), or a hub dataset
(``name`` or ``name:config``) when the network is available.

Every error names the config field that named the data, the file and the line (JSON Lines)
or row, so a bad record in a 10,000-line file is found at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podsrl.registry import error_line

# file suffix -> the `datasets` builder that reads it
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
LOCAL_SUFFIXES = tuple(BUILDERS)


def is_local(spec: str) -> bool:
    return Path(spec).expanduser().suffix in LOCAL_SUFFIXES or Path(spec).expanduser().exists()


@dataclass
class Rows:
    """A dataset's rows and where each came from, for error messages.

    ``lines``: the file line of each row (JSON Lines files), else None and rows are
    referred to by index.
    """

    spec: str
    field_name: str
    rows: list[dict[str, Any]]
    lines: list[int] | None = None

    def where(self, index: int) -> str:
        """``train_data: data.jsonl line 12`` / ``test_data: name row 3``."""
        place = f"line {self.lines[index]}" if self.lines else f"row {index}"
        return f"{self.field_name}: {self.spec} {place}"

    def __iter__(self):
        return iter(enumerate(self.rows))


def read_rows(spec: str, *, split: str, field_name: str) -> Rows:
    """Rows of ``spec``. ``field_name`` is the config field that named the data, so that
    every error can point at it (and at the file and line)."""
    if not is_local(spec):
        return Rows(spec, field_name, _read_hub(spec, split=split, field_name=field_name))
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{field_name}: file not found: {path}")
    # a file of another suffix is read as JSON (Lines), as below
    if BUILDERS.get(path.suffix, "json") != "json":
        return Rows(spec, field_name, _load_table(path, field_name))
    try:
        rows = _load_local(path, field_name)
    except Exception as err:  # find the bad line ourselves: datasets' errors name neither file nor line
        rows = _read_json_lines(path, field_name, err)  # or, when every line is fine, its rows
    return Rows(spec, field_name, rows, _json_lines_numbers(path, len(rows)))


def _load_local(path: Path, field_name: str) -> list[dict[str, Any]]:
    import datasets

    builder = BUILDERS.get(path.suffix, "json")
    return datasets.load_dataset(builder, data_files=str(path), split="train").to_list()


def _load_table(path: Path, field_name: str) -> list[dict[str, Any]]:
    """The rows of a CSV or parquet file; one ``datasets`` cannot read is a one-line error naming
    it (and, for a CSV not in UTF-8, the line): its own errors name neither."""
    try:
        return _load_local(path, field_name)
    # datasets wraps the reader's error (DatasetGenerationError): report the reader's
    except Exception as err:
        if path.suffix == ".csv":
            _check_utf8_lines(path.read_bytes(), f"{field_name}: {path}")
        while err.__cause__ is not None:
            err = err.__cause__
        raise ValueError(f"{field_name}: {path}: not a readable {BUILDERS[path.suffix]} file "
                         f"({error_line(err)})"
                         ) from None


def _json_lines_numbers(path: Path, count: int) -> list[int] | None:
    """The line number of each row of a JSON Lines file (blank lines hold no row); None for
    a JSON array file, whose rows are numbered by index."""
    raw = path.read_bytes()
    if raw.lstrip()[:1] == b"[":
        return None
    numbers = [number for number, line in enumerate(raw.split(b"\n"), start=1) if line.strip()]
    return numbers if len(numbers) == count else None


def _read_json_lines(path: Path, field_name: str, load_error: Exception) -> list[dict[str, Any]]:
    """The rows of a JSON / JSON Lines file that ``datasets`` could not load: the first bad
    line as an error naming the file and line, else (all lines valid JSON objects, e.g. a
    mix ``datasets`` cannot type) the rows read line by line."""
    raw = path.read_bytes()
    if path.suffix == ".json" and raw.lstrip()[:1] == b"[":
        _check_utf8_lines(raw, f"{field_name}: {path}")
        try:
            rows = json.loads(raw.decode("utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{field_name}: {path} line {err.lineno}: not a valid JSON file ({err.msg}, "
                             f"column {err.colno})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{field_name}: {path}: expected a list of objects")
        return rows
    rows = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if line.strip():
            rows.append(_json_line(line, f"{field_name}: {path} line {number}"))
    if not rows:
        raise ValueError(f"{field_name}: {path}: could not be loaded ({type(load_error).__name__}: "
                         f"{load_error})")
    return rows


def _utf8(line: bytes, where: str) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not valid UTF-8 (byte {err.start}: "
                         f"{line[err.start:err.start + 1]!r})") from None


def _check_utf8_lines(raw: bytes, where: str) -> None:
    """The first line of ``raw`` that is not UTF-8, as an error naming it (``where``: field and file)."""
    for number, line in enumerate(raw.split(b"\n"), start=1):
        _utf8(line, f"{where} line {number}")


def _json_line(line: bytes, where: str) -> dict[str, Any]:
    text = _utf8(line, where)
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: invalid JSON: {err.msg}") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    return row


def _read_hub(spec: str, *, split: str, field_name: str) -> list[dict[str, Any]]:
    name, _, config = spec.partition(":")
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise ImportError(f"{field_name}: reading {spec!r} from the hub needs the `datasets` "
                          "package") from None
    try:
        dataset = datasets.load_dataset(name, config or None, split=split)
    except Exception as err:  # the hub raises many types: connection, missing config, ...
        raise OSError(f"{field_name}: could not load hub dataset {spec!r} split {split!r} ({err}). "
                      f"Offline, pass a local .jsonl or .parquet file.") from err
    return dataset.to_list()


def require_column(rows: Rows, index: int, column: str) -> Any:
    """``rows.rows[index][column]``, or an error naming the data field, file and line (or row)."""
    row = rows.rows[index]
    if row.get(column) is None:  # datasets fills a column a row lacks with None
        present = sorted(k for k, v in row.items() if v is not None)
        raise ValueError(f"{rows.where(index)}: missing column {column!r} (columns: {present})")
    return row[column]


def require_text(rows: Rows, index: int, column: str) -> str:
    """A non-empty string column. Policy: an empty prompt is a data error and is rejected
    (with the file and line); over-long prompts are dropped and counted later, since
    "too long" depends on the model's tokenizer."""
    value = require_column(rows, index, column)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{rows.where(index)}: column {column!r} is empty or not text")
    return value


def require_prompt(rows: Rows, index: int, column: str) -> str | list[dict[str, Any]]:
    """A prompt: non-empty text, or a conversation (TRL's conversational format: a list of
    ``{"role": ..., "content": ...}`` messages), rendered later with the chat template."""
    value = require_column(rows, index, column)
    if isinstance(value, str):
        return require_text(rows, index, column)
    messages = value if isinstance(value, list) else []
    if messages and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                        and m.get("content") is not None for m in messages):
        return [{k: v for k, v in m.items() if v is not None} for m in messages]  # datasets' None fill-ins
    raise ValueError(f"{rows.where(index)}: column {column!r} is neither text nor a list of "
                     f"{{\"role\": ..., \"content\": ...}} messages")

"""YAML config files, read strictly: a key given twice is an error naming the file, the key
and both lines (PyYAML's safe loader silently keeps the last value, so ``learning_rate`` set
twice would train with whichever came later); a text field as YAML or the command line
gives it (:func:`as_text`); and comma-separated values (:func:`split_list`, reward weights)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"line {line}: duplicate key {key!r} (first on line {first})")
        self.key, self.line, self.first = key, line, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names a key twice: PyYAML silently keeps
    the last value, so ``learning_rate`` set twice would train with whichever came later."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, tuple[int, int]] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` merges, it is no key
                continue
            key = self.construct_object(key_node, deep=deep)
            # by line and column: a flow mapping ({a: 1, a: 2}) names both on one line
            where = (key_node.start_mark.line + 1, key_node.start_mark.column)
            try:
                first = seen.setdefault(key, where)
            except TypeError:  # an unhashable key: the base loader reports it
                continue
            if first != where:
                raise _DuplicateKey(key, where[0], first[0])
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """The document of the YAML file ``path`` ({} when empty); invalid YAML or a duplicate key
    is a one-line ValueError naming the file and line."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:  # Python's message names neither the file nor the line
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{path} line {line}: not valid UTF-8 (byte {raw[err.start:err.start + 1]!r}); save "
                         "it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except _DuplicateKey as err:  # an error, not a warning: which value was meant is unknown
        raise ValueError(f"{path} line {err.line}: duplicate key {err.key!r} (first set on line "
                         f"{err.first}); YAML keeps only the last: remove one") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        said = "; ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None)))) or err
        raise ValueError(f"{path}{where}: invalid YAML: {' '.join(str(said).split())}") from None  # one line


def as_text(name: str, raw: Any, source: str) -> str:
    """A text field from YAML or the command line: null is empty, a YAML list joins into the
    comma-separated form the command line uses (``[q_proj, v_proj]`` == ``q_proj,v_proj``)."""
    if raw is None:
        return ""
    if isinstance(raw, (list, tuple)):
        items = [as_text(name, item, source) for item in raw]
        if any("," in item for item in items):
            raise ValueError(f"{source}{name}: list items may not contain commas, got {raw!r}")
        return ",".join(items)
    if isinstance(raw, dict):
        raise ValueError(f"{source}{name}: expected text or a list, got a mapping {raw!r}")
    return str(raw)


def split_list(text: str) -> list[str]:
    """Comma-separated values, stripped, empty items dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def check_reward_weights(items: list[str], text: str) -> list[float]:
    """The items of ``reward_weights`` (``text``, split by :func:`split_list`) as numbers,
    each finite (negative ones penalise)."""
    weights = []
    for item in items:
        try:
            weight = float(item)
        except ValueError:
            raise ValueError(f"reward_weights: expected comma-separated numbers, got {text!r}") from None
        if not math.isfinite(weight):
            raise ValueError(f"reward_weights: must be finite numbers, got {item} in {text!r}")
        weights.append(weight)
    return weights

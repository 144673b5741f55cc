"""Settings that an earlier podsrl read and this one spells otherwise, each mapped to today's
spelling, so a run made before the change resumes with its own command or with today's.

A run's config.json keeps the settings as its podsrl wrote them; ``--resume true`` compares them
with the command's. Without these mappings an old run could be resumed neither way: its own
command was refused (a setting that is no longer read) and today's spelling differed from its
config.json (a change of configuration, refused on resume). :func:`current_layout` maps a
config's values (a YAML file's and the command line's in :func:`podsrl.trainer.config.make_config`,
the run's config.json in :func:`podsrl.run_folder.claim.check_resume_config`);
:func:`former_layout_refusal` names the mapping where a ``Config`` built in Python still holds
the former spelling. A change that cannot be mapped (its old meaning has no spelling today)
belongs here too, as a refusal that says what to run instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from podsrl.methods import METHODS

Values = Mapping[str, Any]


@dataclass(frozen=True)
class LayoutChange:
    """One change of spelling: the ``commit`` that made it, ``what`` changed (in words), whether it
    ``applies`` to a config's values, and those values ``mapped`` to today's spelling."""

    commit: str
    what: str
    applies: Callable[[Values], bool]
    mapped: Callable[[Values], dict]


def _engine_arguments(values: Values, name: str) -> dict:
    """The arguments of a ``generation_engine: {name: NAME, ...}`` spec ({} for any other)."""
    spec = values.get("generation_engine")
    if isinstance(spec, Mapping) and spec.get("name") == name:
        return {key: value for key, value in spec.items() if key != "name"}
    return {}


def _engine_spec(name: str, arguments: dict):
    """A spec with ``arguments``, or the bare name where none are left (as a command line gives it)."""
    return {"name": name, **arguments} if arguments else name


def _hf_batch_size(values: Values) -> dict:
    """The hf engine's own ``batch_size`` (sequences a call decoded at once, in whole prompt groups:
    max(1, batch_size // n) groups) is generation_batch_size, which splits a step's generation into
    calls of that many whole groups."""
    arguments = _engine_arguments(values, "hf")
    size = int(arguments.pop("batch_size"))
    mapped = {**values, "generation_engine": _engine_spec("hf", arguments)}
    if size and not values["generation_batch_size"]:
        n = METHODS[values["method"]].generated_per_prompt(values["num_generations"], values["num_kept"])
        mapped["generation_batch_size"] = max(1, size // n) * n
    return mapped


LAYOUT_CHANGES = (
    LayoutChange("46aaa97",
                 "the hf engine's own batch_size went; generation_batch_size bounds what a call decodes",
                 lambda values: "batch_size" in _engine_arguments(values, "hf"), _hf_batch_size),
)


def _shown(values: Values, names) -> str:
    """``values``'s settings ``names`` as the command line's --name value pairs read (JSON values)."""
    return ", ".join(f"{name} {json.dumps(values[name])}" for name in names)


def current_layout(values: Values, defaults: Values) -> tuple[dict, list[str]]:
    """``values`` (over the config's ``defaults``, where it sets no value) with every former
    spelling mapped to today's, and one line per mapping made (what it was, what it is read as,
    and why)."""
    mapped, notes = {**defaults, **values}, []
    for change in LAYOUT_CHANGES:
        if change.applies(mapped):
            before, mapped = mapped, change.mapped(mapped)
            was = [name for name in values if mapped.get(name) != before[name]]  # as the config set them
            now = [name for name in mapped if before.get(name) != mapped[name]]
            notes.append(f"{_shown(before, was)} is podsrl's spelling before {change.commit} "
                         f"({change.what}): read as {_shown(mapped, now)}")
    return mapped, notes


def former_layout_refusal(values: Values, defaults: Values) -> str:
    """The line refusing a config's ``values`` (those away from its ``defaults``) in a former
    spelling ('' where there is none), naming today's."""
    notes = current_layout(values, defaults)[1]
    if not notes:
        return ""
    return (f"{notes[0]}; set that instead (podsrl train and make_config map it, a Config built in Python "
            "does not)")

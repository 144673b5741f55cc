"""Settings declared beside the code that reads them: :func:`option` fields carry their help
text and range as metadata, :func:`check_numbers` checks any such dataclass, and :func:`bind`
fills one from the run's config by field name.

An owner of a job of the run (evaluation: :class:`podsrl.trainer.evaluate.EvalOptions`)
declares its options as a frozen dataclass of :func:`option` fields in its own module;
:class:`podsrl.trainer.config.Config` composes them (it subclasses each), so a new setting is one
field in its owner's module: the command line, the YAML file, the range check and
docs/configuration.md take it from there, and :func:`bind` hands it to the owner under the
same name.

Every number must be of its field's type (a bool is not a number) and finite: no float field
accepts NaN or infinity, since each "no limit" is spelled 0 (max_minutes, generation_memory_mb,
checkpoint_minutes, max_grad_norm). Each error is one line that names the field:
``learning_rate: must be a finite number, got nan``. This module imports nothing of podsrl.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, NamedTuple, TypeVar

__all__ = ["FRACTION", "NON_NEGATIVE", "POSITIVE", "SEED", "Range", "bind", "check_numbers", "check_option",
           "flat_option", "option"]

T = TypeVar("T")


class Range(NamedTuple):
    """An interval of allowed values; ``low_closed`` / ``high_closed`` say whether the bound
    itself is allowed. ``why`` is added to the error."""
    low: float = -math.inf
    high: float = math.inf
    low_closed: bool = True
    high_closed: bool = True
    why: str = ""

    def admits(self, value) -> bool:
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def describe(self) -> str:
        """'positive', '>= 0', 'in [0, 1)', ..."""
        if self.high == math.inf:
            if (self.low, self.low_closed) == (0, False):
                return "positive"
            return f"{'>=' if self.low_closed else '>'} {self.low}"
        return f"in {'[' if self.low_closed else '('}{self.low}, {self.high}{']' if self.high_closed else ')'}"


POSITIVE = Range(0, low_closed=False)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1, high_closed=False)  # [0, 1)
SEED = Range(0, 2**32 - 1, why="numpy's seed range, which torch accepts too")


def option(default: Any, help: str, range: Range | None = None, unchecked: str = "") -> Any:
    """A setting: its default, its help text (``--help``, docs/configuration.md) and, for a
    number, its ``range``, or why it has none (``unchecked``: checked elsewhere, or by nobody)."""
    metadata = {"help": help, **({"range": range} if range else {})}
    if unchecked:
        metadata["unchecked"] = unchecked
    return dataclasses.field(default=default, metadata=metadata)


def flat_option(options_type: type, name: str) -> Any:
    """A config field that sets the option ``name`` of a component's ``options_type`` (its flat
    spelling, generation_micro_group for SlotsOptions.micro_group): the option's default, help
    and range, declared once, beside the component that reads it; ``flat_of`` names the option
    (``SlotsOptions.micro_group``), ``flat_owner`` is its class (:func:`flat_names`)."""
    f = options_type.__dataclass_fields__[name]
    return dataclasses.field(default=f.default, metadata={**f.metadata, "flat_of": f"{options_type.__name__}.{name}",
                                                          "flat_owner": options_type})


def flat_names(config: Any, owner: type) -> dict[str, str]:
    """{config field: option} for the fields of ``config`` (a dataclass or its class) that spell
    an option of ``owner``, or of a class derived from it, flat (:func:`flat_option`): the table
    the flat names are read by, taken from the fields that declare them."""
    return {f.name: f.metadata["flat_of"].rsplit(".", 1)[1] for f in dataclasses.fields(config)
            if issubclass(f.metadata.get("flat_owner", type(None)), owner)}


def check_numbers(options: Any) -> None:
    """Every int and float field of the dataclass ``options``: of its type, finite, and
    within its range (its field's ``range`` metadata)."""
    for f in dataclasses.fields(options):
        kind = type(f.default)
        if kind not in (int, float):
            continue
        value = getattr(options, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise ValueError(f"{f.name}: expected {kind.__name__}, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{f.name}: must be a finite number, got {value}")
        limits = f.metadata.get("range")
        if limits is not None and not limits.admits(value):
            why = f" ({limits.why})" if limits.why else ""
            raise ValueError(f"{f.name}: must be {limits.describe()}{why}, got {value}")


def check_option(field: dataclasses.Field, value: Any, where: str) -> None:
    """A value for the option ``field`` set by a component spec's argument (of its default's kind,
    checked by the caller): a whole number where the default is one, within the field's range."""
    if type(field.default) is int and not isinstance(value, int):  # a count: 2.5 slots is no count
        raise ValueError(f"{where}: expected an integer like its default {field.default!r}, got {value!r}")
    limits = field.metadata.get("range")
    if limits is not None and not isinstance(value, bool) and not limits.admits(value):
        why = f" ({limits.why})" if limits.why else ""
        raise ValueError(f"{where} = {json.dumps(value)}: must be {limits.describe()}{why}")


def bind(options_type: type[T], source: Any, **values: Any) -> T:
    """``options_type`` filled from ``source`` (the run's config) field by field, under the
    same names; ``values`` set fields the source does not hold, or replace its values."""
    taken = {f.name: getattr(source, f.name) for f in dataclasses.fields(options_type)
             if f.init and f.name not in values}
    return options_type(**taken, **values)

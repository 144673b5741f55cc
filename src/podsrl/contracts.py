"""The contract of every extension kind, kept where user code meets podsrl.

A registered name or ``module:function`` resolves through a :class:`podsrl.registry.Registry`,
which checks the object's signature once, at start-up (``Registry.resolve``), and whose
``checked`` form runs each call inside :func:`calling` and checks what came back (the kind's
``check_output``). So a rule, advantage estimator, loss, prompt selector or engine that raises,
exits, hangs or returns the wrong thing is reported as that function failing, in one line
naming the config field, the function and what was wrong, never as a traceback deep in the
update or as a run that trains on garbage. The checks are a few comparisons on tensors of
[P, m] or smaller per call (``benchmarks/contract_cost.py`` measures them). A component may
declare the ranges of its keyword arguments (:func:`argument_ranges`), checked at start-up
when a spec binds them (``eps`` -1 would run, flipping every advantage's sign).

The trainer stops on a :class:`UserCodeError` as it does on a failed reward: the unfinished
step is undone and the last finished step checkpointed. User code itself is loaded here too
(:func:`load_object`: ``module:function`` or ``file.py:function``, a failure at import one line).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from podsrl import interrupts

PACKAGE_DIR = str(Path(__file__).resolve().parent)  # podsrl's own frames are not the user's line


class UserCodeError(ValueError):
    """An extension (a user's, or podsrl's own) raised or broke its contract; the message is
    one line naming the config field and the function (a ValueError: a bad value, in a sense,
    as a bad config is)."""


def spec_name(obj: Any) -> str:
    """How errors name a component given as an object (a name from the config is used as is)."""
    module = getattr(obj, "__module__", "") or ""
    return f"{module}:{getattr(obj, '__qualname__', type(obj).__name__)}".lstrip(":")


def error_line(err: BaseException) -> str:
    """``Type: message`` on one line, cut to a readable length."""
    try:
        text = " ".join(str(err).split())
    except Exception:  # a user exception whose __str__ fails
        text = "(unprintable message)"
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _user_line(err: BaseException) -> str:
    """``, at FILE:LINE``: the innermost frame of the traceback outside podsrl and the standard
    library, where the user's code went wrong."""
    tb, found = err.__traceback__, ""
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not path.startswith((PACKAGE_DIR, sys.prefix, sys.base_prefix)):
            found = f", at {path}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def check_signature(obj: Any, field: str, spec: str, takes: str, arity: int) -> None:
    """``obj`` must accept ``arity`` positional arguments (``takes`` says which, in words), and
    have no keyword-only argument left without a value (a spec's bound ones have theirs)."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: the first call tells
        return
    unset = [p.name for p in signature.parameters.values()
             if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    try:
        signature.bind(*([None] * arity), **dict.fromkeys(unset))
    except TypeError:
        raise ValueError(f"{field}: {spec} must accept {takes}; it takes {signature}") from None
    if unset:
        names = ", ".join(map(repr, unset))
        raise ValueError(f"{field}: {spec}: keyword-only argument{'s' if len(unset) > 1 else ''} {names} "
                         f"{'have' if len(unset) > 1 else 'has'} no default and no value in the config: set "
                         f"it ({{\"name\": {json.dumps(spec)}, \"{unset[0]}\": ...}}) or give it a default")


# --- the ranges of components' keyword arguments, checked when a spec binds them at set-up
# (podsrl.registry.bind_kwargs; re-exported there)
@dataclass(frozen=True)
class Range:
    """What a component's keyword argument must be, checked when a spec binds it (at set-up):
    ``must`` in words ('> 0'), the ``test`` of a value, and ``why``, said after it."""

    must: str
    test: Callable[[Any], bool]
    why: str = ""

    def check(self, value: Any, where: str) -> None:
        try:
            ok = bool(self.test(value))
        except TypeError:  # a value of another kind (an argument whose default is None is not type-checked)
            ok = False
        if not ok:
            why = f" ({self.why})" if self.why else ""
            raise ValueError(f"{where} = {json.dumps(value)}: must be {self.must}{why}")


positive = Range("> 0", lambda value: value > 0)
non_negative = Range(">= 0", lambda value: value >= 0)
probability = Range("in [0, 1]", lambda value: 0 <= value <= 1)


def argument_ranges(**ranges: Range) -> Callable[[Any], Any]:
    """Decorator: the :class:`Range` of some of a component's keyword arguments, e.g.
    ``@argument_ranges(eps=positive)``; a spec binding one out of range is refused at set-up in one
    line naming the field and the argument (``eps`` -1 would flip every advantage's sign)."""
    def mark(obj):
        obj.argument_ranges = {**getattr(obj, "argument_ranges", {}), **ranges}
        return obj
    return mark


def check_reward_signature(fn: Any, field: str, spec: str) -> None:
    """A reward function is called as TRL calls it, ``fn(prompts=..., completions=..., **columns)``
    (the data's other columns, ``completion_ids``, ``trainer_state``): it must take those."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    parameters = signature.parameters.values()
    takes_columns = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    # named parameters are columns it reads (answer, ...), passed as keywords: none may be positional-only
    by_keyword = all(p.kind is not inspect.Parameter.POSITIONAL_ONLY or p.default is not p.empty
                     for p in parameters)
    if not (takes_columns and by_keyword):
        raise ValueError(f"{field}: {spec} must accept (prompts, completions, **kwargs), TRL's reward "
                         f"signature (the other columns come as keywords); it takes {signature}")


@contextmanager
def calling(field: str, spec: str):
    """Run a user's component: a stop can end it (:mod:`podsrl.interrupts`), and whatever it
    raises (``SystemExit`` included, and a ``KeyboardInterrupt`` no signal caused) becomes a
    :class:`UserCodeError` naming it. (podsrl's own
    components are not run through this: their errors are already podsrl's one-line errors,
    and their calls end.)"""
    with interrupts.interruptible(f"{field} {spec}"):
        try:
            yield
        except UserCodeError:
            raise
        except (Exception, SystemExit) as err:
            raise UserCodeError(f"{field}: {spec} failed: {error_line(err)}{_user_line(err)}") from err
        except KeyboardInterrupt as err:  # a signal's stop goes on; one the code raised is its failure
            if not interrupts.raised_by_code(err):
                raise
            raise UserCodeError(f"{field}: {spec} failed: {error_line(err)} (raised by the code, no signal "
                                f"was sent){_user_line(err)}") from err


def podsrl_own(value: Any) -> bool:
    """Whether ``value`` is an instance of a class podsrl itself defines (a built-in component,
    held to its contract by its own code): a user's class, a subclass of a built-in included,
    is defined in the user's module."""
    return type(value).__module__.split(".")[0] == "podsrl"


def broken(field: str, spec: str, what: str) -> UserCodeError:
    return UserCodeError(f"{field}: {spec} returned {what}")


def tensor_like(value: Any, field: str, spec: str, shape: Sequence[int], floating: bool) -> torch.Tensor:
    """``value`` as a tensor of ``shape``, floating point or integer (not bool) as asked."""
    if not isinstance(value, torch.Tensor):
        raise broken(field, spec, f"a {type(value).__name__}, not a torch.Tensor of shape {list(shape)}")
    if tuple(value.shape) != tuple(shape):
        raise broken(field, spec, f"shape {list(value.shape)}, expected {list(shape)}")
    if floating and not value.is_floating_point():
        raise broken(field, spec, f"dtype {value.dtype}, expected a floating-point tensor")
    if not floating and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise broken(field, spec, f"dtype {value.dtype}, expected integer indices")
    return value


def finite(value: torch.Tensor, field: str, spec: str, where: torch.Tensor | None = None) -> torch.Tensor:
    """``value``, refused if it holds NaN or inf (where ``where`` is True, if given)."""
    bad = ~torch.isfinite(value)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        count = int(bad.sum())
        raise broken(field, spec, f"{count} non-finite value{'s' if count > 1 else ''} (NaN or inf)")
    return value


def index_list(value: Any, field: str, spec: str, count: int, size: int) -> list[int]:
    """``value`` as ``count`` indices into ``range(size)`` (ints, numpy ints or a 1-d tensor)."""
    if isinstance(value, torch.Tensor):
        value = value.tolist() if value.dim() == 1 and not value.is_floating_point() else [value]
    try:
        items = list(value)
    except TypeError:
        raise broken(field, spec,
                     f"a {type(value).__name__}, expected a list of {count} prompt indices") from None
    if len(items) != count:
        raise broken(field, spec, f"{len(items)} prompt indices, expected {count}")
    out = []
    for item in items:
        if isinstance(item, bool) or not hasattr(item, "__index__"):
            raise broken(field, spec, f"{item!r} among its prompt indices, expected integers")
        if not 0 <= int(item) < size:
            raise broken(field, spec, f"prompt index {int(item)}, outside 0..{size - 1}")
        out.append(int(item))
    return out


def number_record(value: Any, field: str, spec: str, taken: Callable[[str], bool]) -> dict[str, float]:
    """A dict of metric names to numbers, none of them a name ``taken`` by the trainer."""
    if not isinstance(value, dict):
        raise broken(field, spec, f"a {type(value).__name__} from record(), expected a dict of numbers")
    for key, number in value.items():
        if not isinstance(key, str) or taken(key):
            raise broken(field, spec, f"the metric {key!r} from record(), a name the trainer writes itself; "
                                      f"give it another name")
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise broken(field, spec, f"{key}={number!r} from record(), expected a finite number")
    return value


# --- loading user code: module:function and file.py:function ------------------------------------
def load_object(spec: str, field: str):
    """The callable ``module:attr`` or ``path/to/file.py:attr`` names. A module that fails to
    import, for whatever reason, is a one-line ValueError naming it and ``field``."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"{field}: {spec!r} is not 'module:function' or 'file.py:function'")
    module = _load_file(module_name, field) if module_name.endswith(".py") else _import(module_name, field)
    obj = getattr(module, attr, None)
    if not callable(obj):
        raise ValueError(f"{field}: {module_name!r} has no function {attr!r}")
    return obj


def _import(name: str, field: str):
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as err:  # whatever the module raises at import (not a Ctrl-C)
        raise ValueError(f"{field}: cannot import module {name!r} ({error_line(err)})") from None


def _load_file(given: str, field: str):
    """The module of a user file, loaded once (as import does: the same file gives the same
    functions) under a private name, ``podsrl_user_file_<stem>_<hash of its path>``: a file
    named like a module (``json.py``) must not replace that module in ``sys.modules``."""
    path = Path(given).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{field}: file not found: {path}")
    stem = re.sub(r"\W", "_", path.stem)
    name = f"podsrl_user_file_{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs, as import does: dataclasses and pickle look it up there
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # whatever the file raises at import (not a Ctrl-C)
        del sys.modules[name]
        raise ValueError(f"{field}: cannot load {given} ({error_line(err)}{_line_in(err, path)})") from None
    return module


def _line_in(err: BaseException, path: Path) -> str:
    """``, line N``: the last line of ``path`` the error passed through (a SyntaxError names
    its own line in its message)."""
    if isinstance(err, SyntaxError):
        return ""
    lines = [tb.tb_lineno for tb in _frames(err.__traceback__) if tb.tb_frame.f_code.co_filename == str(path)]
    return f", line {lines[-1]}" if lines else ""


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next

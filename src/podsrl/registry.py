"""One registration form for every extension kind: selection rules, generation engines,
tasks and reward functions are each a :class:`Registry`, and a config value is either a
registered name or ``module:function`` / ``path/to/file.py:function``, so users extend
podsrl without editing it (as verl registers its advantage estimators by decorator).

    from podsrl.algorithms.select import RULES

    @RULES.register("min_variance")
    def min_variance(rewards, m, generator=None): ...      # then: --downsampling_rule min_variance

or, with nothing registered: ``--downsampling_rule ./my_rules.py:min_variance``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

from podsrl.contracts import calling, check_signature, error_line, spec_name

__all__ = ["Checked", "Registry", "error_line", "load_object"]


class Registry(dict):
    """Named implementations of one kind, looked up by a config ``field``. A dict (``name in
    RULES``, ``RULES[name]`` keep working) with :meth:`register`, :meth:`resolve` and
    :meth:`checked`. The kind's contract (:mod:`podsrl.contracts`): what it must accept
    (``takes``, ``arity`` positional arguments), checked when resolved, and ``check_output``,
    ``(value, args, field, spec) -> value``, run on what each checked call returns."""

    def __init__(self, kind: str, field: str, entries: dict[str, Any] | None = None, *, takes: str = "",
                 arity: int | None = None, check_output: Callable[..., Any] | None = None) -> None:
        super().__init__(entries or {})
        self.kind, self.field = kind, field
        self.takes, self.arity, self.check_output = takes, arity, check_output
        self._checked: dict[str, Checked] = {}  # by spec: a name registered later is a new spec

    def register(self, name: str | None = None) -> Callable[[Any], Any]:
        """Decorator: add the object under ``name`` (default: its ``__name__``)."""
        def add(obj):
            key = name or obj.__name__
            if key in self:
                raise ValueError(f"{self.field}: a {self.kind} named {key!r} is registered already")
            self[key] = obj
            return obj
        return add

    def resolve(self, spec: str):
        """The registered object named ``spec``, else the object ``module:attr`` /
        ``file.py:attr`` names, its signature checked against the kind's; a one-line
        ValueError naming the field otherwise."""
        if spec in self:
            obj = self[spec]
        elif ":" not in spec:
            raise ValueError(f"{self.field}: unknown {self.kind} {spec!r}: neither a built-in {self.kind} "
                             f"({', '.join(sorted(self))}) nor 'module:function' / 'file.py:function'")
        else:
            obj = load_object(spec, self.field)
        if self.arity is not None:
            check_signature(obj, self.field, spec, self.takes, self.arity)
        return obj

    def checked(self, spec: "str | Callable") -> "Checked":
        """``spec`` (a name, ``module:function``, or the object itself) as a callable that
        keeps the kind's contract on every call."""
        if isinstance(spec, str):  # resolved and its signature checked once, not at every call (select's per step)
            cached = self._checked.get(spec)
            if cached is None or (spec in self and self[spec] is not cached.fn):  # an entry replaced since
                cached = self._checked[spec] = Checked(self.resolve(spec), self, spec)
            return cached
        if self.arity is not None:
            check_signature(spec, self.field, spec_name(spec), self.takes, self.arity)
        return Checked(spec, self, spec_name(spec))


class Checked:
    """A component with its kind's contract: each call is interruptible, its exceptions are
    the component's failure, its output is checked (:meth:`Registry.checked`)."""

    def __init__(self, fn: Callable, registry: Registry, spec: str) -> None:
        self.fn, self.field, self.spec, self.check_output = fn, registry.field, spec, registry.check_output
        self.takes_groups = getattr(fn, "takes_groups", False)  # a selection rule's form
        self.users = not any(fn is builtin for builtin in registry.values())  # a user's: a stop may end it

    def __call__(self, *args):
        with calling(self.field, self.spec) if self.users else nullcontext():
            value = self.fn(*args)
        return self.check_output(value, args, self.field, self.spec) if self.check_output else value

    def __repr__(self) -> str:
        return f"Checked({self.field}={self.spec})"


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

"""One registration form for every extension kind: selection rules (``RULES``), advantage
estimators (``ADVANTAGES``), losses (``LOSSES``), reward functions (``REWARDS``), tasks
(``TASKS``), prompt selectors (``PROMPT_SELECTORS``), generation engines (``ENGINES``) and
generation schedules (``SCHEDULES``) are each a :class:`Registry`, and a config value is either a
registered name or ``module:function`` / ``path/to/file.py:function``, so users extend
podsrl without editing it (as verl registers its advantage estimators by decorator).

    from podsrl.algorithms.select import RULES

    @RULES.register("min_variance")
    def min_variance(rewards, m, generator=None): ...      # then: --downsampling_rule min_variance

or, with nothing registered: ``--downsampling_rule ./my_rules.py:min_variance``.

A value may also be a mapping of the name and keyword arguments to bind (in YAML, or as JSON
text on the command line), checked against the component's signature at start-up::

    downsampling_rule: {name: ./my_rules.py:min_variance, temperature: 0.5}
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any, Callable, Union

from podsrl.contracts import (
    Range,
    argument_ranges,
    calling,
    check_signature,
    error_line,
    load_object,
    non_negative,
    positive,
    probability,
    spec_name,
)
from podsrl.options import check_option

__all__ = ["NAME_KEY", "Bound", "Checked", "OptionsBound", "Range", "Registry", "Spec", "argument_ranges",
           "bind_kwargs", "bind_options", "component_label", "error_line", "load_object", "non_negative",
           "positive", "probability", "spec_parts", "split_specs"]

NAME_KEY = "name"  # the component's key in a mapping spec: {name: my.py:rule, temperature: 0.5}
Spec = Union[str, Mapping[str, Any]]  # a name / module:function, or a mapping of one and keyword arguments


class Registry(dict):
    """Named implementations of one kind, looked up by a config ``field``. A dict (``name in
    RULES``, ``RULES[name]`` keep working) with :meth:`register`, :meth:`resolve` and
    :meth:`checked`. The kind's contract (:mod:`podsrl.contracts`): what it must accept
    (``takes``, ``arity`` positional arguments), checked when resolved, and ``check_output``,
    ``(value, args, field, spec) -> value``, run on what each checked call returns."""

    def __init__(self, kind: str, field: str, entries: dict[str, Any] | None = None, *, takes: str = "",
                 arity: int | None = None, check_output: Callable[..., Any] | None = None,
                 passes: tuple[str, ...] = (), many: bool = False,
                 binds: Callable[[Any, dict, str], Any] | None = None) -> None:
        """``passes``: keyword arguments podsrl passes on every call (a spec may not bind them);
        ``many``: the field is a list of specs; ``binds(obj, kwargs, name)``: how a spec's
        keyword arguments are bound (default :func:`bind_kwargs`, to the object itself)."""
        super().__init__(entries or {})
        self.kind, self.field = kind, field
        self.takes, self.arity, self.check_output = takes, arity, check_output
        self.passes, self.many, self.binds = passes, many, binds
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

    def resolve(self, spec: Spec):
        """The registered object named ``spec``, else the object ``module:attr`` / ``file.py:attr``
        names, its signature checked against the kind's; a one-line ValueError naming the field
        otherwise. A mapping spec's keyword arguments are bound (:meth:`bind`)."""
        if not isinstance(spec, str):
            name, kwargs = spec_parts(spec, self.field)
            # with arguments, the signature is checked once they are bound: a keyword-only one
            # without a default is fine when the spec sets it
            return self.bind(self._named(name), kwargs, name) if kwargs else self.resolve(name)
        obj = self._named(spec)
        if self.arity is not None:
            check_signature(obj, self.field, spec, self.takes, self.arity)
        return obj

    def _named(self, spec: str):
        """The registered object named ``spec``, else the one ``module:attr`` / ``file.py:attr`` names."""
        if spec in self:
            obj = self[spec]
        elif ":" not in spec:
            raise ValueError(f"{self.field}: unknown {self.kind} {spec!r}: neither a built-in {self.kind} "
                             f"({', '.join(sorted(self))}) nor 'module:function' / 'file.py:function'")
        else:
            obj = load_object(spec, self.field)
        return obj

    def bind(self, obj, kwargs: dict[str, Any], name: str):
        """``obj`` (resolved from ``name``) with a spec's keyword arguments bound, checked."""
        if self.binds is not None:
            return self.binds(obj, kwargs, name)
        return bind_kwargs(obj, kwargs, self.field, name, self.takes, self.arity, self.passes)

    def parse(self, raw: Any, source: str = "") -> Any:
        """A config value in mapping form, ``{name: ..., argument: value}`` or its JSON text (the
        command line's form; for a ``many`` field also a list of names and mappings, or its JSON
        text), as the config stores it (:func:`stored_spec`). None for any other value: a name,
        or a list of names, is text as before."""
        if isinstance(raw, str) and self.many and "{" in raw and raw.strip()[:1] != "[":  # 'a,{"name": ...}'
            return self._stored_list([self._json(item, source) if item[:1] == "{" else item
                                      for item in split_specs(raw)], source)
        if isinstance(raw, str) and raw.strip()[:1] in (("{", "[") if self.many else ("{",)):
            raw = self._json(raw, source)
            if self.many and isinstance(raw, list):
                return self._stored_list(raw, source)
        if isinstance(raw, Mapping):
            return self._stored_list([raw], source) if self.many else stored_spec(raw, self.field, source)
        if isinstance(raw, (list, tuple)) and any(isinstance(item, Mapping) for item in raw):
            if not self.many:
                raise ValueError(f"{source}{self.field}: expected one {self.kind}, got a list {raw!r}")
            return self._stored_list(raw, source)
        return None

    def _json(self, text: str, source: str) -> Any:
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except _KeyTwice as err:  # json keeps the last silently: which one was meant is unknown
            raise ValueError(f"{source}{self.field}: key {err.key!r} given twice in {text!r}; JSON keeps "
                             "only the last: remove one") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{source}{self.field}: not valid JSON ({err}): {text!r}") from None

    def _stored_list(self, items, source: str):
        """A ``many`` field's specs: the comma-separated text when all are names, else a list."""
        specs = []
        for item in items:
            if isinstance(item, str) and "," in item:
                raise ValueError(f"{source}{self.field}: list items may not contain commas, got {item!r}")
            if not isinstance(item, (str, Mapping)):
                raise ValueError(f"{source}{self.field}: expected names or mappings {{{NAME_KEY}: ..., "
                                 f"argument: value}}, got {item!r}")
            spec = item.strip() if isinstance(item, str) else stored_spec(item, self.field, source)
            specs += [spec] if spec else []
        return ",".join(specs) if all(isinstance(spec, str) for spec in specs) else specs

    def checked(self, spec: "Spec | Callable") -> "Checked":
        """``spec`` (a name, ``module:function``, a mapping of one and keyword arguments, or
        the object itself) as a callable that keeps the kind's contract on every call."""
        if isinstance(spec, Checked) and spec.field == self.field:  # bound at set-up already
            return spec
        if isinstance(spec, (str, Mapping)):  # resolved and checked once, not at every call (select's)
            key = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True, default=repr)
            name = spec_parts(spec, self.field)[0]
            cached = self._checked.get(key)
            if cached is None or (name in self and self[name] is not cached.target):  # replaced since
                cached = self._checked[key] = Checked(self.resolve(spec), self, component_label(spec))
            return cached
        if self.arity is not None:
            check_signature(spec, self.field, spec_name(spec), self.takes, self.arity)
        return Checked(spec, self, spec_name(spec))


class Checked:
    """A component with its kind's contract: each call is interruptible, its exceptions are
    the component's failure, its output is checked (:meth:`Registry.checked`)."""

    def __init__(self, fn: Callable, registry: Registry, spec: str) -> None:
        self.fn, self.field, self.spec, self.check_output = fn, registry.field, spec, registry.check_output
        self.target = fn.func if isinstance(fn, Bound) else fn  # what the spec names, its arguments unbound
        self.takes_groups = getattr(fn, "takes_groups", False)  # a selection rule's form
        self.users = getattr(self.target, "__module__", "").split(".")[0] != "podsrl"  # a user's code

    def __call__(self, *args):
        with calling(self.field, self.spec) if self.users else nullcontext():
            value = self.fn(*args)
        return self.check_output(value, args, self.field, self.spec) if self.check_output else value

    def __repr__(self) -> str:
        return f"Checked({self.field}={self.spec})"


class Bound(functools.partial):
    """A component with a spec's keyword arguments bound: it keeps the component's name,
    module and public attributes (a rule's ``takes_groups``, a reward's ``reward_bounds``),
    and a call that passes one of the bound arguments again is refused, not silently
    preferred (a reward function's data column named like one)."""

    def __new__(cls, func, /, **kwargs):
        self = super().__new__(cls, func, **kwargs)
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(func, attr):
                setattr(self, attr, getattr(func, attr))
        return self

    def __call__(self, /, *args, **kwargs):
        again = sorted(set(self.keywords) & set(kwargs))
        if again:
            raise TypeError(f"{', '.join(again)}: given in the config and passed on the call too")
        return super().__call__(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):  # inspect's and pickle's lookups must see the partial itself
            raise AttributeError(name)
        return getattr(self.func, name)

    def __repr__(self) -> str:
        return f"Bound({component_label({NAME_KEY: spec_name(self.func), **self.keywords})})"


class OptionsBound(Bound):
    """A component built as ``component(*args, options)`` whose ``options`` (a dataclass) have
    some fields set by a spec's keyword arguments: ``{name: pass_rate, half_life: 20}`` builds
    the built-in with ``dataclasses.replace(options, half_life=20)`` (:func:`bind_options`)."""

    def __new__(cls, func, fields: dict[str, Any], /):
        self = super().__new__(cls, func)
        self.fields = dict(fields)
        return self

    def __call__(self, /, *args):
        *head, options = args
        return super().__call__(*head, dataclasses.replace(options, **self.fields))

    def __repr__(self) -> str:
        return f"OptionsBound({component_label({NAME_KEY: spec_name(self.func), **self.fields})})"


def bind_options(options_type, run_fields: frozenset[str], field: str, takes: str, arity: int):
    """A registry's ``binds`` for components that take an options dataclass last: a spec's keyword
    argument in the component's own signature is bound to it (:func:`bind_kwargs`); any other must
    be a field of ``options_type`` (None: the component's ``options_type``, as engines declare it),
    not set by the run (``run_fields`` and the class's), read by the component (its ``option_fields``,
    where declared), of its default's type and in its field's range (:func:`podsrl.options.option`), and
    replaces that field, over the config's flat field. Built-ins take arguments as user components do."""
    def binds(obj, kwargs: dict[str, Any], name: str):
        kind = options_type or getattr(obj, "options_type", None)
        skip = run_fields | getattr(kind, "run_fields", frozenset())
        fields = {f.name: f for f in dataclasses.fields(kind)
                  if f.init and f.name not in skip} if kind else {}
        try:
            own = {p.name for p in inspect.signature(obj).parameters.values() if p.kind in _SETTABLE}
        except (TypeError, ValueError):
            own = set()
        mine = {key: value for key, value in kwargs.items() if key in own}
        options = {key: value for key, value in kwargs.items() if key not in own}
        settable = set(getattr(obj, "option_fields", fields)) & set(fields)  # what it reads, where declared
        for key, value in options.items():
            if key not in settable:
                takes_too = sorted((own - {"options", "size"}) | settable) or ["none"]
                raise ValueError(f"{field}: {name} takes no argument {key!r} "
                                 f"(it takes: {', '.join(takes_too)})")
            _check_type(fields[key].default, value, f"{field}: {name}: argument {key}")
            check_option(fields[key], value, f"{field}: {name}: argument {key}")
        if not mine:  # bind_kwargs checks the signature with the arguments bound
            check_signature(obj, field, name, takes, arity)
        bound = bind_kwargs(obj, mine, field, name, takes, arity) if mine else obj
        return OptionsBound(bound, options) if options else bound
    return binds


class _KeyTwice(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict (``json.loads``'s object_pairs_hook), refusing a key given twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _KeyTwice(key)
        out[key] = value
    return out


def spec_parts(spec: Spec, field: str = "component") -> tuple[str, dict[str, Any]]:
    """(name, keyword arguments) of a spec: a string, or a mapping ``{name: ..., argument:
    value, ...}`` whose arguments are identifiers with JSON values (the run's config.json
    stores them, and a resume compares them); a one-line ValueError naming ``field`` else."""
    if isinstance(spec, str):
        return spec, {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"{field}: expected a name or a mapping {{{NAME_KEY}: ..., argument: value}}, "
                         f"got {spec!r}")
    kwargs = dict(spec)
    name = kwargs.pop(NAME_KEY, None)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{field}: a mapping needs {NAME_KEY!r}, the registered name or 'module:function' "
                         f"of the component, next to its arguments; got {dict(spec)!r}")
    for key, value in kwargs.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"{field}: {name}: {key!r} is not an argument name")
        try:
            same = json.loads(json.dumps(value, allow_nan=False)) == value
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(f"{field}: {name}: argument {key} = {value!r} must be JSON data (numbers, text, "
                             f"true/false, null, lists, mappings): the run's config.json keeps it")
    return name.strip(), kwargs


def split_specs(text: str) -> list[str]:
    """Comma-separated component specs, stripped, empty ones dropped: split only at commas outside
    brackets, braces and double-quoted strings, so a JSON mapping with arguments is one item."""
    items, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, char in enumerate(text):
        if quoted:
            escaped, quoted = (False, quoted) if escaped else (char == "\\", char != '"')
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def stored_spec(spec: Mapping, field: str, source: str = "") -> Spec:
    """A mapping spec as the config stores it: the name first, then the arguments sorted;
    a mapping of only a name is that name, so it behaves exactly as the name does."""
    try:
        name, kwargs = spec_parts(spec, field)
    except ValueError as err:
        raise ValueError(f"{source}{err}") from None
    return {NAME_KEY: name, **dict(sorted(kwargs.items()))} if kwargs else name


def component_label(spec: Any, short: bool = False) -> str:
    """How labels, folder names and errors show a spec: the name, then its arguments as
    JSON, sorted: ``my_rules.py:min_variance(temperature=0.5)``; ``short``: the name's part
    after its last ``:`` (a module's object by its own name)."""
    if not isinstance(spec, Mapping):
        return str(spec).rpartition(":")[2] if short and isinstance(spec, str) else str(spec)
    kwargs = dict(spec)
    name = str(kwargs.pop(NAME_KEY, "?"))
    name = name.rpartition(":")[2] if short else name
    shown = ", ".join(f"{key}={json.dumps(value, separators=(',', ':'), sort_keys=True, default=repr)}"
                      for key, value in sorted(kwargs.items()))
    return f"{name}({shown})" if kwargs else name


_PASSED_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_SETTABLE = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def bind_kwargs(obj, kwargs: dict[str, Any], field: str, name: str, takes: str = "", arity: int | None = None,
                passes: tuple[str, ...] = ()) -> Bound:
    """``obj`` (named ``name``) with ``kwargs`` bound, checked at start-up: each must name a
    parameter of ``obj`` taken by keyword that podsrl does not pass itself (the first
    ``arity`` positional ones, ``passes``), with a value of its default's type, in its range if
    ``obj`` declares one (:func:`argument_ranges`); bound, ``obj`` must still accept ``arity``
    positional arguments (``takes``). One-line ValueErrors naming ``field``."""
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        raise ValueError(f"{field}: {name} has no signature to check the arguments {sorted(kwargs)} against; "
                         f"bind them in your own function instead") from None
    positional = [p.name for p in parameters.values() if p.kind in _PASSED_BY_POSITION]
    passed = set(positional[:arity or 0]) | set(passes)
    settable = [p.name for p in parameters.values() if p.kind in _SETTABLE and p.name not in passed]
    for key, value in kwargs.items():
        if key in passed:
            raise ValueError(f"{field}: {name}: argument {key!r} gets what podsrl passes (it is called as "
                             f"{takes or name}); it cannot be set in the config")
        if key not in settable:
            raise ValueError(f"{field}: {name} takes no argument {key!r} "
                             f"(it takes: {', '.join(settable) or 'none'})")
        _check_type(parameters[key].default, value, f"{field}: {name}: argument {key}")
        if key in getattr(obj, "argument_ranges", {}):
            obj.argument_ranges[key].check(value, f"{field}: {name}: argument {key}")
    bound = Bound(obj, **kwargs)
    if arity is not None:
        check_signature(bound, field, component_label({NAME_KEY: name, **kwargs}), takes, arity)
    return bound


def _check_type(default: Any, value: Any, where: str) -> None:
    """A value of the kind of the parameter's default (true/false, a number, text), where it has one."""
    expected = next((kinds for kinds in ((bool,), (int, float), (str,)) if isinstance(default, kinds)), None)
    if expected is None or isinstance(value, expected) and (bool in expected or not isinstance(value, bool)):
        return
    hint = " (YAML reads 1e-6 as text: write 1.0e-6)" if float in expected and isinstance(value, str) else ""
    raise ValueError(f"{where}: expected {'a number' if float in expected else type(default).__name__} like "
                     f"its default {default!r}, got {value!r}{hint}")

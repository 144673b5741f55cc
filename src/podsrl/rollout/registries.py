"""The generation stage's registries and the contracts a user's parts are held to:
``ENGINES`` (the config's ``generation_engine``; each built-in registers itself where it is
defined) with :class:`CheckedEngine`, and ``WATCHERS`` (``generation_watchers``) with
:class:`WatcherFactory` and :class:`CheckedWatcher` (:mod:`podsrl.contracts`: each call can be
stopped, fails in one line naming it, and its output is checked)."""

from __future__ import annotations

import inspect
import numbers

from podsrl.contracts import UserCodeError, broken, calling, podsrl_own
from podsrl.registry import Registry, bind_options, component_label
from podsrl.rollout.base import KIND_METHODS, PRUNE_RUNNING, STOP_GROUPS, Watcher, capabilities
from podsrl.rollout.partial import PartialCall, PartialGeneration
from podsrl.types import Rollouts


class CheckedEngine:
    """A user's engine held to its contract (:mod:`podsrl.contracts`): each call can be stopped,
    fails in one line naming it, and must return :class:`Rollouts` [P, num_samples, Lc] for its
    P prompts, or, given a :class:`~podsrl.rollout.partial.PartialCall` (partial rollouts), a
    :class:`PartialGeneration` of ``quota`` complete groups; everything else (``state_dict``,
    ``close``, ``generate``, ...) is the engine's."""

    def __init__(self, inner, field: str, spec: str) -> None:
        for method in ("state_dict", "load_state_dict", "check_state"):
            if not callable(getattr(inner, method, None)):
                raise ValueError(f"{field}: {spec} has no method {method}() "
                                 "(see podsrl.rollout.GenerationEngine)")
        if capabilities(inner, spec).partial_rollouts and not _takes_partial(inner):
            raise ValueError(f"{field}: {spec} declares partial_rollouts and its call takes no partial= "
                             "keyword (a podsrl.rollout.partial.PartialCall; see "
                             "podsrl.rollout.GenerationEngine)")
        self.inner, self.field, self.spec = inner, field, spec

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 watchers: tuple[Watcher, ...] = (),
                 partial: PartialCall | None = None) -> Rollouts | PartialGeneration:
        # partial= only where asked: an engine that does not declare partial rollouts never gets it
        asked = {} if partial is None else {"partial": partial}
        with calling(self.field, self.spec):
            result = self.inner(model, tokenizer, prompts, num_samples, watchers=watchers, **asked)
        if partial is not None:
            return self.checked_partial(result, partial.quota, num_samples)
        if not isinstance(result, Rollouts):
            raise broken(self.field, self.spec,
                         f"a {type(result).__name__}, expected podsrl.types.Rollouts")
        expected = (len(prompts), num_samples)
        for name in ("completion_ids", "completion_mask"):
            shape = tuple(getattr(result, name).shape)
            if shape[:2] != expected or len(shape) != 3:
                raise broken(self.field, self.spec, f"{name} of shape {list(shape)}, expected "
                                                    f"[{expected[0]}, {expected[1]}, Lc] ({expected[0]} "
                                                    f"prompts x {expected[1]})")
        if result.prompt_ids.dim() != 2 or result.prompt_ids.shape[0] != len(prompts):
            raise broken(self.field, self.spec, f"prompt_ids of shape {list(result.prompt_ids.shape)}, "
                                                f"expected [{len(prompts)}, Lp]")
        return result

    def checked_partial(self, result, quota: int, num_samples: int) -> PartialGeneration:
        """A partial call's result: ``quota`` complete groups [quota, num_samples, Lc]."""
        if not isinstance(result, PartialGeneration):
            raise broken(self.field, self.spec, f"a {type(result).__name__} from a partial call, "
                                                "expected podsrl.rollout.partial.PartialGeneration")
        shape = tuple(result.rollouts.completion_ids.shape)
        if len(result.complete) != quota or shape[:2] != (quota, num_samples):
            raise broken(self.field, self.spec, f"{len(result.complete)} complete groups of shape "
                                                f"{list(shape)} from a partial call, expected {quota} "
                                                f"x {num_samples}")
        return result

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _takes_partial(engine) -> bool:
    """Whether ``engine``'s call takes a ``partial`` keyword (or any keyword)."""
    try:
        parameters = inspect.signature(engine).parameters.values()
    except (TypeError, ValueError):  # no signature to read: its first call says
        return True
    return any(p.name == "partial" or p.kind is p.VAR_KEYWORD for p in parameters)


def checked_engine(value, args: tuple, field: str, spec: str):
    """The registry's contract for engines: a user's engine (a subclass of a built-in included)
    gets a :class:`CheckedEngine`."""
    return value if podsrl_own(value) else CheckedEngine(value, field, spec)


class CheckedWatcher:
    """A user's watcher (``generation_watchers``) held to its kind's contract where the engine calls
    it: its kind is the one its factory declared (what the config checked), it has every method the
    kind calls (:data:`~podsrl.rollout.base.KIND_METHODS`), each call can be stopped and fails in one
    line naming it, and what it returns is checked: a ``stop_groups`` watcher's prompt indices among
    the call's ``prompts``, a ``prune_running`` one's (prompt, sample) pairs of the call's samples
    (``samples`` a prompt) and its ``lengths(prompt)`` ascending completion lengths. (That a group
    keeps ``num_kept`` generated samples is checked after the call, where the engine's
    :class:`~podsrl.types.Rollouts` tell it: :meth:`podsrl.trainer.stages.RolloutGenerator.check_kept`.)
    Another kind's contract is its engine's: the rest of the watcher is its own."""

    def __init__(self, inner, kind: str, prompts: int, field: str, spec: str, samples: int) -> None:
        declared = getattr(inner, "kind", None)
        if declared != kind:
            raise broken(field, spec, f"a watcher of kind {declared!r}, and it declares kind {kind!r}")
        missing = [name for name in KIND_METHODS.get(kind, ()) if not callable(getattr(inner, name, None))]
        if missing:
            raise broken(field, spec, f"a watcher of kind {kind!r} without the method {missing[0]}() its "
                                      f"kind calls (podsrl.rollout.Watcher)")
        self.inner, self.kind, self.prompts, self.samples = inner, kind, prompts, samples
        self.field, self.spec = field, spec

    def __call__(self, *shown):
        """``stop_groups``: (prompt_index, completion_ids) -> prompt indices; ``prune_running``:
        (samples, lengths, features, running) -> (prompt, sample) pairs of the call's samples."""
        with calling(self.field, self.spec):
            named = self.inner(*shown)
        if self.kind == STOP_GROUPS:
            if not isinstance(named, (list, tuple)) or not all(_index(p, self.prompts) for p in named):
                raise self.broken(f"{_shown(named)}, expected a list of prompt indices in "
                                  f"[0, {self.prompts})")
            return [int(p) for p in named]
        if self.kind == PRUNE_RUNNING:
            if not isinstance(named, (list, tuple)) or not all(self.sample(pair) for pair in named):
                raise self.broken(f"{_shown(named)}, expected a list of (prompt, sample) pairs of the call, "
                                  f"prompt in [0, {self.prompts}) and sample in [0, {self.samples})")
            return [(int(prompt), int(sample)) for prompt, sample in named]
        return named

    def lengths(self, prompt: int) -> tuple[int, ...]:
        """``prune_running``: the completion lengths at which samples of ``prompt`` are shown,
        checked: ints >= 1, strictly ascending."""
        with calling(self.field, self.spec):
            lengths = self.inner.lengths(prompt)
        ints = isinstance(lengths, (list, tuple, range)) and all(_index(k, 1 << 62) and k >= 1
                                                                  for k in lengths)
        if not ints or any(a >= b for a, b in zip(lengths, lengths[1:])):
            raise self.broken(f"{_shown(lengths)} from lengths({prompt}), expected strictly ascending "
                              f"completion lengths, ints >= 1")
        return tuple(int(k) for k in lengths)

    def sample(self, pair) -> bool:
        """Whether ``pair`` names a sample of the call: a tuple (prompt, sample)."""
        return (isinstance(pair, tuple) and len(pair) == 2 and _index(pair[0], self.prompts)
                and _index(pair[1], self.samples))

    def broken(self, what: str) -> UserCodeError:
        return broken(self.field, self.spec, what)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _index(value, size: int) -> bool:
    """Whether ``value`` is an integer (a bool is not) in [0, size)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < size


def _shown(value) -> str:
    """``value`` as a refusal shows it: its repr, cut to one readable line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 120 else text[:117] + "..."


def watcher_kind(spec) -> str:
    """The kind a ``generation_watchers`` factory declares (its ``kind`` attribute), or a
    one-line error naming it."""
    kind = getattr(WATCHERS.resolve(spec), "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"generation_watchers: {component_label(spec)} declares no kind (a class attribute "
                         f"kind = 'stop_groups', or a kind its engine declares; podsrl.rollout.Watcher)")
    return kind


class WatcherFactory:
    """A ``generation_watchers`` spec: per generation call, ``factory(prompts, tokenizer, step)``
    (interruptible, its failures one line naming it) -> a :class:`CheckedWatcher` for the call."""

    def __init__(self, spec) -> None:
        self.make, self.kind, self.spec = WATCHERS.checked(spec), watcher_kind(spec), component_label(spec)

    def __call__(self, prompts, tokenizer, step: int, samples: int) -> CheckedWatcher:
        """The watcher of a call on ``prompts`` generating ``samples`` a prompt."""
        return CheckedWatcher(self.make(prompts, tokenizer, step), self.kind, len(prompts.prompts),
                              WATCHERS.field, self.spec, samples)


# What watches a generation call's samples, by the user's rule: factories called per call as
# factory(prompts, tokenizer, step) -> Watcher, each declaring its ``kind`` (a class attribute:
# the config checks it against the engine's capabilities before any model loads). podsrl's own
# watcher, early stop's, is switched on by group_early_stop.
WATCHERS = Registry("watcher", "generation_watchers", takes="(prompts, tokenizer, step)", arity=3, many=True)

# a spec's arguments set the engine's own options (its options_type), as selectors' set theirs;
# each built-in engine is registered where it is defined (hf.py, slots.py, vllm.py)
ENGINES = Registry("engine", "generation_engine", takes="(options)", arity=1, check_output=checked_engine,
                   binds=bind_options(None, frozenset(), "generation_engine", "(options)", 1))

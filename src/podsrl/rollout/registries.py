"""The generation stage's registries and the contracts a user's parts are held to:
``ENGINES`` (the config's ``generation_engine``; each built-in registers itself where it is
defined) with :class:`CheckedEngine`, and ``WATCHERS`` (``generation_watchers``) with
:class:`WatcherFactory` and :class:`CheckedWatcher` (:mod:`podsrl.contracts`: each call can be
stopped, fails in one line naming it, and its output is checked)."""

from __future__ import annotations

from podsrl.contracts import broken, calling, podsrl_own
from podsrl.registry import Registry, bind_options, component_label
from podsrl.rollout.base import PRUNE_RUNNING, STOP_GROUPS, Watcher, capabilities
from podsrl.rollout.partial import PartialGeneration
from podsrl.types import Rollouts


class CheckedEngine:
    """A user's engine held to its contract (:mod:`podsrl.contracts`): each call can be stopped,
    fails in one line naming it, and must return :class:`Rollouts` [P, num_samples, Lc] for its
    P prompts; everything else (``state_dict``, ``close``, ``generate``, ...) is the engine's."""

    def __init__(self, inner, field: str, spec: str) -> None:
        for method in ("state_dict", "load_state_dict", "check_state"):
            if not callable(getattr(inner, method, None)):
                raise ValueError(f"{field}: {spec} has no method {method}() "
                                 "(see podsrl.rollout.GenerationEngine)")
        if capabilities(inner, spec).partial_rollouts and not callable(getattr(inner, "generate_partial", None)):
            raise ValueError(f"{field}: {spec} declares partial_rollouts and has no method generate_partial() "
                             f"(see podsrl.rollout.GenerationEngine)")
        self.inner, self.field, self.spec = inner, field, spec

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 watchers: tuple[Watcher, ...] = ()) -> Rollouts:
        with calling(self.field, self.spec):
            rollouts = self.inner(model, tokenizer, prompts, num_samples, watchers=watchers)
        if not isinstance(rollouts, Rollouts):
            raise broken(self.field, self.spec,
                         f"a {type(rollouts).__name__}, expected podsrl.types.Rollouts")
        expected = (len(prompts), num_samples)
        for name in ("completion_ids", "completion_mask"):
            shape = tuple(getattr(rollouts, name).shape)
            if shape[:2] != expected or len(shape) != 3:
                raise broken(self.field, self.spec, f"{name} of shape {list(shape)}, expected [{expected[0]}, "
                                                    f"{expected[1]}, Lc] ({expected[0]} prompts x {expected[1]})")
        if rollouts.prompt_ids.dim() != 2 or rollouts.prompt_ids.shape[0] != len(prompts):
            raise broken(self.field, self.spec, f"prompt_ids of shape {list(rollouts.prompt_ids.shape)}, "
                                                f"expected [{len(prompts)}, Lp]")
        return rollouts

    @property
    def generate_partial(self):
        """The engine's partial rollouts (absent when it has none), held to the same contract:
        stoppable, one line naming it, and ``quota`` complete groups [quota, num_samples, Lc]."""
        inner = getattr(self.inner, "generate_partial", None)
        if inner is None:
            raise AttributeError("generate_partial")

        def checked(model, tokenizer, prompts: list[str], num_samples: int, *, quota: int, **kwargs):
            with calling(self.field, self.spec):
                result = inner(model, tokenizer, prompts, num_samples, quota=quota, **kwargs)
            if not isinstance(result, PartialGeneration):
                raise broken(self.field, self.spec, f"a {type(result).__name__} from generate_partial, expected "
                                                    f"podsrl.rollout.partial.PartialGeneration")
            shape = tuple(result.rollouts.completion_ids.shape)
            if len(result.complete) != quota or shape[:2] != (quota, num_samples):
                raise broken(self.field, self.spec, f"{len(result.complete)} complete groups of shape {list(shape)} "
                                                    f"from generate_partial, expected {quota} x {num_samples}")
            return result
        return checked

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def checked_engine(value, args: tuple, field: str, spec: str):
    """The registry's contract for engines: a user's engine (a subclass of a built-in included)
    gets a :class:`CheckedEngine`."""
    return value if podsrl_own(value) else CheckedEngine(value, field, spec)


class CheckedWatcher:
    """A user's watcher (``generation_watchers``) held to its contract: its kind is the one its
    factory declared (what the config checked); each call can be stopped and fails in one line
    naming it; a ``stop_groups`` watcher must return prompt indices among the call's
    ``prompts``, a ``prune_running`` one (prompt, sample) pairs. Another kind's contract is its
    engine's: the rest of the watcher is its own."""

    def __init__(self, inner, kind: str, prompts: int, field: str, spec: str) -> None:
        if getattr(inner, "kind", None) != kind:
            raise broken(field, spec, f"a watcher of kind {getattr(inner, 'kind', None)!r}, and it declares "
                                      f"kind {kind!r}")
        self.inner, self.kind, self.prompts, self.field, self.spec = inner, kind, prompts, field, spec

    def __call__(self, *shown):
        """``stop_groups``: (prompt_index, completion_ids) -> prompt indices; ``prune_running``:
        (samples, lengths, features, running) -> (prompt, sample) pairs of the call's samples."""
        with calling(self.field, self.spec):
            named = self.inner(*shown)
        if self.kind == STOP_GROUPS:
            if not isinstance(named, (list, tuple)) or any(type(p) is not int or not 0 <= p < self.prompts
                                                           for p in named):
                raise broken(self.field, self.spec, f"{named!r}, expected a list of prompt indices in [0, "
                                                    f"{self.prompts})")
            return list(named)
        if self.kind == PRUNE_RUNNING:
            pairs = named if isinstance(named, (list, tuple)) else None
            if pairs is None or any(not isinstance(pair, tuple) or len(pair) != 2 or type(pair[0]) is not int
                                    or not 0 <= pair[0] < self.prompts or type(pair[1]) is not int
                                    for pair in pairs):
                raise broken(self.field, self.spec, f"{named!r}, expected a list of (prompt, sample) pairs, "
                                                    f"prompt in [0, {self.prompts})")
            return list(pairs)
        return named

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


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

    def __call__(self, prompts, tokenizer, step: int) -> CheckedWatcher:
        return CheckedWatcher(self.make(prompts, tokenizer, step), self.kind, len(prompts.prompts),
                              WATCHERS.field, self.spec)


# What watches a generation call's samples, by the user's rule: factories called per call as
# factory(prompts, tokenizer, step) -> Watcher, each declaring its ``kind`` (a class attribute:
# the config checks it against the engine's capabilities before any model loads). podsrl's own
# watcher, early stop's, is switched on by group_early_stop.
WATCHERS = Registry("watcher", "generation_watchers", takes="(prompts, tokenizer, step)", arity=3, many=True)

# a spec's arguments set the engine's own options (its options_type), as selectors' set theirs;
# each built-in engine is registered where it is defined (hf.py, slots.py, vllm.py)
ENGINES = Registry("engine", "generation_engine", takes="(options)", arity=1, check_output=checked_engine,
                   binds=bind_options(None, frozenset(), "generation_engine", "(options)", 1))

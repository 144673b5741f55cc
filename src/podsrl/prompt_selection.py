"""Which train prompts a step generates for: the prompt selector (``prompt_selector``).

PODS chooses which rollouts of a group to train on; a prompt selector chooses which prompts
get a group at all, so that fewer groups come out constant (every rollout right, or every
one wrong: advantages all 0, its n rollouts generated for nothing). Built-ins:

* ``shuffled``: a shuffled pass over the train split, epoch after epoch (the default).
* ``pass_rate``: draws prompts in proportion to the predicted chance that their group of n
  is not constant, from a per-prompt pass-rate posterior that forgets (algorithms/pass_rate.py),
  with a share of every draw spread evenly (exploration: no prompt starves, unseen prompts
  get tried).

DAPO's dynamic sampling (``dynamic_sampling``) is not a selector but a property of the prompt
source (:class:`podsrl.generation.prompt_source.PromptSource`'s rounds): it asks any selector for
more prompts while groups come out constant, so it combines with each of these.

Every selector is deterministic given its seed and what it observed, the same on every
process (it observes the outcomes gathered from all of them), and checkpointed through
``state_dict`` (plain numbers: a resumed run draws what the uninterrupted one would).
A selector from a user module (``module:Class``) takes ``(size, options)``, ``size`` the number
of usable train prompts, and implements :class:`PromptSelector`; :class:`CheckedSelector`
holds it to that contract.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np
import torch

from podsrl.algorithms.pass_rate import PassRatePosterior, draw_probabilities, nonconstant_probability
from podsrl.contracts import broken, calling, error_line, index_list, number_record, podsrl_own
from podsrl.options import POSITIVE, Range, option
from podsrl.registry import Registry, bind_options


@dataclass(frozen=True)
class PromptSelectionOptions:
    """A selector's settings: the run's (seed, prompts_per_step) and pass_rate's own, set as its
    spec's arguments (``{name: pass_rate, half_life: 20}``) or by their flat config names
    (pass_rate_half_life: podsrl.options.flat_option; a spec's argument wins)."""

    run_fields: ClassVar[frozenset[str]] = frozenset({"seed", "prompts_per_step"})

    seed: int = 0  # the run's seed: the order of the pass, the draws
    prompts_per_step: int = 1  # prompts taken per generation round
    half_life: float = option(50.0, "pass_rate: steps after which a prompt's pass / fail evidence weighs half (the "
                                    "policy moves, so old outcomes say less).", POSITIVE)
    prior_strength: float = option(2.0, "pass_rate: pseudo-observations of the pool's pass rate in each prompt's "
                                        "belief (prompts seen rarely are judged by the pool).", POSITIVE)
    exploration: float = option(0.1, "pass_rate: share of each draw spread evenly over the train split, so every "
                                     "prompt keeps a chance of at least this / train prompts.",
                                     Range(0, 1, low_closed=False, why="0 could starve a prompt forever"))


class PromptSelector(Protocol):
    """``take`` the prompts of one generation round (indices into the train split, the same
    list on every process), then ``observe`` their outcomes (gathered from every process, for
    a selector that ``learns``). Under dynamic sampling a step may take several rounds."""

    learns: bool

    def take(self, count: int, step: int, group_size: int) -> list[int]: ...

    def observe(self, step: int, indices: list[int], correct: torch.Tensor) -> None:
        """``correct`` [K, n]: 1 / 0 per generated rollout, NaN where unverifiable or not generated."""

    def record(self) -> dict[str, float]:
        """The selector's numbers for the step's metrics record (empty: none)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    # optional: check_size(size, options), a static method refusing a train split of ``size``
    # prompts before any model loads (where the config caps the split: max_train_prompts)


def checked_selector(value, args: tuple, field: str, spec: str):
    """The registry's contract for selectors: a user's class gets a :class:`CheckedSelector`."""
    return value if podsrl_own(value) else CheckedSelector(value, field, spec, size=args[0])


# {name: pass_rate, half_life: 20}: a built-in's settings as keyword arguments, over the flat
# fields (pass_rate_half_life ...), in their options' ranges; seed and prompts_per_step are the run's
PROMPT_SELECTORS = Registry("prompt selector", "prompt_selector", takes="(size, options)", arity=2,
                            check_output=checked_selector,
                            binds=bind_options(PromptSelectionOptions, frozenset(), "prompt_selector",
                                               "(size, options)", 2))


@PROMPT_SELECTORS.register("shuffled")
class ShuffledPass:
    """Epoch-wise shuffled pass over the train split; its position is checkpointed."""

    learns = False
    option_fields = ()  # reads no setting of PromptSelectionOptions beyond the run's

    def __init__(self, size: int, options: PromptSelectionOptions = PromptSelectionOptions()) -> None:
        self.size, self.seed, self.epoch, self.position = size, options.seed, 0, 0

    def _order(self) -> list[int]:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.size).tolist()

    def take(self, count: int, step: int = 0, group_size: int = 0) -> list[int]:
        out, order = [], self._order()
        while len(out) < count:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            take = min(count - len(out), self.size - self.position)
            out += order[self.position:self.position + take]
            self.position += take
        return out

    def observe(self, step: int, indices: list[int], correct: torch.Tensor) -> None:
        pass

    def record(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


@PROMPT_SELECTORS.register("pass_rate")
class PassRateSelector:
    """Prompts drawn without replacement, the first draw with probability
    ``draw_probabilities(P(group of n not constant), exploration)`` and each next from the
    rest in proportion (numpy's weighted sampling without replacement)."""

    learns = True
    option_fields = ("half_life", "prior_strength", "exploration")  # settable as keyword arguments

    def __init__(self, size: int, options: PromptSelectionOptions = PromptSelectionOptions()) -> None:
        try:
            self.check_size(size, options)
        except ValueError as err:
            raise ValueError(f"prompt_selector: {err}") from None
        self.size, self.options = size, options
        self.posterior = PassRatePosterior(size, options.half_life, options.prior_strength)
        self.rng = np.random.default_rng([options.seed, 0x9A55])
        self.last: dict[str, float] = {}

    @staticmethod
    def check_size(size: int, options: PromptSelectionOptions) -> None:
        """It draws prompts_per_step different prompts a step: the split must hold that many."""
        if size < options.prompts_per_step:
            raise ValueError(f"pass_rate draws prompts_per_step = {options.prompts_per_step} different prompts per "
                             f"step, more than the {size} usable train prompts")

    def probabilities(self, step: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(draw probabilities [N], informativeness [N]) at ``step`` for groups of ``group_size``."""
        alpha, beta = self.posterior.beta(step)
        informativeness = nonconstant_probability(alpha, beta, group_size)
        return draw_probabilities(informativeness, self.options.exploration), informativeness

    def take(self, count: int, step: int, group_size: int) -> list[int]:
        if count > self.size:
            raise ValueError(f"prompt_selector: pass_rate draws {count} different prompts per step from a train "
                             f"split of {self.size}")
        probabilities, informativeness = self.probabilities(step, group_size)
        drawn = self.rng.choice(self.size, size=count, replace=False, p=probabilities.numpy()).tolist()
        self.last = {"selector_informativeness": float(informativeness[drawn].mean()),
                     "selector_pool_informativeness": float(informativeness.mean()),
                     "selector_pool_pass_rate": self.posterior.pool_rate(),
                     "selector_prompts_seen": int(self.posterior.seen.sum())}
        return drawn

    def observe(self, step: int, indices: list[int], correct: torch.Tensor) -> None:
        verified = ~correct.isnan()  # [K, n]
        self.posterior.observe(step, torch.tensor(indices, dtype=torch.long),
                               torch.where(verified, correct, 0.0).sum(1), verified.sum(1))

    def record(self) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict:
        return {"posterior": self.posterior.state_dict(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.posterior.load_state_dict(state["posterior"])
        self.rng.bit_generator.state = state["rng"]


class CheckedSelector:
    """A user's prompt selector held to its contract (:mod:`podsrl.contracts`): ``take`` gives
    ``count`` indices into the train split, ``record`` finite numbers, ``state_dict`` JSON (a
    checkpoint stores it as JSON), and every call can be stopped and fails in one line naming it."""

    def __init__(self, inner, field: str, spec: str, size: int) -> None:
        self.inner, self.field, self.spec, self.size = inner, field, spec, size
        for method in ("take", "observe", "record", "state_dict", "load_state_dict"):
            if not callable(getattr(inner, method, None)):
                raise ValueError(f"{field}: {spec} has no method {method}() (see podsrl.prompt_selection."
                                 f"PromptSelector)")
        learns = getattr(inner, "learns", False)
        if not isinstance(learns, bool):
            raise ValueError(f"{field}: {spec} needs learns, a bool (got {learns!r})")
        self.learns = learns
        self.state_dict()  # not JSON: said now, not at the first checkpoint

    def take(self, count: int, step: int, group_size: int) -> list[int]:
        with calling(self.field, self.spec):
            indices = self.inner.take(count, step, group_size)
        taken = index_list(indices, self.field, f"{self.spec}.take()", count, self.size)
        repeated, times = Counter(taken).most_common(1)[0] if taken else (None, 0)
        if count <= self.size and times > 1:  # distinct prompts exist: a repeat is a defect
            raise broken(self.field, f"{self.spec}.take()", f"prompt index {repeated} {times} times among its "
                                                            f"{count}; a step's prompts are distinct (each is one "
                                                            f"group), as the train split has {self.size}")
        return taken

    def observe(self, step: int, indices: list[int], correct: torch.Tensor) -> None:
        with calling(self.field, self.spec):
            self.inner.observe(step, indices, correct)

    def record(self) -> dict[str, float]:
        with calling(self.field, self.spec):
            numbers = self.inner.record()
        return number_record(numbers, self.field, self.spec, taken=lambda key: False)

    def state_dict(self) -> dict:
        with calling(self.field, self.spec):
            state = self.inner.state_dict()
        try:
            json.dumps(state, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise broken(self.field, f"{self.spec}.state_dict()", f"a state that is not JSON ({error_line(err)}); "
                                                                 f"checkpoints store it as JSON") from None
        return state

    def load_state_dict(self, state: dict) -> None:
        with calling(self.field, self.spec):
            self.inner.load_state_dict(state)


def add_selector_record(numbers: dict[str, float], record: dict) -> None:
    """The prompt selector's ``numbers`` into the step's metrics ``record``, refused where one
    would overwrite a metric the trainer writes itself (``loss``, ``reward_mean``, ...)."""
    record.update(number_record(numbers, "prompt_selector", "the prompt selector's record()",
                                taken=record.__contains__))

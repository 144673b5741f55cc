"""Which sample the slots engine starts next: prompt by prompt, or by predicted length.

Infinite Sampling (Wang et al., arXiv 2506.22950) orders samples by their predicted
completion length so that slots free up evenly. Two levels here: shortest/longest-first
from a prompt-level predictor (:class:`LengthPredictor`), and the paper's two-stage plan
(``length_aware``): after a probe of every sample's first tokens, a token-conditioned
prediction (:class:`PrefixLengthPredictor`), lanes balanced by predicted length
(:func:`plan_lanes`) and shortest-first refill within them (:class:`LaneQueue`). The
predictors are learned online from the run's own completions; the order they give is part
of a run's state (checkpointed), because which random draw goes to which sample depends on it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from podsrl.registry import Registry, bind_kwargs
from podsrl.rollout.lanes import balance_lanes

REFILLS = ("continuous", "group")


class OnlineRidge:
    """Ridge regression refit in closed form from running sums: X^T X (+ ridge I) and X^T y."""

    def __init__(self, dim: int, ridge: float = 1.0) -> None:
        self.xtx = ridge * torch.eye(dim, dtype=torch.float64)  # [F, F]
        self.xty = torch.zeros(dim, dtype=torch.float64)  # [F]
        self.seen = 0

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """[N, F] -> predictions [N] (0 before any observation)."""
        if self.seen == 0:
            return torch.zeros(features.shape[0], dtype=torch.float64)
        return features @ torch.linalg.solve(self.xtx, self.xty)

    def observe(self, features: torch.Tensor, targets: torch.Tensor, counts: torch.Tensor) -> None:
        """features [N, F]; targets [N]: the sum of ``counts`` [N] observations of each row."""
        self.xtx += features.T @ (features * counts[:, None])
        self.xty += features.T @ targets
        self.seen += int(counts.sum())

    def state_dict(self) -> dict:
        return {"xtx": self.xtx.clone(), "xty": self.xty.clone(), "seen": self.seen}

    def check_state(self, state: dict) -> None:
        if (set(state) != {"xtx", "xty", "seen"} or tuple(state["xtx"].shape) != tuple(self.xtx.shape)
                or tuple(state["xty"].shape) != tuple(self.xty.shape)):
            raise ValueError(f"length predictor state does not fit a {type(self).__name__} with "
                             f"{self.xty.shape[0]} features")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.xtx, self.xty, self.seen = state["xtx"].clone(), state["xty"].clone(), int(state["seen"])


def hashed_bag(tokens: list[int], buckets: int) -> torch.Tensor:
    """[buckets]: the share of ``tokens`` falling in each bucket (token id modulo buckets)."""
    bag = torch.zeros(buckets, dtype=torch.float64)
    for token in tokens:
        bag[token % buckets] += 1.0 / len(tokens)
    return bag


class LengthPredictor(OnlineRidge):
    """Predicts a prompt's completion length, learned online from the run's completions.

    A deliberately simple model: ridge regression of the length on features of the
    prompt, its token count and a hashed bag of its tokens, refit in closed form from
    running sums after every generation call. Within a call, the lengths of a prompt's
    samples that have already finished are folded in (their mean, weighted against the
    regression's guess as ``prior_weight`` pseudo-samples): samples of one prompt have
    correlated lengths, which the prompt features alone only partly capture. A sample's
    own first tokens are not used here (:class:`PrefixLengthPredictor` does).
    """

    def __init__(self, buckets: int = 16, ridge: float = 1.0, prior_weight: float = 2.0) -> None:
        super().__init__(buckets + 2, ridge)
        self.buckets, self.prior_weight = buckets, prior_weight

    def features(self, prompt_tokens: list[list[int]]) -> torch.Tensor:
        """P token lists -> [P, F]: bias, length / 64, normalised hashed bag of tokens."""
        rows = torch.zeros(len(prompt_tokens), self.buckets + 2, dtype=torch.float64)
        for i, tokens in enumerate(prompt_tokens):
            rows[i, 0], rows[i, 1] = 1.0, len(tokens) / 64
            rows[i, 2:] = hashed_bag(tokens, self.buckets)
        return rows

    def update(self, features: torch.Tensor, lengths: torch.Tensor) -> None:
        """features [P, F], lengths [P, n] (NaN: a sample early stop skipped): every sample
        is one observation of its prompt."""
        counts = (~lengths.isnan()).sum(dim=1).double()  # [P]
        self.observe(features, lengths.double().nansum(dim=1), counts)

    def blend(self, prior: float, finished_lengths: list[int]) -> float:
        """The prompt's prior guess updated with the lengths of its samples that already ended."""
        total = prior * self.prior_weight + sum(finished_lengths)
        return total / (self.prior_weight + len(finished_lengths))


class PrefixLengthPredictor(OnlineRidge):
    """Token-conditioned length prediction (Infinite Sampling's, arXiv 2506.22950): how many
    tokens a sample still needs, from its prompt and its own first generated tokens.

    Ridge regression, learned online like :class:`LengthPredictor`, on: bias, prompt length
    / 64, the share of the prompt's samples that already ended within the probe (a prompt
    whose samples stop early tends to give short completions), hashed bags of the prompt's
    tokens and of the sample's prefix, and a hashed one-hot of its first token. Samples
    drawn from one prompt differ only in their prefix, which is what lets it order them.
    """

    def __init__(self, prompt_buckets: int = 16, prefix_buckets: int = 32, first_buckets: int = 16,
                 ridge: float = 1.0) -> None:
        super().__init__(3 + prompt_buckets + prefix_buckets + first_buckets, ridge)
        self.buckets = (prompt_buckets, prefix_buckets, first_buckets)

    def features(self, prompt_tokens: list[int], prefixes: list[list[int]],
                 ended_share: list[float]) -> torch.Tensor:
        """One prompt's N sample prefixes (and, per sample, its prompt's ended share) -> [N, F]."""
        prompt_buckets, prefix_buckets, first_buckets = self.buckets
        rows = torch.zeros(len(prefixes), self.xty.shape[0], dtype=torch.float64)
        prompt_bag = hashed_bag(prompt_tokens, prompt_buckets)
        for i, (prefix, share) in enumerate(zip(prefixes, ended_share)):
            rows[i, :3] = torch.tensor([1.0, len(prompt_tokens) / 64, share], dtype=torch.float64)
            rows[i, 3:3 + prompt_buckets] = prompt_bag
            rows[i, 3 + prompt_buckets:3 + prompt_buckets + prefix_buckets] = hashed_bag(
                prefix, prefix_buckets)
            rows[i, 3 + prompt_buckets + prefix_buckets + prefix[0] % first_buckets] = 1.0
        return rows

    def update(self, features: torch.Tensor, remaining: torch.Tensor) -> None:
        """features [N, F], remaining [N] tokens each sample needed after its prefix (NaN: skipped)."""
        seen = ~remaining.isnan()
        self.observe(features[seen], remaining.double()[seen],
                     torch.ones(int(seen.sum()), dtype=torch.float64))

    def learn(self, features: torch.Tensor, predicted: list[float], remaining: torch.Tensor) -> float:
        """:meth:`update`, returning the mean absolute error of ``predicted`` [N] (0 if N = 0)."""
        self.update(features, remaining)
        error = (remaining - torch.tensor(predicted, dtype=torch.float64)).abs()
        return float(error.nanmean()) if len(predicted) and not error.isnan().all() else 0.0


class PendingSamples:
    """The samples not started yet; which one starts next is the schedule's choice
    (:class:`Schedule`, or its name in ``SCHEDULES``)."""

    def __init__(self, num_prompts: int, num_samples: int, schedule: "Schedule | str", predicted: list[float],
                 predictor: LengthPredictor | None) -> None:
        self.remaining = [deque(range(num_samples)) for _ in range(num_prompts)]
        self.schedule = SCHEDULES.resolve(schedule) if isinstance(schedule, (str, dict)) else schedule
        self.predicted, self.predictor = predicted, predictor
        self.finished_lengths: list[list[int]] = [[] for _ in range(num_prompts)]
        self.left = num_prompts * num_samples
        self.next_prompt = 0  # round_robin: where the turn is
        self.first: deque[tuple[int, int]] = deque()  # samples resumed from an earlier step: before any other

    def __len__(self) -> int:
        return self.left

    def carry_in(self, prompt: int, done: list[int], resumed: list[int]) -> None:
        """Partial rollouts: of the prompt's samples, ``done`` (finished or skipped in an
        earlier step) never start, ``resumed`` (cut off there) start before any other."""
        out = set(done) | set(resumed)
        self.remaining[prompt] = deque(s for s in self.remaining[prompt] if s not in out)
        self.first.extend((prompt, s) for s in resumed)
        self.left -= len(done)

    def cancel(self, prompt: int) -> list[int]:
        """Drop the prompt's samples that have not started; returns them."""
        dropped = list(self.remaining[prompt])
        self.remaining[prompt].clear()
        self.left -= len(dropped)
        return dropped

    def drop(self, prompt: int, sample: int) -> bool:
        """Drop one sample if it has not started; whether it was dropped."""
        if sample not in self.remaining[prompt]:
            return False
        self.remaining[prompt].remove(sample)
        self.left -= 1
        return True

    def record(self, prompt: int, sample: int, length: int) -> None:
        self.finished_lengths[prompt].append(length)

    def guess(self, prompt: int) -> float:
        """The prompt's predicted completion length, corrected by its finished samples."""
        return self.predictor.blend(self.predicted[prompt], self.finished_lengths[prompt])

    def pop(self) -> tuple[int, int]:
        self.left -= 1
        if self.first:
            return self.first.popleft()
        prompt = self.schedule(self, [p for p, queue in enumerate(self.remaining) if queue])
        return prompt, self.remaining[prompt].popleft()


@dataclass(frozen=True)
class Schedule:
    """How the slots engine orders pending samples: ``pick`` chooses the prompt whose next
    sample starts; the rest says what the schedule needs. Registered in ``SCHEDULES`` (the
    config's ``generation_schedule``), or named there as ``module:Schedule object``."""

    pick: Callable[[PendingSamples, list[int]], int]
    # the length predictor it learns across steps (checkpointed with the engine)
    predictor: type | None = None
    # the two-stage plan: probe every sample, predict, balance lanes (continuous refill)
    plans_lanes: bool = False
    # why cancelling a group's unstarted samples (early stop's stop_groups watcher) is wrong with it ('' = it
    # is not)
    stop_groups_refusal: str = ""

    def __call__(self, pending: PendingSamples, candidates: list[int]) -> int:
        return self.pick(pending, candidates)

    def new_predictor(self) -> "LengthPredictor | PrefixLengthPredictor | None":
        return self.predictor() if self.predictor is not None else None


def bind_pick(schedule: Schedule, kwargs: dict, name: str) -> Schedule:
    """A schedule's keyword arguments (``generation_schedule: {name: ..., argument: value}``)
    go to its ``pick(pending, candidates, ...)``."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"generation_schedule: {name} is not a Schedule; arguments go to a Schedule's pick")
    pick = bind_kwargs(schedule.pick, kwargs, "generation_schedule", name, "pick(pending, candidates)", 2)
    return dataclasses.replace(schedule, pick=pick)


SCHEDULES = Registry("schedule", "generation_schedule", binds=bind_pick)


def schedule(name: str, **declared) -> Callable:
    """Decorator: register ``Schedule(pick, **declared)`` in ``SCHEDULES`` as ``name``; the pick
    function itself is returned unchanged (one pick may serve several schedules)."""
    def add(pick: Callable[[PendingSamples, list[int]], int]) -> Callable:
        SCHEDULES.register(name)(Schedule(pick, **declared))
        return pick
    return add


# --- schedules: which prompt's next sample starts, among those with samples left ---------------------
@schedule("fifo", stop_groups_refusal="generation_schedule fifo starts a prompt's samples together, leaving "
                                     "nothing to cancel; use round_robin")
def prompt_by_prompt(pending: PendingSamples, candidates: list[int]) -> int:
    return candidates[0]


# Infinite Sampling's plan: the probe starts one sample of each prompt in turn
@schedule("length_aware", predictor=PrefixLengthPredictor, plans_lanes=True,
          stop_groups_refusal="with generation_schedule length_aware the parked samples resume "
                              "shortest-predicted first, so early stop cancels the predicted-long ones: kept "
                              "completions were 19% shorter than plain PODS's on SmolLM2 chat "
                              "(benchmarks/RESULTS.md); use round_robin")
# a LengthPredictor is learned even where the order does not use it: its state is part of the engine's
@schedule("round_robin", predictor=LengthPredictor)
def one_sample_of_each_in_turn(pending: PendingSamples, candidates: list[int]) -> int:
    """Every group's first samples finish early: what lets early stop cancel the rest of a
    saturated group."""
    prompt = next((p for p in candidates if p >= pending.next_prompt), candidates[0])
    pending.next_prompt = prompt + 1
    return prompt


@schedule("shortest_first", predictor=LengthPredictor)
def shortest_predicted(pending: PendingSamples, candidates: list[int]) -> int:
    return min(candidates, key=lambda p: (pending.guess(p), p))


@schedule("longest_first", predictor=LengthPredictor)
def longest_predicted(pending: PendingSamples, candidates: list[int]) -> int:
    return max(candidates, key=lambda p: (pending.guess(p), p))


class LaneQueue:
    """Stage two of the length-aware plan: each slot works through its lane (the samples
    :func:`podsrl.rollout.lanes.balance_lanes` gave it) shortest-predicted-first (SJF);
    a slot whose lane is empty takes the shortest sample of the lane with the most predicted
    work left, so a wrong prediction costs balance, not idle slots.

    The slot that asks is identified by the sample that last ended in it: the decoder
    refills exactly the rows freed by the samples it reports through :meth:`record`.
    """

    def __init__(self, samples: list[tuple[int, int]], predicted: list[float], assignment: list[int],
                 lanes: int) -> None:
        self.predicted = dict(zip(samples, predicted))
        self.lane_of = dict(zip(samples, assignment))
        self.lanes: list[list[tuple[int, int]]] = [[] for _ in range(lanes)]
        for sample, lane in sorted(zip(samples, assignment), key=lambda x: (-self.predicted[x[0]], x[0])):
            self.lanes[lane].append(sample)  # longest first: the next to start is at the end
        self.freed: deque[int] = deque(range(lanes))  # every lane's slot starts empty

    def __len__(self) -> int:
        return sum(len(lane) for lane in self.lanes)

    def cancel(self, prompt: int) -> list[int]:
        dropped = [s for lane in self.lanes for p, s in lane if p == prompt]
        self.lanes = [[(p, s) for p, s in lane if p != prompt] for lane in self.lanes]
        return dropped

    def record(self, prompt: int, sample: int, length: int) -> None:
        if (prompt, sample) in self.lane_of:
            self.freed.append(self.lane_of[(prompt, sample)])

    def pop(self) -> tuple[int, int]:
        lane = self.freed.popleft() if self.freed else None
        if lane is None or not self.lanes[lane]:  # steal from the lane with the most work left
            work = [sum(self.predicted[s] for s in queue) for queue in self.lanes]
            donor = max((i for i, queue in enumerate(self.lanes) if queue), key=lambda i: (work[i], -i))
            sample = self.lanes[donor].pop()
            self.lane_of[sample] = lane if lane is not None else donor
            return sample
        return self.lanes[lane].pop()


def check_options(refill: str, schedule: Schedule, probe_tokens: int) -> None:
    if refill not in REFILLS:
        raise ValueError(f"generation_refill: unknown {refill!r}; use one of {', '.join(REFILLS)}")
    if schedule.plans_lanes and (refill != "continuous" or probe_tokens < 2):
        raise ValueError("generation_schedule length_aware needs generation_refill continuous and "
                         f"generation_probe_tokens >= 2 (got generation_refill {refill}, "
                         f"generation_probe_tokens {probe_tokens})")


def predictor_for(schedule: Schedule, predictor: LengthPredictor | PrefixLengthPredictor | None):
    """The length predictor a schedule uses: the one given (checked), or a new one."""
    if schedule.predictor is None:
        return predictor
    predictor = predictor or schedule.new_predictor()
    if not isinstance(predictor, schedule.predictor):
        raise ValueError(f"generation_schedule: this schedule needs a {schedule.predictor.__name__}")
    return predictor


def predict_remaining(predictor: PrefixLengthPredictor, prompt_tokens: list[list[int]],
                      completions: list[list[list[int]]], paused: list[tuple[int, int]],
                      max_remaining: int) -> tuple[torch.Tensor, list[float]]:
    """After the probe: the paused samples' features [N, F] (to learn from once their lengths
    are known) and predicted remaining lengths [N], in the order of ``paused``. A prompt's
    samples that are neither paused nor empty ended within the probe."""
    features = torch.zeros(len(paused), predictor.xty.shape[0], dtype=torch.float64)
    for prompt, tokens in enumerate(prompt_tokens):
        rows = [i for i, (p, _) in enumerate(paused) if p == prompt]
        if rows:
            ended = sum(1 for c in completions[prompt] if c) - len(rows)
            share = ended / (ended + len(rows))
            features[rows] = predictor.features(tokens, [completions[prompt][paused[i][1]] for i in rows],
                                                [share] * len(rows))
    return features, predictor.predict(features).clamp(0, max_remaining).tolist()


def plan_lanes(paused: list[tuple[int, int]], predicted: list[float], slots: int) -> LaneQueue:
    """Stage one: the paused samples balanced into ``slots`` lanes by predicted remaining length."""
    lanes = max(1, min(slots, len(paused)))
    return LaneQueue(paused, predicted, balance_lanes(predicted, lanes), lanes)

"""Which sample the slots engine starts next: prompt by prompt, or by predicted length.

Infinite Sampling (Wang et al., arXiv 2506.22950) orders samples by their predicted
completion length so that slots free up evenly. The predictor here is learned online from
the run's own completions; the order it gives is part of a run's state (checkpointed),
because which random draw goes to which sample depends on it.
"""

from __future__ import annotations

from collections import deque

import torch

REFILLS = ("continuous", "group")
SCHEDULES = ("fifo", "round_robin", "shortest_first", "longest_first")


class LengthPredictor:
    """Predicts a prompt's completion length, learned online from the run's completions.

    A deliberately simple model: ridge regression of the length on features of the
    prompt, its token count and a hashed bag of its tokens, refit in closed form from
    running sums after every generation call. Within a call, the lengths of a prompt's
    samples that have already finished are folded in (their mean, weighted against the
    regression's guess as ``prior_weight`` pseudo-samples): samples of one prompt have
    correlated lengths, which the prompt features alone only partly capture. A sample's
    own first tokens are not used: without preemption its slot could not change anyway.
    """

    def __init__(self, buckets: int = 16, ridge: float = 1.0, prior_weight: float = 2.0) -> None:
        self.buckets, self.prior_weight = buckets, prior_weight
        dim = buckets + 2
        self.xtx = ridge * torch.eye(dim, dtype=torch.float64)  # [F, F]
        self.xty = torch.zeros(dim, dtype=torch.float64)  # [F]
        self.seen = 0

    def features(self, prompt_tokens: list[list[int]]) -> torch.Tensor:
        """P token lists -> [P, F]: bias, length / 64, normalised hashed bag of tokens."""
        rows = torch.zeros(len(prompt_tokens), self.buckets + 2, dtype=torch.float64)
        for i, tokens in enumerate(prompt_tokens):
            rows[i, 0], rows[i, 1] = 1.0, len(tokens) / 64
            for token in tokens:
                rows[i, 2 + token % self.buckets] += 1.0 / max(1, len(tokens))
        return rows

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """[P, F] -> predicted lengths [P] (0 before any completion has been seen)."""
        if self.seen == 0:
            return torch.zeros(features.shape[0], dtype=torch.float64)
        return features @ torch.linalg.solve(self.xtx, self.xty)

    def update(self, features: torch.Tensor, lengths: torch.Tensor) -> None:
        """features [P, F], lengths [P, n] (NaN: a sample early stop skipped): every sample
        is one observation of its prompt."""
        observed = ~lengths.isnan()  # [P, n]
        counts = observed.sum(dim=1).double()  # [P]
        self.xtx += features.T @ (features * counts[:, None])
        self.xty += features.T @ lengths.double().nansum(dim=1)
        self.seen += int(observed.sum())

    def state_dict(self) -> dict:
        return {"xtx": self.xtx.clone(), "xty": self.xty.clone(), "seen": self.seen}

    def check_state(self, state: dict) -> None:
        if (set(state) != {"xtx", "xty", "seen"} or tuple(state["xtx"].shape) != tuple(self.xtx.shape)
                or tuple(state["xty"].shape) != tuple(self.xty.shape)):
            raise ValueError(f"length predictor state does not fit a predictor with {self.buckets} buckets")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.xtx, self.xty, self.seen = state["xtx"].clone(), state["xty"].clone(), int(state["seen"])

    def blend(self, prior: float, finished_lengths: list[int]) -> float:
        """The prompt's prior guess updated with the lengths of its samples that already ended."""
        total = prior * self.prior_weight + sum(finished_lengths)
        return total / (self.prior_weight + len(finished_lengths))


class PendingSamples:
    """Which sample starts next: prompt by prompt (fifo), one sample of each prompt in turn
    (round_robin: every group's first samples finish early, which is what lets early stop
    cancel the rest of a saturated group), or by predicted length."""

    def __init__(self, num_prompts: int, num_samples: int, schedule: str, predicted: list[float],
                 predictor: LengthPredictor | None) -> None:
        self.remaining = [deque(range(num_samples)) for _ in range(num_prompts)]
        self.schedule, self.predicted, self.predictor = schedule, predicted, predictor
        self.finished_lengths: list[list[int]] = [[] for _ in range(num_prompts)]
        self.left = num_prompts * num_samples
        self.next_prompt = 0  # round_robin: where the turn is

    def __len__(self) -> int:
        return self.left

    def cancel(self, prompt: int) -> list[int]:
        """Drop the prompt's samples that have not started; returns them."""
        dropped = list(self.remaining[prompt])
        self.remaining[prompt].clear()
        self.left -= len(dropped)
        return dropped

    def record(self, prompt: int, length: int) -> None:
        self.finished_lengths[prompt].append(length)

    def pop(self) -> tuple[int, int]:
        candidates = [p for p, queue in enumerate(self.remaining) if queue]
        if self.schedule == "fifo":
            prompt = candidates[0]
        elif self.schedule == "round_robin":
            prompt = next((p for p in candidates if p >= self.next_prompt), candidates[0])
            self.next_prompt = prompt + 1
        else:
            guess = {p: self.predictor.blend(self.predicted[p], self.finished_lengths[p]) for p in candidates}
            pick = min if self.schedule == "shortest_first" else max
            prompt = pick(candidates, key=lambda p: (guess[p], p))
        self.left -= 1
        return prompt, self.remaining[prompt].popleft()

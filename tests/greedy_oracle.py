"""Greedy outputs of two implementations (an engine and transformers), compared the way they
can be compared on every CPU kind.

Two correct implementations of one model round differently (vLLM's CPU kernels and
transformers', oneDNN's AVX2, AVX-512 BF16 and AMX paths), so where the model's two best next
tokens are nearly tied they may pick different ones, and from there their greedy outputs part.
#57 saw it: vLLM and transformers agreed on SmolLM2's answer up to its end of turn, then broke
a near tie differently. So the oracle reads each row up to and including its first EOS (what
a completion is), and where two rows differ it asks the reference model at the first
differing token: both tokens must be within ``tie_nats`` of each other in its log-probs. A
broken engine (stale or wrong weights, a lost LoRA) picks tokens the reference ranks far
below its best, and fails (tests/test_greedy_oracle.py shows it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def through_first_eos(row: list[int], eos: int) -> list[int]:
    return row[:row.index(eos) + 1] if eos in row else row


@dataclass
class Divergence:
    row: int
    position: int  # the first completion token where the two differ
    reference_token: int
    other_token: int
    gap_nats: float  # reference log-prob of its own token minus that of the other's

    def __str__(self) -> str:
        return (f"row {self.row}, token {self.position}: {self.reference_token} vs {self.other_token}, "
                f"{self.gap_nats:.4f} nats apart in the reference's log-probs")


@torch.no_grad()
def divergences(model, prompt_ids: list[list[int]], other: list[list[int]], reference: list[list[int]],
                eos: int) -> list[Divergence]:
    """Where ``other``'s greedy rows part from ``reference``'s (each read through its first EOS),
    with the reference model's log-prob gap between the two tokens there. ``prompt_ids``: each
    row's prompt tokens (unpadded)."""
    found = []
    was_training = model.training
    model.eval()
    for index, (prompt, theirs, ours) in enumerate(zip(prompt_ids, other, reference)):
        theirs, ours = through_first_eos(theirs, eos), through_first_eos(ours, eos)
        if theirs == ours:
            continue
        position = next((k for k, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
        if position >= min(len(theirs), len(ours)):  # one row stopped at the length limit, the other did not
            found.append(Divergence(index, position, -1, -1, float("inf")))
            continue
        ids = torch.tensor([prompt + ours[:position]], device=model.device)
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)  # [V]
        found.append(Divergence(index, position, ours[position], theirs[position],
                                (logp[ours[position]] - logp[theirs[position]]).item()))
    model.train(was_training)
    return found


def assert_greedy_agrees(model, prompt_ids: list[list[int]], other: list[list[int]], reference: list[list[int]],
                         eos: int, tie_nats: float, min_equal: float = 0.5) -> None:
    """Every row equal through its first EOS, or parted only at a near tie (``tie_nats``); and at
    least ``min_equal`` of the rows equal, so a test cannot pass on ties alone."""
    assert len(other) == len(reference) == len(prompt_ids)
    parted = divergences(model, prompt_ids, other, reference, eos)
    not_ties = [d for d in parted if abs(d.gap_nats) > tie_nats]
    assert not not_ties, "greedy outputs differ beyond a near tie: " + "; ".join(map(str, not_ties))
    equal = 1 - len(parted) / len(reference)
    assert equal >= min_equal, (f"only {equal:.0%} of the rows are equal (near ties: "
                                + "; ".join(map(str, parted)) + ")")

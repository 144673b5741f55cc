"""Task records shared by every task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Example:
    """One problem: the prompt text given to the model and its verifiable gold answer.

    ``columns`` carries any further dataset fields; they reach reward functions as
    keyword arguments, as in TRL.
    """

    prompt: str
    answer: str
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """A named task: a train split to sample prompts from, a disjoint held-out split, and
    its two verifiable reward functions (TRL signature, see ``podsrl.rewards``):
    ``correct_fn`` (1.0 when the final answer is right; also the accuracy metric) and
    ``format_fn`` (1.0 when the completion follows the requested format)."""

    name: str
    train: list[Example]
    test: list[Example]
    correct_fn: Callable[..., list]
    format_fn: Callable[..., list]

"""Runs averaged as seeds of one arm (``podsrl plot`` / ``compare``) should differ in the seed
alone: a check that says when they do not."""

from __future__ import annotations

import sys

from podsrl.trainer.config import BOOKKEEPING_FIELDS

# Fields that may differ between the seeds of one arm: the seed itself, where and how the run
# was written, the evaluation batch size, and max_steps (compare sets a time budget instead).
SEED_FIELDS = BOOKKEEPING_FIELDS | {"seed", "eval_batch_size", "max_steps"}


def warn_unlike_seeds(arm: str, runs: list) -> None:
    """Runs averaged as seeds of one arm should differ only in the seed: warn, naming the
    fields and runs, when they differ in anything that changes the result."""
    first = runs[0]
    for run in runs[1:]:
        fields = sorted(k for k in set(first.config) | set(run.config)
                        if k not in SEED_FIELDS and first.config.get(k) != run.config.get(k))
        if fields:
            shown = ", ".join(f"{k} ({first.config.get(k)!r} vs {run.config.get(k)!r})" for k in fields[:5])
            print(f"warning: arm {arm!r} averages {first.path} and {run.path} as seeds, but they differ in "
                  f"{shown}{' and more' if len(fields) > 5 else ''}", file=sys.stderr)

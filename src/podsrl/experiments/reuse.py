"""Which runs a re-run of ``podsrl compare`` may reuse (#57): only a run whose config is what this
command would run. A finished run is reused as it is and an interrupted one resumed from its
checkpoint, so a run of another command (another learning rate, a larger --budget_steps) would
otherwise be reported as this command's, in silence. Checked for every run before the first
one starts; a run that stopped before its first checkpoint has nothing to reuse (compare starts
it afresh) and is not checked.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from podsrl.trainer.checkpoints import list_checkpoints
from podsrl.trainer.config import Config

# What a reused run may differ in from this command's config: where it was written (output_dir:
# the same folder reached by another path, or a comparison folder moved as a whole), whether compare
# resumes it (resume: compare sets it from the checkpoints it finds) and the progress bar (always
# off in a comparison). Nothing else: any other field may change what a run trains or how long its
# steps take, and compare compares training time (even device, trackers or checkpointing).
REUSE_FREE_FIELDS = frozenset({"output_dir", "resume", "progress"})
NO_STEP_LIMIT = 10**9  # max_steps of a comparison with a time budget only (no --budget_steps)
# the compare options behind the fields a budget sets, for the refusal
BUDGET_OPTIONS = {"max_steps": "--budget_steps", "max_minutes": "--budget_minutes"}


def recorded_config(run_dir: Path) -> dict:
    """A run's config.json as this podsrl reads it: a field the run's podsrl did not have yet at
    its default (it had the default's meaning then)."""
    path = run_dir / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise ValueError(f"output_dir: {path} is unreadable ({type(err).__name__}: {err}); compare reuses a "
                         "run only when its config is this command's: choose another --output_dir") from None
    if not isinstance(saved, dict):
        raise ValueError(f"output_dir: {path} is not a podsrl run's config; choose another --output_dir")
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    return {**defaults, **saved}


def first_difference(recorded: dict, planned: dict) -> tuple[str, object, object] | None:
    """The first field (in the config's order, then the run's other keys) whose value differs,
    with the run's value and this command's; None when the run is this command's."""
    names = ([f.name for f in dataclasses.fields(Config)]
             + sorted(set(recorded) - {f.name for f in dataclasses.fields(Config)}))
    for name in names:
        if name not in REUSE_FREE_FIELDS and recorded.get(name) != planned.get(name):
            return name, recorded.get(name), planned.get(name)
    return None


def _shown(name: str, value: object) -> str:
    if name == "max_steps" and value == NO_STEP_LIMIT:
        return "no step limit"
    return "absent" if value is None else repr(value)


def holds_a_run(run_dir: Path) -> bool:
    """A run compare would reuse (finished: summary.json) or resume (a checkpoint): not a new run,
    nor one that stopped before its first checkpoint (compare starts it afresh)."""
    return (run_dir / "summary.json").exists() or bool(list_checkpoints(run_dir / "checkpoints"))


def check_reusable(cfg: Config) -> None:
    """Refuse, in one line naming the run's folder and the first field that differs (both values),
    to reuse or resume a run in ``cfg.output_dir`` that this command would not have run."""
    run_dir = Path(cfg.output_dir)
    if not holds_a_run(run_dir):
        return
    planned = json.loads(json.dumps(cfg.to_dict()))  # as config.json holds it (tuples as lists)
    difference = first_difference(recorded_config(run_dir), planned)
    if difference is None:
        return
    name, there, now = difference
    option = f" ({BUDGET_OPTIONS[name]})" if name in BUDGET_OPTIONS else ""
    state = "finished" if (run_dir / "summary.json").exists() else "interrupted"
    raise ValueError(f"output_dir: {run_dir} holds a {state} run of another command: {name}{option} is "
                     f"{_shown(name, there)} there, {_shown(name, now)} in this one; compare reuses only "
                     "runs of the same config: give this comparison another --output_dir (or re-run the "
                     "earlier command there)")

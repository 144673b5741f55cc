"""Runs of one model compared only when they share its end of turn (#57).

podsrl converts the offline SmolLM2-135M-Instruct from a GGUF file; under transformers 5.17 (the
vLLM environment's and the lent GPUs'; 5.23 reads the GGUF right) the conversion's tokenizer
ended completions on ``<|im_start|>`` (id 1), so chat completions ran past the end of the turn
(longer, slower steps, other rewards), where the fixed conversion ends on ``<|im_end|>`` (id 2).
A comparison holding runs of both would report the tokenizer's effect as the method's, so
``podsrl compare`` and ``plot`` refuse it (docs/reproducing.md says why not a warning), naming the
runs on each side.

A run records its tokenizer's EOS in each entry of environment.json (podsrl since #57; a resume may
load another conversion than the start, so a run can hold two). A SmolLM2 run without the record
predates it and is counted as the old conversion: podsrl converted SmolLM2 only the old way then.
Runs of other models without the record are not checked (no conversion of theirs is known to differ).
"""

from __future__ import annotations

import json
from pathlib import Path

from podsrl.provenance import read_environment

SMOLLM2 = "SmolLM2"  # the family: the built-in name, the hub id and folders of models trained from it
OLD_SMOLLM2_EOS = 1  # <|im_start|>: the end of turn of podsrl's SmolLM2 conversion under transformers 5.17
SHOWN_RUNS = 3  # runs named per side of a refusal


def model_family(config: dict) -> str:
    """The model a run's EOS must agree within: SmolLM2 for any model named after it (the built-in
    smollm2-135m-instruct, HuggingFaceTB/SmolLM2-135M-Instruct, a folder like runs/smollm2-format
    trained from it), else the run's model as named."""
    name = str(config.get("model", ""))
    return SMOLLM2 if "smollm2" in name.lower() else name


def end_tokens(config: dict, environment: list[dict]) -> set:
    """The EOS ids a run generated with: those its starts recorded; for a SmolLM2 run that recorded
    none, the old conversion's; else none known (empty)."""
    recorded = {entry["eos_token_id"] for entry in environment if "eos_token_id" in entry}
    if recorded:
        return recorded
    return {OLD_SMOLLM2_EOS} if model_family(config) == SMOLLM2 else set()


def _label(family: str, eos) -> str:
    if family == SMOLLM2 and eos == OLD_SMOLLM2_EOS:
        return (f"EOS id {eos} (<|im_start|>: podsrl's old SmolLM2 conversion, completions ran past the end "
                "of the turn; a SmolLM2 run that recorded no EOS, before #57, counts as it)")
    return f"EOS id {eos}"


def check_one_conversion(runs: list[tuple[Path, dict, list[dict]]]) -> None:
    """Refuse runs (path, config, environment entries) of one model family that generated with
    different EOS tokens, in one line naming the runs of each (a run resumed across conversions is
    on both sides)."""
    sides: dict[str, dict] = {}
    for path, config, environment in runs:
        for eos in end_tokens(config, environment):
            sides.setdefault(model_family(config), {}).setdefault(eos, []).append(str(path))
    for family, by_eos in sides.items():
        if len(by_eos) < 2:
            continue
        shown = "; ".join(f"{_label(family, eos)} in {', '.join(paths[:SHOWN_RUNS])}"
                          + (f" and {len(paths) - SHOWN_RUNS} more" if len(paths) > SHOWN_RUNS else "")
                          for eos, paths in sorted(by_eos.items(), key=lambda item: str(item[0])))
        raise ValueError(f"runs of {family} that end completions on different tokens cannot be compared: "
                         f"{shown}; compare runs of one conversion: re-run the others with this podsrl in "
                         "another --output_dir, or plot each group on its own (docs/reproducing.md)")


def folder_record(run_dir: Path) -> tuple[Path, dict, list[dict]]:
    """What :func:`check_one_conversion` reads of a run folder (its config and environment)."""
    return run_dir, json.loads((run_dir / "config.json").read_text()), read_environment(run_dir)

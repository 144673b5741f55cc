"""One evaluation's noise, as a comparison reports it (#51): the standard error of an arm's
held-out accuracy at one evaluation, with prompts as clusters, and how many prompts would
bring it to the goal."""

from __future__ import annotations

import math
import statistics

from podsrl.experiments.runs import FinishedRun

# One evaluation's standard error worth comparing at: the differences between arms measured
# so far were 2-3 points (#51), and at 2.4 points one evaluation could set a ratio.
EVAL_SE_GOAL = 0.012


def evaluation_noise(runs: list[FinishedRun]) -> dict:
    """One evaluation's standard error over prompts (samples of a prompt are correlated:
    :func:`podsrl.trainer.evaluate.clustered_standard_error`), median and largest over the
    arm's evaluations, and the held-out prompts per evaluation; None where no run logged it."""
    errors = [e for run in runs for e in run.eval_errors if isinstance(e, (int, float)) and not math.isnan(e)]
    return {"eval_se_median": statistics.median(errors) if errors else None,
            "eval_se_max": max(errors) if errors else None,
            "eval_prompts": max((r.config.get("eval_prompts") or 0) for r in runs) or None,
            "eval_samples": max((r.config.get("eval_samples") or 0) for r in runs) or None,
            "eval_se_logged": any(r.eval_se_logged for r in runs)}


# why an arm's runs logged eval_accuracy_se but no value (null): the only case where it is not measured
NOT_MEASURABLE = ("logged as null: a standard error over prompts needs at least two held-out prompts per "
                  "evaluation, and these runs evaluated fewer")


def noise_lines(rows: list[dict]) -> list[str]:
    """What one evaluation's noise is, per arm, and how many prompts would bring its largest
    standard error to EVAL_SE_GOAL (the error shrinks as one over sqrt(prompts))."""
    measured = [r for r in rows if r.get("eval_se_max") is not None]
    if not any(r.get("eval_se_logged") for r in rows):
        return ["", "One evaluation's standard error: not logged by these runs (podsrl before #51)."]
    if not measured:
        return ["", f"One evaluation's standard error: not measured, {NOT_MEASURABLE}."]
    lines = ["", "One evaluation's standard error, prompts as clusters (goal: at most "
                 f"{100 * EVAL_SE_GOAL:.1f} points):"]
    for r in rows:
        if r.get("eval_se_max") is None:
            why = (NOT_MEASURABLE if r.get("eval_se_logged")
                   else "not logged by these runs (podsrl before #51)")
            lines.append(f"- {r['arm']}: not measured, {why}")
            continue
        enough = (math.ceil(r["eval_prompts"] * (r["eval_se_max"] / EVAL_SE_GOAL) ** 2) if r["eval_prompts"]
                  else None)
        verdict = ("within the goal" if r["eval_se_max"] <= EVAL_SE_GOAL
                   else f"above the goal: about {enough} prompts would meet it" if enough
                   else "above the goal")
        lines.append(f"- {r['arm']}: median {100 * r['eval_se_median']:.2f}, largest "
                     f"{100 * r['eval_se_max']:.2f} points ({r['eval_prompts']} prompts x "
                     f"{r['eval_samples']} samples); {verdict}")
    return lines

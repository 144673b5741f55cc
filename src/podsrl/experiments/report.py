"""A comparison's report: compare.md (the table, provenance, headline and noise sections),
compare.json, accuracy.png (mean and 95% band per arm) and step_time.png, from
:func:`podsrl.experiments.compare.analyze`'s result."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from podsrl.experiments.levels import headline_lines
from podsrl.experiments.noise import noise_lines
from podsrl.experiments.plots import save_accuracy_figure
from podsrl.experiments.report_files import check_report_folder, write_reports

BUDGET_FRACTIONS = (0.25, 0.5, 1.0)  # accuracy reported at these fractions of the common budget


def write_report(result: dict, output_dir: Path, title: str = "") -> dict[str, Path]:
    """compare.json, compare.md, accuracy.png (mean and 95% band per arm), step_time.png: each
    made in memory, then written over only what podsrl can prove it wrote there
    (:mod:`podsrl.experiments.report_files`; refused otherwise, nothing changed)."""
    output_dir = Path(output_dir)
    check_report_folder(output_dir)  # before the figures are drawn: a refusal costs nothing
    write_reports(output_dir, {"accuracy.png": _accuracy_figure(result, title),
                               "step_time.png": _step_time_figure(result["rows"]),
                               "compare.md": (format_table(result) + "\n").encode(),
                               "compare.json": _summary_json(result).encode()})
    return {"accuracy": output_dir / "accuracy.png", "step_time": output_dir / "step_time.png",
            "table": output_dir / "compare.md"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _accuracy_figure(result: dict, title: str) -> bytes:
    """accuracy.png: each arm's mean curve, its 95% band (with several seeds) and the target."""
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    for arm in result["arms"].values():  # name -> compare.Arm
        minutes = [t / 60 for t in arm.grid]
        seeds = f"{len(arm.runs)} seed" + ("s" if len(arm.runs) > 1 else "")
        line, = ax.plot(minutes, [100 * a for a in arm.mean], label=f"{arm.name} ({seeds})")
        if len(arm.runs) > 1:
            lower, upper = arm.band()
            ax.fill_between(minutes, [100 * a for a in lower], [100 * a for a in upper], alpha=0.2,
                            color=line.get_color())
    ax.axhline(100 * result["target_accuracy"], color="gray", linestyle=":", linewidth=1,
               label=f"target: 99% of {result['baseline']} best")
    png = io.BytesIO()
    save_accuracy_figure(fig, ax, png, title or "accuracy vs training time (mean, 95% CI)")
    return png.getvalue()


def _step_time_figure(rows: list[dict]) -> bytes:
    """step_time.png: measured seconds per step per arm, inference beside update."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.5 * len(rows)))
    names = [r["arm"] for r in rows]
    inference = [r["inference_seconds_per_step"] for r in rows]
    update = [r["update_seconds_per_step"] for r in rows]
    ax.barh(names, inference, label="inference (generate + reward)")
    ax.barh(names, update, left=inference, label="update (logprobs + backward + step)")
    ax.set_xlabel("seconds per step (measured)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    return png.getvalue()


def strict(value):
    """``value`` with every float that JSON cannot hold (NaN, +-inf) as None: compare.json is strict
    JSON (a bare NaN token breaks most parsers); compare.md says what each missing number means."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def _summary_json(result: dict) -> str:
    summary = {"baseline": result["baseline"], "target_accuracy": result["target_accuracy"],
               "budget_seconds": result["budget_seconds"], "rows": result["rows"],
               "provenance": result["provenance"],
               "runs": {name: [str(r.path) for r in arm.runs] for name, arm in result["arms"].items()}}
    return json.dumps(strict(summary), indent=2, allow_nan=False, default=lambda x: None) + "\n"


def _fmt(value, pattern="{:.1f}", missing="n/a") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    # a ratio over a time of 0: the arm started at the target
    if isinstance(value, float) and math.isinf(value):
        return "unbounded"
    return pattern.format(value)


def _budget_line(result: dict) -> str:
    """The common budget, or, when a run was evaluated only at its start (its curve ends at 0 s),
    that run: every accuracy 'at the budget' below is then the initial model's."""
    if result["budget_seconds"] > 0:
        return f"common budget: {result['budget_seconds']:.0f} s of training"
    return (f"no common budget: {result.get('budget_set_by', 'a run')} has no evaluation after its start, so "
            "the runs share no training time (accuracy 'at the budget' is the initial model's); plot the "
            "runs without it")


def _provenance_lines(prov: dict) -> list[str]:
    if not prov:
        return ["runs: no environment.json (written by podsrl before this report existed): commit, dates and "
                "machine unknown"]
    short = {arm: f"{chr(65 + i)}" for i, arm in enumerate(dict.fromkeys(prov["order"]))}
    order = " ".join(short[a] for a in prov["order"])
    legend = ", ".join(f"{letter} = {arm}" for arm, letter in short.items())
    lines = [f"runs started {prov['first_start']} to {prov['last_start']} (UTC); code "
             f"{', '.join(prov['commits'])}; machine: {'; '.join(prov['machines'])}; torch "
             f"{'; '.join(prov['torch'])}",
             f"run order (by start time): {order} ({legend})"]
    if prov["runs_without_record"]:
        lines.append(f"{prov['runs_without_record']} run(s) have no environment.json")
    return lines


def format_table(result: dict) -> str:
    """The comparison's table; runs that logged the update's memory (podsrl since #29) get a
    column for it: activations of the largest micro-batch / CUDA peak, in MiB."""
    fractions = " / ".join(f"{int(100 * f)}%" for f in BUDGET_FRACTIONS)
    memory = any(r.get("update_activation_mb") is not None for r in result["rows"])
    lines = [f"baseline: {result['baseline']}; target: {100 * result['target_accuracy']:.1f}% "
             f"(99% of its best mean held-out accuracy); {_budget_line(result)}",
             *_provenance_lines(result["provenance"]), "",
             f"| arm | seeds | steps | s/step (inference + update) | acc at {fractions} of budget | peak acc "
             f"| time to target (s) | speedup (mean curves) | speedup per seed (95% CI) |"
             + (" update memory, MiB (activations / CUDA peak) |" if memory else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if memory else "")]
    notes = []
    for r in result["rows"]:
        at_budget = " / ".join(f"{100 * v:.1f}%" for v in r["accuracy_at_budget"].values())
        reach = (f"{r['time_to_target']:.1f} (" if r["time_to_target"] is not None
                 else f"> {r['mean_curve_end']:.1f} (censored; ")
        pairs = len(r["seed_pairs"])
        per_seed = (f"{_fmt(r['speedup_per_seed_mean'], '{:.2f}')} +- "
                    f"{_fmt(r['speedup_per_seed_ci95'], '{:.2f}')} ({pairs} pair{'s' if pairs != 1 else ''}"
                    + (f", {r['censored_pairs']} censored" if r["censored_pairs"] else "") + ")")
        lines.append(
            f"| {r['arm']} | {r['seeds']} | {r['steps_mean']:.0f} | {r['seconds_per_step']:.3f} "
            f"({r['inference_seconds_per_step']:.3f} + {r['update_seconds_per_step']:.3f}) | {at_budget} "
            f"| {100 * r['peak_accuracy']:.1f}% | {reach}{r['seeds_reaching_target']}/{r['seeds']} seeds) "
            f"| {_fmt(r['speedup_vs_baseline'], '{:.2f}x')} | {per_seed} |"
            + (f" {_fmt(r.get('update_activation_mb'), '{:.0f}')} / "
               f"{_fmt(r.get('update_peak_cuda_mb'), '{:.0f}')} |"
               if memory else ""))
        for p in r["seed_pairs"]:
            if p["censored"]:
                bound = {"arm": "an upper bound: the arm missed the target within its budget",
                         "baseline": "a lower bound: the baseline missed the target within its budget",
                         "both": "no bound: neither run reached the target"}[p["censored"]]
                notes.append(f"- {r['arm']}, seed {p['seed']}: ratio {_fmt(p['ratio'], '{:.2f}')} is {bound} "
                             f"(times {p['baseline_seconds']:.1f} s / {p['arm_seconds']:.1f} s, censored at "
                             "the budget)")
    if notes:
        lines += ["", "Censored pairs (a run that misses the target counts its whole budget):", *notes]
    return "\n".join(lines + headline_lines(result) + off_policy_lines(result["rows"])
                     + noise_lines(result["rows"]))


def off_policy_lines(rows: list[dict]) -> list[str]:
    """Per arm, what partial rollouts and the slots engine logged (per-step means over seeds):
    the share of trained tokens an earlier policy drew, their staleness, the samples resumed and
    restarted, the share of slots left without a sample. Nothing for runs that logged none."""
    lines = []
    for r in rows:
        numbers = r.get("off_policy") or {}
        parts = []
        if "off_policy_token_frac" in numbers:
            parts.append(f"off-policy tokens {100 * numbers['off_policy_token_frac']:.1f}%, staleness "
                         f"{numbers.get('staleness_mean', 0.0):.2f} (max "
                         f"{numbers.get('staleness_max', 0):.0f}), "
                         f"{numbers.get('partial_samples_resumed', 0.0):.1f} samples resumed and "
                         f"{numbers.get('partial_samples_restarted', 0.0):.1f} restarted a step")
        if "idle_slot_frac" in numbers:
            parts.append(f"idle slots {100 * numbers['idle_slot_frac']:.1f}%")
        if parts:
            lines.append(f"- {r['arm']}: {'; '.join(parts)}")
    return ["", "Partial rollouts and decoding slots, per step (means over seeds):", *lines] if lines else []

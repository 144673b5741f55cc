"""What one more generated rollout costs against what one more trained rollout costs, from
finished runs of grpo (m), pods (n -> m) and grpo-ga (n) with the same model and settings.

PODS pays for n - m extra rollouts per prompt at generation and trains on m; GRPO-GA trains
on all n. So, per prompt group and per step (medians over steps, warm-up steps dropped):

    extra generated rollout = (generate_s[pods] - generate_s[grpo]) / (generated[pods] - generated[grpo])
    extra trained rollout   = (update_s[grpo-ga] - update_s[pods])  / (P * (n - m))

where generated is the rollouts a step generated as its metrics logged them (early stop cancels
some of PODS's n, so fewer than P * n), else P * n and P * m: then the first denominator is P * (n - m).
The table's "ms per generated rollout" divides by the same count.

Without grpo-ga runs the marginal trained rollout is not measured: the table then gives the
average one, update_s[grpo] / (P * m), which includes the update's fixed cost, so the ratio it
gives is an upper bound on the marginal one.

Their ratio says where PODS can win at equal time: the larger it is, the more rollouts PODS
can generate for the price of training on one (docs/reproducing.md, "Where the gain comes from").

    python benchmarks/rollout_costs.py RUN_DIR [RUN_DIR ...] [--record NAME]

RUN_DIR is a `podsrl train` output folder (config.json + metrics.jsonl), or any folder
holding such folders (a `podsrl compare` output); runs of one method are pooled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from podsrl.experiments.runs import generated_per_step
from podsrl.methods import METHODS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

WARMUP_STEPS = 2  # the first steps pay for CUDA / allocator warm-up; they are not the steady cost


def find_runs(paths: list[Path]) -> list[Path]:
    runs = []
    for path in paths:
        runs += sorted(p.parent for p in path.rglob("metrics.jsonl") if (p.parent / "config.json").exists())
    if not runs:
        raise SystemExit(f"rollout_costs: no run folder (config.json + metrics.jsonl) under "
                         f"{', '.join(map(str, paths))}")
    return runs


def step_seconds(run: Path) -> tuple[dict, list[float], list[float], list[float], list[float]]:
    """(config, generate, update and whole-step seconds per step, rollouts generated per step) of a
    run, warm-up dropped; a step's whole is the sum of its stages' times (generate, reward, select,
    advantages, update; evaluation is not part of a step); its rollouts generated as it logged them
    (early stop, partial rollouts, dynamic sampling), else prompts x n (:func:`generated_per_step`)."""
    config = json.loads((run / "config.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("step", 0) > WARMUP_STEPS and "time_generate" in r]
    whole = [sum(v for k, v in r.items() if k.startswith("time_") and k != "time_eval") for r in steps]
    return (config, [r["time_generate"] for r in steps], [r["time_update"] for r in steps], whole,
            [generated_per_step(config, r) for r in steps])


def pooled(runs: list[Path]) -> dict[str, dict]:
    """Per method: the shared settings, and the median generate / update seconds per step."""
    by_method: dict[str, dict] = {}
    for run in runs:
        config, generate, update, whole, generated = step_seconds(run)
        entry = by_method.setdefault(config["method"], {"config": config, "generate": [], "update": [], "whole": [],
                                                        "generated": [], "runs": 0})
        for field in ("num_generations", "num_kept", "prompts_per_step", "model"):
            if entry["config"][field] != config[field]:
                raise SystemExit(f"rollout_costs: {run} has {field}={config[field]!r}, another "
                                 f"{config['method']} run has {entry['config'][field]!r}")
        entry["generate"] += generate
        entry["update"] += update
        entry["whole"] += whole
        entry["generated"] += generated
        entry["runs"] += 1
        recorded = run / "environment.json"
        environment = json.loads(recorded.read_text())[0] if recorded.exists() else {}
        entry.setdefault("measured", set()).add(f"{environment.get('machine', 'unknown machine')}, "
                                                f"torch {environment.get('torch', '?')}, "
                                                f"code {environment.get('commit', '?')}")
    missing = {"grpo", "pods"} - set(by_method)
    if missing:
        raise SystemExit(f"rollout_costs: needs runs of grpo and pods (and grpo-ga for the marginal trained "
                         f"rollout); none of {', '.join(sorted(missing))}")
    return by_method


def table(by_method: dict[str, dict]) -> str:
    pods = by_method["pods"]["config"]
    n, m, prompts = pods["num_generations"], pods["num_kept"], pods["prompts_per_step"]
    median = {method: (statistics.median(e["generate"]), statistics.median(e["update"]))
              for method, e in by_method.items()}
    rollouts = {method: statistics.median(e["generated"]) for method, e in by_method.items()}  # generated / step
    generated = (median["pods"][0] - median["grpo"][0]) / (rollouts["pods"] - rollouts["grpo"])
    if "grpo-ga" in median:
        trained = (median["grpo-ga"][1] - median["pods"][1]) / (prompts * (n - m))
        trained_label = "one extra trained rollout"
    else:
        trained = median["grpo"][1] / (prompts * m)
        trained_label = "one trained rollout on average (no grpo-ga runs: an upper bound on the marginal cost)"
    measured = sorted(set().union(*(e["measured"] for e in by_method.values())))
    lines = [f"Runs measured on: {'; '.join(measured)}.", "",
             f"model {pods['model']}, {prompts} prompts per step, n = {n}, m = {m}, "
             f"{pods['max_completion_length']} completion tokens at most; medians over steps > {WARMUP_STEPS}",
             "",
             "| method | runs | steps | generate s/step | update s/step | step s | generation's share of a step "
             "| ms per generated rollout | ms per trained rollout |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method in ("grpo", "pods", "grpo-ga"):
        if method not in by_method:
            continue
        e, config = by_method[method], by_method[method]["config"]
        generate, update = median[method]
        share = statistics.median(g / w for g, w in zip(e["generate"], e["whole"]) if w > 0)
        trained_rows = prompts * METHODS[method].trained_per_prompt(config["num_generations"], config["num_kept"])
        lines.append(f"| {method} | {e['runs']} | {len(e['generate'])} | {generate:.3f} | {update:.3f} | "
                     f"{statistics.median(e['whole']):.3f} | {share:.0%} | {1000 * generate / rollouts[method]:.1f} | "
                     f"{1000 * update / trained_rows:.1f} |")
    ratio = f"{trained / generated:.1f}x" if generated > 0 else "n/a (extra rollouts measured free)"
    lines += ["", "ms per generated / trained rollout: a step's generate / update seconds over the rollouts it "
              "generated / trained (averages, fixed costs included; the marginal costs follow)",
              f"- one extra generated rollout: {1000 * generated:.2f} ms; {trained_label}: "
              f"{1000 * trained:.2f} ms; trained / generated: {ratio}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    args = parser.parse_args()
    body = table(pooled(find_runs(args.run_dirs)))
    print(body)
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

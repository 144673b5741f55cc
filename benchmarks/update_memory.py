"""The update's memory per method, from finished podsrl runs (their metrics.jsonl): the
paper's memory argument measured. PODS and GRPO train on P x m rollouts per step, GRPO-GA
on P x n; with a fixed micro-batch GRPO-GA keeps the memory and pays in time (more
micro-batches), without accumulation it pays in memory.

    python benchmarks/update_memory.py RUN_DIR [RUN_DIR ...] [--record NAME]

Per run: method, rows trained per step, micro-batch, micro-batches per step, the largest
micro-batch's activations saved for backward and the CUDA allocator's peak during the
update (both in MiB, the largest over the run's steps; models/memory.py), and the median
update seconds per step over steps > 1 (the first step pays warm-up).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from podsrl.experiments.runs import largest_logged
from podsrl.methods import METHODS
from podsrl.metrics import read_metrics
from podsrl.provenance import read_environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)


def row(run: Path) -> dict:
    config = json.loads((run / "config.json").read_text())
    steps = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
    activation_mb = largest_logged(r.get("update_activation_mb") for r in steps)
    if activation_mb is None:
        raise SystemExit(f"{run}: no update memory in metrics.jsonl (runs before podsrl logged it)")
    method = METHODS[config["method"]]
    rows = config["prompts_per_step"] * method.trained_per_prompt(config["num_generations"], config["num_kept"])
    return {"run": run, "method": config["method"], "rows": rows, "micro_batch": config["micro_batch_size"],
            "micro_batches": math.ceil(rows / config["micro_batch_size"]),
            "activation_mb": activation_mb, "cuda_mb": largest_logged(r.get("update_peak_cuda_mb") for r in steps),
            "update_s": statistics.median(r["time_update"] for r in steps[1:] or steps),
            "machine": (read_environment(run) or [{}])[-1].get("machine", "unknown")}


def table(rows: list[dict]) -> str:
    def mib(value):
        return "n/a" if value is None else f"{value:,.0f}"

    machines = sorted({r["machine"] for r in rows})
    lines = [f"Runs measured on: {'; '.join(machines)}.", "",
             "| run | method | rows trained per step | micro-batch | micro-batches | activations (MiB) "
             "| CUDA peak (MiB) | update s/step (median) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['run'].name} | {r['method']} | {r['rows']} | {r['micro_batch']} | {r['micro_batches']} "
                     f"| {mib(r['activation_mb'])} | {mib(r['cuda_mb'])} | {r['update_s']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    args = parser.parse_args()
    text = table([row(run) for run in args.run_dirs])
    print(text)
    if args.record:
        record(args.record, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

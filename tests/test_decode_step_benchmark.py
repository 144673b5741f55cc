"""benchmarks/decode_step.py at a tiny size on the CPU: its table's cells and its verdicts on
#70's targets (the GPU's read from rows as a GPU run gives them)."""

import importlib.util
from pathlib import Path

import pytest

from podsrl.rollout import decode_step

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("decode_step_benchmark", REPO / "benchmarks" / "decode_step.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_step_table_has_a_cell_per_rows_and_kv_with_positive_times_and_bounds():
    table, rows = bench.step_table(["tiny"], 1, (8,), (4, 8), compiled=False)
    assert [(r["rows"], r["kv"]) for r in rows] == [(8, 4), (8, 8)]
    assert all(r["ours"] > 0 and r["larger"] > 0 and r["forward"] > 0 for r in rows)
    assert table.count("\n| tiny | 8 |") == 2 and "1 thread" in table and "compiled" not in table


@pytest.mark.slow
def test_the_compiled_column_times_the_compiled_step_and_the_ratios_take_the_fastest_path(monkeypatch):
    monkeypatch.setattr(decode_step, "BACKEND", "eager")  # dynamo's trace without inductor's code generation
    monkeypatch.setattr(decode_step, "COMPILED", [])
    table, rows = bench.step_table(["tiny"], 1, (8,), (4,))
    header, cell = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    columns = dict(zip(header.split(" | "), cell.split(" | ")))
    eager, compiled = float(columns["podsrl ms"]), float(columns["compiled"])
    assert len(decode_step.COMPILED) == 1 and compiled > 0
    assert f"{rows[0]['ours']:.2f}" == f"{min(eager, compiled):.2f}"  # the ratios' podsrl: the faster path


def test_the_gpu_verdict_says_met_missed_or_not_measured_for_each_target():
    rows = [dict(model="tiny-chain", rows=256, kv=64, ours=0.4), dict(model="tiny-chain", rows=256, kv=256, ours=0.6)]
    verdict = bench.gpu_verdict(rows)
    assert "tiny-chain at 256 rows, at most 0.5 ms a step: MISSED (0.40 ms at KV 64, 0.60 ms at KV 256)" in verdict
    assert "smollm2-135m-instruct at 512 rows (at most 5 ms a step): not measured in this run" in verdict
    rows[1]["ours"] = 0.5
    assert "at most 0.5 ms a step: met" in bench.gpu_verdict(rows)

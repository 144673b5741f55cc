"""Acceptance check for podsrl.rewards.grading on the real GSM8K test and MATH-500 data.

Self-consistency: every gold *solution text* graded against its own gold answer must be
correct (the extractor has to find the answer inside a full worked solution). Cross
rejection: each solution graded against another item's gold must be wrong; pairs whose two
golds are equal by ``grade`` itself are skipped and counted, since rejecting them would be
the error.

    python benchmarks/grade_check.py [--data DIR]

Targets: GSM8K self >= 99.5%, MATH-500 self >= 99%, cross rejection >= 99% each.
Exits non-zero when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from podsrl.rewards.grading import extract_final_answer, grade, gsm8k_gold, math_gold

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGETS = {"gsm8k": (99.5, 99.0), "math": (99.0, 99.0)}


def load_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def items(data: Path, task: str) -> list[tuple[str, str]]:
    """(solution text, gold answer) per item."""
    if task == "gsm8k":
        return [(r["answer"], gsm8k_gold(r["answer"])) for r in load_jsonl(data / "gsm8k" / "test.jsonl")]
    return [(r["solution"], math_gold(r)) for r in load_jsonl(data / "math500" / "test.jsonl")]


def check(task: str, pairs: list[tuple[str, str]], limit: int | None = None) -> dict:
    """Self-consistency and cross rejection over ``pairs`` (the first ``limit`` items)."""
    pairs = pairs[:limit] if limit else pairs
    n = len(pairs)
    start = time.perf_counter()
    self_fail = [(i, gold, extract_final_answer(sol)) for i, (sol, gold) in enumerate(pairs)
                 if not grade(sol, gold, task)]
    self_s = time.perf_counter() - start

    start = time.perf_counter()
    cross_fail, skipped, checked = [], [], 0
    for i, (sol, gold) in enumerate(pairs):
        # the next item whose gold differs as a string (MATH has many repeated answers)
        j = next((k % n for k in range(i + 1, i + n) if pairs[k % n][1].strip() != gold.strip()), None)
        if j is None:
            continue
        other = pairs[j][1]
        if grade(f"\\boxed{{{gold}}}", other, task) or grade(f"\\boxed{{{other}}}", gold, task):
            skipped.append((i, j, gold, other))
            continue
        checked += 1
        if grade(sol, other, task):
            cross_fail.append((i, j, other, extract_final_answer(sol)))
    cross_s = time.perf_counter() - start
    return {"task": task, "n": n, "self_fail": self_fail, "self_s": self_s,
            "cross_checked": checked, "cross_fail": cross_fail, "skipped": skipped,
            "cross_s": cross_s,
            "self_pct": 100.0 * (n - len(self_fail)) / max(n, 1),
            "cross_pct": 100.0 * (checked - len(cross_fail)) / max(checked, 1)}


def report(r: dict) -> bool:
    self_target, cross_target = TARGETS[r["task"]]
    ok = r["self_pct"] >= self_target and r["cross_pct"] >= cross_target
    print(f"[{r['task']}] items={r['n']}  self-correct={r['n'] - len(r['self_fail'])}/{r['n']} "
          f"({r['self_pct']:.2f}%, target {self_target}%)  {r['self_s']:.1f}s")
    print(f"[{r['task']}] cross-rejected={r['cross_checked'] - len(r['cross_fail'])}/{r['cross_checked']} "
          f"({r['cross_pct']:.2f}%, target {cross_target}%)  skipped-equal-golds={len(r['skipped'])}  "
          f"{r['cross_s']:.1f}s  -> {'PASS' if ok else 'FAIL'}")
    for i, gold, got in r["self_fail"]:
        print(f"  self-fail  #{i}: gold={gold!r} extracted={got!r}")
    for i, j, other, got in r["cross_fail"]:
        print(f"  cross-fail #{i} vs gold of #{j}: other gold={other!r} extracted={got!r}")
    for i, j, gold, other in r["skipped"]:
        print(f"  skipped    #{i} vs #{j}: {gold!r} == {other!r}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"data folder (default {DEFAULT_DATA})")
    parser.add_argument("--limit", type=int, default=None, help="only the first N items of each set")
    args = parser.parse_args(argv)
    if not (args.data / "gsm8k" / "test.jsonl").is_file() or not (args.data / "math500" / "test.jsonl").is_file():
        print(f"data not found under {args.data} (need gsm8k/test.jsonl and math500/test.jsonl)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    ok = all([report(check(task, items(args.data, task), args.limit)) for task in ("gsm8k", "math")])
    print(f"total {time.perf_counter() - start:.1f}s  {'ALL TARGETS MET' if ok else 'TARGETS MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

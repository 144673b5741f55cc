"""Where does a pretrained model have headroom? The base model's held-out accuracy on each
candidate task, before any RL, to pick a regime where it follows the answer format and
starts between about 10% and 50% (issue #29: a comparison whose target is not a plateau).

    python benchmarks/regime_candidates.py [--model smollm2-135m-instruct] [--prompts 100]
        [--samples 4] [--output_dir runs/regime-candidates] [--record NAME]

Each candidate is one `podsrl eval` (sampled at T = 0.9, plus the share of completions that
gave an answer in the task's format); GSM8K needs ../shared/data (skipped when absent).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from podsrl.run_folder.eval_command import run_eval
from podsrl.trainer.config import make_config
from podsrl.trainer.setup import task_options

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

CALCULATOR = "You are a calculator. Reply with exactly one line of the form 'Answer: <number>' and nothing else."
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def candidates() -> dict[str, dict]:
    found = {f"arithmetic level {level}": {"task": "arithmetic", "task_level": level, "system_prompt": CALCULATOR,
                                           "max_completion_length": 12} for level in (1, 2, 3, 4, 5)}
    gsm8k = DATA / "gsm8k" / "test.jsonl"
    if gsm8k.exists():
        found["gsm8k (test)"] = {"task": "gsm8k", "test_data": str(gsm8k), "train_data": str(gsm8k),
                                 "max_completion_length": 256}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--only", default="", help="run the candidates whose name contains this")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/regime-candidates"))
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    rows = ["| candidate | prompts x samples | sampled accuracy (T = 0.9) | answered in format | seconds |",
            "| --- | --- | --- | --- | --- |"]
    for name, fields in candidates().items():
        if args.only not in name:
            continue
        cfg = make_config(overrides={"model": args.model, "eval_prompts": str(args.prompts),
                                     "eval_samples": str(args.samples), "eval_temperature": "0.9",
                                     "output_dir": str(args.output_dir / name.replace(" ", "-")),
                                     **{k: str(v) for k, v in fields.items()}})
        summary = run_eval(cfg, task_options(cfg))
        rows.append(f"| {name} | {summary['prompts']} x {summary['samples_per_prompt']} | "
                    f"{100 * summary['accuracy']:.1f}% | {100 * summary['answered']:.0f}% | {summary['seconds']:.0f} |")
        print(rows[-1], flush=True)
    body = f"model {args.model}, base (no RL)\n\n" + "\n".join(rows)
    print(body)
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

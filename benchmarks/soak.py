"""Soak test: a long run of the tiny model, recording resident memory (RSS) over time.

    python benchmarks/soak.py [--steps 1000] [--output_dir runs/soak]

A sampler thread reads this process's RSS from /proc every second while the run trains
(checkpoints every 100 steps, evaluation at the ends). Prints RSS at several points of the
run and the growth from 10% of the run to its end; memory that grows with the step count
(a leak) shows as steady growth rather than noise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from pathlib import Path

from podsrl.trainer import train
from podsrl.trainer.config import make_config


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--output_dir", type=Path, default=Path("runs/soak"))
    args = parser.parse_args()
    shutil.rmtree(args.output_dir, ignore_errors=True)
    metrics = args.output_dir / "metrics.jsonl"
    samples: list[tuple[float, int, float]] = []  # (seconds, steps done, RSS MiB)
    done = threading.Event()

    def sample() -> None:
        start = time.time()
        while not done.is_set():
            steps = len(metrics.read_text().splitlines()) - 1 if metrics.exists() else 0
            samples.append((time.time() - start, max(0, steps), rss_mib()))
            done.wait(1.0)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    cfg = make_config(overrides={"max_steps": args.steps, "eval_steps": 0, "save_steps": 100,
                                 "output_dir": str(args.output_dir), "progress": "false"})
    result = train(cfg)
    done.set()
    thread.join()
    training = [s for s in samples if 0 < s[1] <= args.steps]
    print(f"{result.steps} steps in {samples[-1][0]:.0f} s; RSS samples: {len(samples)}")
    for fraction in (0.1, 0.25, 0.5, 0.75, 1.0):
        target = fraction * args.steps
        at = min(training, key=lambda s: abs(s[1] - target))
        print(f"  step {at[1]:5d}: RSS {at[2]:7.1f} MiB")
    early = [s[2] for s in training if s[1] <= 0.1 * args.steps] or [training[0][2]]
    late = [s[2] for s in training if s[1] >= 0.9 * args.steps] or [training[-1][2]]
    print(f"mean RSS over the first 10% of steps: {sum(early) / len(early):.1f} MiB; over the last 10%: "
          f"{sum(late) / len(late):.1f} MiB; growth {sum(late) / len(late) - sum(early) / len(early):+.1f} MiB; "
          f"peak {max(s[2] for s in samples):.1f} MiB")
    (args.output_dir / "rss.json").write_text(json.dumps(samples))


if __name__ == "__main__":
    main()

"""How fast the command line answers: `podsrl --help` and `podsrl COMMAND --help` against
`python -c "import torch"` on the same machine, in one run, interleaved (#69: the help must
import neither torch nor transformers, and take less than half of torch's import).

    python benchmarks/cli_latency.py [--repeats 7] [--record NAME]

Each command runs ``--repeats`` times as a fresh process (the first of each is a warm-up,
not counted, so the file cache is warm for all); the table gives medians and each one's
ratio to `import torch`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)

TARGET = 0.5  # the help's share of `import torch`'s time at most (#69)


def commands() -> dict[str, list[str]]:
    podsrl = shutil.which("podsrl", path=str(Path(sys.executable).parent)) or "podsrl"
    return {"python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "podsrl --help": [podsrl, "--help"],
            "podsrl train --help": [podsrl, "train", "--help"],
            "podsrl eval --help": [podsrl, "eval", "--help"],
            "podsrl compare --help": [podsrl, "compare", "--help"]}


def seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    args = parser.parse_args()
    runs = commands()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(args.repeats + 1):  # interleaved: a slow moment of the machine hits every command
        for name, argv in runs.items():
            took = seconds(argv)
            if round_:
                times[name].append(took)
    torch_time = statistics.median(times["python -c 'import torch'"])
    lines = ["| command | median s | min s | ratio to `import torch` |", "| --- | --- | --- | --- |"]
    for name, values in times.items():
        lines.append(f"| `{name}` | {statistics.median(values):.3f} | {min(values):.3f} | "
                     f"{statistics.median(values) / torch_time:.3f} |")
    worst = max(statistics.median(v) for name, v in times.items() if name.startswith("podsrl")) / torch_time
    lines += ["", f"{args.repeats} runs each, interleaved, after one warm-up round; the slowest help is "
                  f"{worst:.3f}x `import torch` (target: at most {TARGET}x): "
                  f"{'met' if worst <= TARGET else 'missed'}."]
    body = "\n".join(lines)
    print(body)
    if args.record:
        record(args.record, body)
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Regenerate a comparison's table and figures from run folders committed under
benchmarks/runs/ (runs made elsewhere, e.g. on a GPU machine), and record the table in
RESULTS.md: the table is computed from the committed metrics, never typed in.

    python benchmarks/replot.py RUN_DIR [RUN_DIR ...] --output_dir runs/replot \
        [--figures benchmarks/figures] [--record NAME] [--baseline ARM]

The provenance line names the machine that ran this script; the machine, code and dates
of the runs themselves are in the table (from each run's environment.json).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from podsrl.cli import main as podsrl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import record  # noqa: E402 (benchmarks/ is not a package)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--output_dir", type=Path, default=Path("runs/replot"))
    parser.add_argument("--baseline", default="")
    parser.add_argument("--figures", type=Path, default=None, help="copy the figures here (e.g. benchmarks/figures)")
    parser.add_argument("--record", default="", help="write the table into RESULTS.md as block NAME")
    args = parser.parse_args()
    code = podsrl(["plot", *map(str, args.run_dirs), "--output_dir", str(args.output_dir),
                   *(["--baseline", args.baseline] if args.baseline else [])])
    if code:
        return code
    stem = args.record or "replot"
    if args.figures:
        args.figures.mkdir(parents=True, exist_ok=True)
        for produced in ("accuracy.png", "step_time.png"):
            shutil.copy(args.output_dir / produced, args.figures / f"{stem}-{produced}")
    if args.record:
        figure = f"\n\n![{stem}: accuracy vs training time](figures/{stem}-accuracy.png)" if args.figures else ""
        record(args.record, (args.output_dir / "compare.md").read_text() + figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())

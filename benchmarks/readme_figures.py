"""The README's results figures (#81 item 5), one per regime: held-out accuracy against training
minutes, every arm, the mean over seeds with its 95% band, each drawn by ``podsrl plot`` from the run
files committed under benchmarks/recorded/ (never from numbers typed in).

    python benchmarks/readme_figures.py [--output_dir runs/readme-figures]

writes benchmarks/figures/readme-REGIME-accuracy.png for each regime of ``REGIMES``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from podsrl.cli import main as podsrl

BENCHMARKS = Path(__file__).resolve().parent
# regime: (its run folders under benchmarks/recorded/, the baseline arm)
REGIMES = {
    "main": ("tiny-vs-ga-5x2", "grpo-ga"),  # the main job's settings, the paper's second comparison
    # every method at its best generation settings and its tuned learning rate
    "reasoning": ("tiny-chain-tuned-rates/runs", "grpo-ga 16 slots partial-2"),
    "smollm2-lora": ("cpu-headroom-20", "grpo"),  # the warmed SmolLM2-135M with LoRA r = 16
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=Path("runs/readme-figures"))
    args = parser.parse_args()
    for regime, (folder, baseline) in REGIMES.items():
        out = args.output_dir / regime
        code = podsrl(["plot", str(BENCHMARKS / "recorded" / folder), "--output_dir", str(out),
                       "--baseline", baseline])
        if code:
            return code
        shutil.copy(out / "accuracy.png", BENCHMARKS / "figures" / f"readme-{regime}-accuracy.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

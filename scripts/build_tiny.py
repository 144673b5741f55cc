"""Rebuild the shipped ``tiny`` model (tokenizer + Qwen2-shaped model + spread warm start).

    python scripts/build_tiny.py [--output DIR] [--clean-steps N] [--spread-steps N]

Takes about 10 minutes on 2 CPU cores; writes build_info.json with the accuracies reached.
"""

import argparse
from pathlib import Path

from podsrl.build.tiny import ASSET_DIR, build

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--output", type=Path, default=ASSET_DIR)
parser.add_argument("--level", type=int, default=3)
parser.add_argument("--clean-steps", type=int, default=3000)
parser.add_argument("--spread-steps", type=int, default=300)
parser.add_argument("--perturb-fraction", type=float, default=0.5)
parser.add_argument("--hidden-size", type=int, default=128)
parser.add_argument("--num-layers", type=int, default=4)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
build(args.output, level=args.level, clean_steps=args.clean_steps, spread_steps=args.spread_steps,
      perturb_fraction=args.perturb_fraction, hidden_size=args.hidden_size,
      num_layers=args.num_layers, seed=args.seed)

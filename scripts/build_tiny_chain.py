"""Rebuild the shipped ``tiny-chain`` model (the reasoning regime's, #58): tokenizer +
Qwen2-shaped model + spread warm start on the ``chain`` task.

    python scripts/build_tiny_chain.py [--output DIR] [--clean-steps N] [--polish-steps N] [--spread-steps N]

An existing --output folder is written over only when it holds an earlier build and nothing else.

Writes build_info.json with the accuracies reached and the build's seconds.
"""

import argparse
from pathlib import Path

from podsrl.build.tiny_chain import ASSET_DIR, build

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--output", type=Path, default=ASSET_DIR)
parser.add_argument("--level", type=int, default=3)
parser.add_argument("--clean-steps", type=int, default=2000)
parser.add_argument("--polish-steps", type=int, default=800)
parser.add_argument("--spread-steps", type=int, default=200)
parser.add_argument("--slip-probability", type=float, default=0.15)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--hidden-size", type=int, default=128)
parser.add_argument("--num-layers", type=int, default=4)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
build(args.output, level=args.level, clean_steps=args.clean_steps, polish_steps=args.polish_steps,
      spread_steps=args.spread_steps,
      slip_probability=args.slip_probability, batch_size=args.batch_size, hidden_size=args.hidden_size,
      num_layers=args.num_layers, seed=args.seed)

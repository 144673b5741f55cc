"""Rebuild the shipped ``tiny-chain`` model (the reasoning regime's, #58): tokenizer +
Qwen2-shaped model + spread warm start on the ``chain`` task.

    python scripts/build_tiny_chain.py [--output DIR] [--clean-steps N] [--polish-steps N] [--spread-steps N]

An existing --output folder is written over only when it holds an earlier build and nothing else.

Writes build_info.json with the accuracies reached and the build's seconds.
"""

import argparse
import inspect
from pathlib import Path

from podsrl.build.tiny_chain import build

# every option is one of build()'s keyword arguments, its default build()'s own (one place to change it)
DEFAULTS = {name: p.default for name, p in inspect.signature(build).parameters.items()}
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--output", dest="output_dir", type=Path, default=DEFAULTS["output_dir"])
for name in ("level", "clean_steps", "polish_steps", "spread_steps", "slip_probability", "batch_size",
             "hidden_size", "num_layers", "seed"):
    parser.add_argument("--" + name.replace("_", "-"), type=type(DEFAULTS[name]), default=DEFAULTS[name])
build(**vars(parser.parse_args()))

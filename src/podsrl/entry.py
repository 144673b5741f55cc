"""The ``podsrl`` command's entry point: the command line needs the trainer's dependencies
(the ``train`` extra), which a core install beside verl leaves out; say so in one line
instead of a traceback."""

from __future__ import annotations

import sys

# distributions of the `train` extra, by import name
TRAIN_STACK = {"transformers", "tokenizers", "peft", "accelerate", "safetensors", "yaml", "tqdm", "matplotlib",
               "math_verify", "datasets", "pyarrow"}


def main(argv: list[str] | None = None) -> int:
    try:
        from podsrl.cli import main as run_command
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in TRAIN_STACK:
            raise
        print(f"podsrl: the command line needs podsrl's trainer dependencies, and {err.name} is not installed: "
              f"pip install '.[train]' in a podsrl clone", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a Ctrl-C in the seconds torch and transformers take to import
        args = sys.argv[1:] if argv is None else argv
        command = f"podsrl {args[0]}" if args and args[0].isidentifier() else "podsrl"
        print(f"{command}: stopped by SIGINT while starting; nothing was written", file=sys.stderr)
        return 130
    return run_command(argv)

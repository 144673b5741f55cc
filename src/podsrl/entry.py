"""The ``podsrl`` command's entry point: the commands need the trainer's dependencies
(the ``train`` extra), which a core install beside verl leaves out; say so in one line
instead of a traceback."""

from __future__ import annotations

import signal
import sys

# distributions of the `train` extra, by import name
TRAIN_STACK = {"transformers", "tokenizers", "peft", "accelerate", "safetensors", "yaml", "tqdm",
               "matplotlib", "math_verify", "datasets", "pyarrow"}


def take_sigint() -> None:
    """SIGINT is a stop request for podsrl's whole life, also when it was started ignoring it
    (a shell script's ``podsrl train ... &`` does: a background job ignores Ctrl-C). Python
    keeps an ignored SIGINT ignored, so without this a SIGINT during the seconds of imports
    would be lost, while the trainer takes SIGINT as a clean stop from set-up on whatever it
    inherited (podsrl.trainer.stops): ``kill -INT`` of a background run stops it with a
    checkpoint, as documented, at any moment. A Ctrl-C meant for the script that reaches the
    run costs a clean stop, which ``--resume`` continues; an ignored one would cost a SIGKILL
    later and the steps since the last checkpoint. SIGHUP (``nohup``) is left as it is."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    take_sigint()
    try:
        from podsrl.cli import main as run_command

        # a command imports its machinery when it runs (--help answers without it)
        return run_command(argv)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in TRAIN_STACK:
            raise
        print(f"podsrl: the command line needs podsrl's trainer dependencies, and {err.name} is not "
              "installed: pip install '.[train]' in a podsrl clone", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a Ctrl-C while podsrl.cli imports (a command's own: podsrl.cli.INTERRUPTED)
        args = sys.argv[1:] if argv is None else argv
        command = f"podsrl {args[0]}" if args and args[0].isidentifier() else "podsrl"
        print(f"{command}: stopped by SIGINT while starting; nothing was written", file=sys.stderr)
        return 130

"""Command line: ``podsrl train|eval [--config FILE.yaml] [--FIELD VALUE ...]`` and ``podsrl plot``.

Every field of ``podsrl.config.Config`` is a ``--field`` option (``podsrl train --help``
lists them with their defaults and documentation).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from podsrl.config import Config, make_config, parse_value


def _config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--config", help="YAML file of config fields (command-line values override it).")
    for f in fields(Config):
        # Values stay strings here; podsrl.config.parse_value converts them and names the
        # field on error, the same way for YAML and the command line.
        flag = dict(nargs="?", const="true") if isinstance(f.default, bool) else {}  # `--resume` alone = true
        parser.add_argument(f"--{f.name}", dest=f.name, default=None, metavar=type(f.default).__name__.upper(),
                            help=f"{f.metadata['help']} (default: {f.default!r})", **flag)
    return parser


def _parse_config(argv: list[str], prog: str, description: str):
    """Config from ``--config FILE`` and ``--field value`` options, or None after printing
    the error (which names the field)."""
    parser = _config_parser(prog, description)
    args, unknown = parser.parse_known_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    try:
        if unknown:
            if unknown[0].startswith("--"):  # raises "unknown config field", with a suggestion
                parse_value(unknown[0][2:].split("=")[0], None)
            raise ValueError(f"unexpected argument {unknown[0]!r}")
        return make_config(args.config, overrides)
    except (ValueError, FileNotFoundError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return None


def cmd_train(argv: list[str]) -> int:
    cfg = _parse_config(argv, "podsrl train", "Train a causal LM with GRPO, GRPO-GA or PODS.")
    if cfg is None:
        return 2
    from podsrl.trainer import train

    try:
        result = train(cfg)
    except (ValueError, OSError) as err:  # data or model problems found while loading
        print(f"podsrl train: error: {err}", file=sys.stderr)
        return 2
    init, final = result.initial, result.final
    print(f"held-out accuracy (sampled, T={cfg.eval_temperature}, {cfg.eval_samples} samples x "
          f"{cfg.eval_prompts} prompts): {100 * init['eval_accuracy']:.1f}% at step 0 -> "
          f"{100 * final['eval_accuracy']:.1f}% at step {result.steps} "
          f"({result.train_seconds / 60:.1f} min of training)")
    if "eval_greedy_accuracy" in final:
        print(f"held-out accuracy (greedy): {100 * init['eval_greedy_accuracy']:.1f}% -> "
              f"{100 * final['eval_greedy_accuracy']:.1f}%")
    print(f"run directory: {result.run_dir}")
    print(f"metrics:       {result.run_dir / 'metrics.jsonl'}")
    print(f"plot:          {result.plot}")
    return 0


def cmd_eval(argv: list[str]) -> int:
    cfg = _parse_config(argv, "podsrl eval", "Accuracy of a model or a run's model/ folder on a task's held-out "
                        "split; uses the eval_* fields (eval_temperature 0 = greedy).")
    if cfg is None:
        return 2
    from podsrl.evaluate import run_eval

    try:
        summary = run_eval(cfg)
    except (ValueError, OSError) as err:
        print(f"podsrl eval: error: {err}", file=sys.stderr)
        return 2
    print(f"{summary['task']}: accuracy {100 * summary['accuracy']:.1f}% over {summary['prompts']} prompts x "
          f"{summary['samples_per_prompt']} samples (T={summary['temperature']}), "
          f"{100 * summary['answered']:.0f}% gave an answer, {summary['seconds']:.0f}s")
    print(f"samples: {summary['samples_file']}")
    return 0


def cmd_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="podsrl plot", description="Accuracy vs training time of runs.")
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--output", type=Path, default=Path("accuracy.png"))
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        if not (run_dir / "metrics.jsonl").is_file():
            print(f"podsrl plot: error: {run_dir}/metrics.jsonl not found", file=sys.stderr)
            return 2
    from podsrl.plot import plot_accuracy

    print(plot_accuracy(args.run_dirs, args.output))
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "plot": cmd_plot}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: podsrl {train,eval,plot} [options]\n\n"
              "  train   train a model (no options: the tiny demo run with PODS)\n"
              "  eval    accuracy of a model on a task's held-out split, with per-sample records\n"
              "  plot    plot accuracy vs training time of run directories\n\n"
              "`podsrl COMMAND --help` for the options of a command.", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())

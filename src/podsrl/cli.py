"""Command line: ``podsrl train|eval|compare [--config FILE.yaml] [--FIELD VALUE ...]``, ``podsrl plot``,
``podsrl export RUN_DIR OUTPUT_DIR`` and ``podsrl env``.

Every field of ``podsrl.trainer.config.Config`` is a ``--field`` option (``podsrl train --help``
lists them with their defaults and documentation).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import signal
import sys
from pathlib import Path

from podsrl.command_options import compare_parser, plan_parser

# The field table `podsrl train --help` prints, generated from podsrl.trainer.config.Config by
# scripts/config_table.py (tests/test_cli.py fails when it is stale): the config's modules
# import torch and transformers (seconds), and a command line must answer --help at once.
FIELD_TABLE = Path(__file__).with_name("config_fields.json")


def field_rows(config_type, eval_fields: frozenset[str] = frozenset()) -> list[dict]:
    """What the command line shows of each field of ``config_type``: its name, metavar,
    help and default, whether it is a flag (a bool: ``--resume`` alone = true), and whether
    ``podsrl eval`` reads it (among ``eval_fields``: it offers only those)."""
    return [{"name": f.name, "metavar": type(f.default).__name__.upper(), "flag": isinstance(f.default, bool),
             "help": f"{f.metadata['help']} (default: {f.default!r})", "eval": f.name in eval_fields}
            for f in dataclasses.fields(config_type)]


def _lazy(module: str, name: str):
    """``module.name``, imported when first called: a command's machinery (torch, transformers)
    loads when the command runs, not for ``--help`` or another command."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


train = _lazy("podsrl.trainer", "train")
run_eval = _lazy("podsrl.run_folder.eval_command", "run_eval")
export_run = _lazy("podsrl.run_folder.export", "export_run")
run_comparison = _lazy("podsrl.experiments.compare", "run_comparison")
analyze = _lazy("podsrl.experiments.compare", "analyze")
write_report = _lazy("podsrl.experiments.compare", "write_report")
plot_accuracy = _lazy("podsrl.experiments.plots", "plot_accuracy")
check_report_folder = _lazy("podsrl.experiments.report_files", "check_report_folder")
environment_report = _lazy("podsrl.provenance", "environment_report")
run_plan = _lazy("podsrl.experiments.plan", "run_plan")


def _config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--config", help="YAML file of config fields (command-line values override it).")
    for row in _offered(prog):
        # Values stay strings here; podsrl.trainer.config.parse_value converts them and names the
        # field on error, the same way for YAML and the command line.
        flag = dict(nargs="?", const="true") if row["flag"] else {}  # `--resume` alone = true
        parser.add_argument(f"--{row['name']}", dest=row["name"], default=None, metavar=row["metavar"],
                            help=row["help"], **flag)
    return parser


def _offered(prog: str) -> list[dict]:
    """The field table's rows a command offers as options: every field for train and compare,
    those evaluation reads for eval."""
    rows = json.loads(FIELD_TABLE.read_text(encoding="utf-8"))
    return [row for row in rows if row["eval"]] if prog == "podsrl eval" else rows


def _parse_config(argv: list[str], prog: str, description: str, beneath: dict | None = None):
    """Config from ``--config FILE`` and ``--field value`` options, or None after printing
    the error (which names the field). ``beneath``: values for fields neither sets."""
    parser = _config_parser(prog, description)
    args, unknown = parser.parse_known_args(argv)  # --help ends here, before the config's imports
    from podsrl.trainer.config import FIELDS, make_config, parse_value

    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    try:
        if unknown:
            name = unknown[0][2:].split("=")[0] if unknown[0].startswith("--") else ""
            if name in FIELDS:  # a field this command does not offer (eval: training's)
                raise ValueError(f"{name}: {prog} does not read it (a setting of training); its options: "
                                 f"{prog} --help")
            if name:  # raises "unknown config field", with a suggestion
                parse_value(name, None)
            raise ValueError(f"unexpected argument {unknown[0]!r}")
        return make_config(args.config, {**(beneath or {}), **overrides})
    except (ValueError, FileNotFoundError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return None


def cmd_train(argv: list[str]) -> int:
    cfg = _parse_config(argv, "podsrl train", "Train a causal LM with GRPO, GRPO-GA or PODS.")
    if cfg is None:
        return 2
    from podsrl.distributed import LaunchRefused
    from podsrl.trainer import TrainingStopped

    try:
        result = train(cfg)
    except TrainingStopped as stopped:
        print(f"podsrl train: {stopped}", file=sys.stderr)
        return 128 + stopped.signum if stopped.signum else 1
    except (ValueError, OSError, MemoryError) as err:  # data, model or memory-cap problems
        # refused alike by every process
        if not isinstance(err, LaunchRefused) or os.environ.get("RANK", "0") == "0":
            print(f"podsrl train: error: {err}", file=sys.stderr)
        return 2
    if not result.is_main:
        return 1 if result.failure else 0
    try:
        return _report_run(cfg, result)
    except KeyboardInterrupt:  # the run has finished and its files are written: only this report is cut short
        failure = f"; it learned nothing: {result.failure}" if result.failure else ""
        print(f"podsrl train: stopped by SIGINT after the run finished; its files are in {result.run_dir} "
              f"(accuracy.png may be missing){failure}", file=sys.stderr)
        return 130


def _report_run(cfg, result) -> int:
    """The finished run's accuracies, files and plot; its exit code (1: it learned nothing)."""
    init, final = result.initial, result.final
    print(f"held-out accuracy (sampled, T={cfg.eval_temperature}, {cfg.eval_samples} samples x "
          f"{result.eval_prompts} prompts): {100 * init['eval_accuracy']:.1f}% at step 0 -> "
          f"{100 * final['eval_accuracy']:.1f}% at step {result.steps} "
          f"({result.train_seconds / 60:.1f} min of training)")
    if "eval_greedy_accuracy" in final:
        print(f"held-out accuracy (greedy): {100 * init['eval_greedy_accuracy']:.1f}% -> "
              f"{100 * final['eval_greedy_accuracy']:.1f}%")
    plot = plot_accuracy([result.run_dir], result.run_dir / "accuracy.png",
                         title=f"{cfg.method} on {cfg.task} ({cfg.model})")
    print(f"run directory: {result.run_dir}")
    print(f"metrics:       {result.run_dir / 'metrics.jsonl'}")
    print(f"plot:          {plot}")
    if result.failure:  # the files are written (nothing lost), but the run is no success: say so, last
        print(f"podsrl train: error: {result.failure} (files kept in {result.run_dir})", file=sys.stderr)
        return 1
    return 0


def _given_fields(args: argparse.Namespace) -> set[str]:
    """The fields that parsed ``--FIELD`` options or their ``--config`` file (already read without
    error) set."""
    from podsrl.trainer.config import load_yaml

    given = {name for name, value in vars(args).items() if name != "config" and value is not None}
    return given | (set(load_yaml(args.config)) if args.config else set())


EVAL_DESCRIPTION = ("Accuracy of a model or a run's model/ folder on a task's held-out split; uses the eval_* fields "
                    "(eval_temperature 0 = greedy). A run's model/ is evaluated on the run's task, prompts and "
                    "max_completion_length (its config.json) unless options set them. Writes OUTPUT_DIR/eval/"
                    "TASK-samples.jsonl and TASK-summary.json (TASK-2-... beside an earlier eval's); --output_dir "
                    "default: runs/eval/MODEL-TASK.")


def cmd_eval(argv: list[str]) -> int:
    args, _ = _config_parser("podsrl eval", EVAL_DESCRIPTION).parse_known_args(argv)  # --help ends here
    from podsrl.run_folder import eval_command
    from podsrl.trainer.setup import task_options

    try:  # a run's folders that are not a model, before the config calls them unknown models
        if args.model:
            eval_command.check_eval_model(args.model)
    except ValueError as err:
        print(f"podsrl eval: error: {err}", file=sys.stderr)
        return 2
    cfg = _parse_config(argv, "podsrl eval", EVAL_DESCRIPTION)
    if cfg is None:
        return 2
    given = _given_fields(args)
    run = eval_command.run_of_model(cfg.model)
    terms = eval_command.run_terms(run, given) if run is not None else {}
    if terms:
        cfg = _parse_config(argv, "podsrl eval", EVAL_DESCRIPTION, beneath=terms)
        if cfg is None:
            return 2
    for line in eval_command.said_first(cfg, args.config, given, run, terms):
        print(line, file=sys.stderr)
    try:
        summary = run_eval(eval_command.with_output_dir(cfg, given), task_options(cfg))
    except (ValueError, OSError) as err:
        print(f"podsrl eval: error: {err}", file=sys.stderr)
        return 2
    print(f"{summary['task']}: accuracy {100 * summary['accuracy']:.1f}% over {summary['prompts']} prompts x "
          f"{summary['samples_per_prompt']} samples (T={summary['temperature']}), "
          f"{100 * summary['answered']:.0f}% gave an answer, {100 * summary['cut']:.0f}% cut at "
          f"max_completion_length {summary['max_completion_length']}, {summary['seconds']:.0f}s")
    print(f"samples: {summary['samples_file']}")
    return 0


def _ints(name: str, text: str, words: tuple[str, ...] = ()) -> list:
    """Comma-separated integers (and any of ``words`` as they are)."""
    from podsrl.trainer.config import split_list

    try:
        return [v if v in words else int(v) for v in split_list(text)]
    except ValueError:
        allowed = f" or {' / '.join(words)}" if words else ""
        raise ValueError(f"{name}: expected comma-separated integers{allowed}, got {text!r}") from None


def cmd_compare(argv: list[str]) -> int:
    args, rest = compare_parser().parse_known_args(argv)
    if "--output_dir" not in rest:
        rest += ["--output_dir", "runs/compare"]
    cfg = _parse_config(rest, "podsrl compare", "")
    if cfg is None:
        return 2
    from podsrl.experiments.compare import arm_configs, arm_specs, baseline_name, planned_arm_names
    from podsrl.trainer import TrainingStopped
    from podsrl.trainer.config import split_list

    try:
        if args.seeds < 1 or args.budget_minutes < 0 or args.budget_steps < 0:
            raise ValueError("seeds, budget_minutes and budget_steps: must be positive")
        if not (args.budget_minutes or args.budget_steps):
            raise ValueError("budget_minutes or budget_steps: give one (the same budget for every run)")
        n_values = _ints("n_values", args.n_values, ("auto",)) or [cfg.num_generations]
        m_values = _ints("m_values", args.m_values) or [cfg.num_kept]
        # the config's, not a default
        rules = arm_specs("downsampling_rule", args.rules) or [cfg.downsampling_rule]
        arms = arm_configs(cfg, split_list(args.methods), rules, n_values, m_values,
                           arm_specs("prompt_selector", args.prompt_selectors),
                           arm_specs("dynamic_sampling", args.dynamic_sampling),
                           arm_specs("partial_rollouts", args.partial_rollouts),
                           arm_specs("learning_rate", args.learning_rates))
        # a baseline that names no arm: refused now
        baseline_name(planned_arm_names(cfg, arms), args.baseline)
        # before any run: the report must not overwrite a user's file
        check_report_folder(Path(cfg.output_dir))
        run_dirs = run_comparison(cfg, arms, args.seeds, args.budget_minutes, Path(cfg.output_dir),
                                  budget_steps=args.budget_steps)
        result = analyze(run_dirs, baseline=args.baseline or None)
    except TrainingStopped as stopped:  # a signal or a failed reward: the run checkpointed; re-running resumes it
        print(f"podsrl compare: {stopped} (in a comparison: re-run the same compare command, "
              "which resumes it)", file=sys.stderr)
        return 128 + stopped.signum if stopped.signum else 1
    except (ValueError, OSError) as err:
        print(f"podsrl compare: error: {err}", file=sys.stderr)
        return 2
    return _report(result, Path(cfg.output_dir), "compare")


def cmd_plan(argv: list[str]) -> int:
    args, rest = plan_parser().parse_known_args(argv)
    cfg = _parse_config(rest, "podsrl plan", "")
    if cfg is None:
        return 2
    from podsrl.trainer import TrainingStopped

    try:
        print(run_plan(cfg, args.json, args.probe_steps))
    except TrainingStopped as stopped:  # a probe run stopped (a signal, a reward that failed): nothing is kept
        print(f"podsrl plan: {stopped}; the probe's runs are not kept: run podsrl plan again", file=sys.stderr)
        return 128 + stopped.signum if stopped.signum else 1
    except (ValueError, OSError) as err:
        print(f"podsrl plan: error: {err}", file=sys.stderr)
        return 2
    return 0


def cmd_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="podsrl plot", description="Figures and the speedup table of `podsrl compare` from existing run "
                                        "directories (or folders holding them); runs with the same method, "
                                        "rule, n and m are seeds of one arm.")
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--output_dir", type=Path, default=Path("plots"))
    parser.add_argument("--baseline", default="")
    args = parser.parse_args(argv)
    found, seen = [], {}
    for path in args.run_dirs:
        runs = [p.parent for p in sorted(path.rglob("metrics.jsonl"))] if path.is_dir() else []
        if not runs:
            print(f"podsrl plot: error: no run (metrics.jsonl) found in {path}", file=sys.stderr)
            return 2
        for run in runs:  # one run named twice (a link, a folder and its parent) would count as two seeds
            first = seen.setdefault(run.resolve(), run)
            if first is run:
                found.append(run)
            else:
                print(f"podsrl plot: {run} is the run {first} again: counted once", file=sys.stderr)
    try:
        check_report_folder(args.output_dir)
        result = analyze(found, baseline=args.baseline or None,
                         left_out=lambda line: print(f"podsrl plot: {line}", file=sys.stderr))
    except (ValueError, OSError) as err:
        print(f"podsrl plot: error: {err}", file=sys.stderr)
        return 2
    return _report(result, args.output_dir, "plot")


def export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="podsrl export", allow_abbrev=False,
        description="Write a finished run's model as a standalone Hugging Face folder: weights that load with "
                    "AutoModelForCausalLM.from_pretrained (a LoRA adapter merged into its base: no peft needed), "
                    "the tokenizer with its chat template, and a model card (README.md).")
    parser.add_argument("run_dir", type=Path, help="the run directory (podsrl train --output_dir)")
    parser.add_argument("output_dir", type=Path, help="the folder to write (must not exist or be empty)")
    parser.add_argument("--checkpoint", default="", help="export this checkpoint (a path, or a name in "
                                                         "RUN_DIR/checkpoints) instead of the final model")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier podsrl export")
    return parser


def cmd_export(argv: list[str]) -> int:
    args = export_parser().parse_args(argv)
    try:
        output = export_run(args.run_dir, args.output_dir, checkpoint=args.checkpoint or None,
                            overwrite=args.overwrite)
    except (ValueError, OSError) as err:
        print(f"podsrl export: error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.run_dir} to {output} (model card: {output / 'README.md'})")
    return 0


def cmd_env(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="podsrl env", description="Versions and machine, to paste into a bug "
                                                           "report.").parse_args(argv)
    print(environment_report())
    return 0


def _report(result: dict, output_dir: Path, command: str) -> int:
    try:
        paths = write_report(result, output_dir)
    except (ValueError, OSError) as err:  # a report file became the user's while the runs ran, a full disk
        kept = (f"; the runs are kept: `podsrl plot {output_dir} --output_dir OTHER` writes the report elsewhere"
                if command == "compare" else "")
        print(f"podsrl {command}: error: {err}{kept}", file=sys.stderr)
        return 2
    print(paths["table"].read_text())
    print(f"plots: {paths['accuracy']} {paths['step_time']}")
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "compare": cmd_compare, "plan": cmd_plan, "plot": cmd_plot,
            "export": cmd_export, "env": cmd_env}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: podsrl {train,eval,compare,plan,plot,export,env} [options]\n\n"
              "  train   train a model (no options: the tiny demo run with PODS)\n"
              "  eval    accuracy of a model on a task's held-out split, with per-sample records\n"
              "  compare run methods x seeds with equal time budgets; curves, step times, speedups\n"
              "  plan    what a step of each method costs here, and when PODS pays (a probe of minutes)\n"
              "  plot    the figures and table of `compare` from existing run directories\n"
              "  export  a run's model as a standalone Hugging Face folder with a model card\n"
              "  env     versions and machine, for bug reports\n\n"
              "`podsrl COMMAND --help` for the options of a command.", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    # a Ctrl-C that no command handles (a run handles its own): one line
    except KeyboardInterrupt as interrupted:
        signum = getattr(interrupted, "signum", signal.SIGINT)
        print(f"podsrl {argv[0]}: stopped by {signal.Signals(signum).name}; {INTERRUPTED[argv[0]]}",
              file=sys.stderr)
        return 128 + signum


# what a command interrupted outside a training run leaves, and what to do
INTERRUPTED = {
    "train": "the run had not begun, nothing was written: run the same command again",
    "eval": "its results are written only at its end: run the same command again",
    "compare": "finished runs are kept and a stopped one checkpointed: re-run the same command, which reuses them",
    "plan": "the probe's runs are not kept: run the same command again",
    "plot": "figures are written only at its end: run the same command again",
    "export": "nothing was exported (an export is written beside its folder and renamed into place at the end)",
    "env": "nothing was written",
}


if __name__ == "__main__":
    raise SystemExit(main())

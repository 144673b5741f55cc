"""The options of the commands that take more than the config's fields (``podsrl compare``, ``podsrl
plan``): their own arguments, parsed first; the rest of the command line sets the config as
``podsrl train``'s does. Imports nothing heavy: ``--help`` answers at once."""

from __future__ import annotations

import argparse


def compare_parser() -> argparse.ArgumentParser:
    """`podsrl compare`'s own options (the arms, seeds and budget); the rest set the shared config."""
    parser = argparse.ArgumentParser(
        prog="podsrl compare", allow_abbrev=False,
        description="Run arms (methods x rules x n x m) x seeds with the same training-time budget, interleaved "
                    "(seed by seed, the arms' order alternating) so machine drift is not confounded with an arm, "
                    "then plot accuracy vs time (mean, 95% band), seconds per step (inference vs update) "
                    "and a speedup table. Any `podsrl train` option (--config, --FIELD VALUE) sets the shared "
                    "config; --output_dir is the comparison folder. Re-running reuses finished runs.")
    parser.add_argument("--methods", default="grpo,grpo-ga,pods")
    parser.add_argument("--rules", default="", help="downsampling rules of pods, comma-separated: names, or JSON "
                                                    "mappings {\"name\": ..., ARGUMENT: VALUE} (default: the config's "
                                                    "downsampling_rule)")
    parser.add_argument("--n_values", default="", help="num_generations (n) values, comma-separated; 'auto' = "
                                                        "adaptive_n starting at the config's n (default: the "
                                                        "config's)")
    parser.add_argument("--m_values", default="", help="num_kept (m) values, comma-separated (default: the config's)")
    parser.add_argument("--prompt_selectors", default="", help="prompt selectors, comma-separated (names or JSON "
                                                                "mappings): each arm runs once per selector "
                                                                "(default: the config's)")
    parser.add_argument("--dynamic_sampling", default="", help="'false,true': each arm runs without and with "
                                                                "dynamic sampling (default: the config's)")
    parser.add_argument("--partial_rollouts", default="", help="'false,true': each arm runs without and with "
                                                                "partial rollouts (default: the config's)")
    parser.add_argument("--learning_rates", default="", help="learning rates, comma-separated: each arm runs once "
                                                              "per rate, a sweep whose reports name each arm with "
                                                              "its rate (default: the config's)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget_minutes", type=float, default=0.0, help="training time per run")
    parser.add_argument("--budget_steps", type=int, default=0,
                        help="optimizer steps per run instead (or as well: a run stops at whichever comes first); "
                             "the paper's per-step comparison, where a slower arm still gets every step")
    parser.add_argument("--baseline", default="", help="arm name or method of the speedup baseline")
    return parser


def plan_parser() -> argparse.ArgumentParser:
    """`podsrl plan`'s own options; the rest set the config the probe trains, as `podsrl train`'s."""
    parser = argparse.ArgumentParser(
        prog="podsrl plan", allow_abbrev=False,
        description="What a step of GRPO m/m, GRPO-GA n and PODS n -> m costs on this machine, with this config "
                    "(any `podsrl train` option, --config, --FIELD VALUE): a probe trains each method for a few "
                    "steps at the config's shapes (minutes), measures the seconds of a generated rollout, of a "
                    "trained rollout and of a step's fixed part, and prints each method's predicted step over a "
                    "grid of n and m, the per-step learning PODS needs to be as soon as each baseline, the ratios "
                    "podsrl has measured, and a recommendation (docs/reproducing.md).")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (its 'methods' list: a row "
                                                            "per method and n, m with step_seconds)")
    parser.add_argument("--probe_steps", type=int, default=2, help="steps each method is timed for, after one "
                                                                   "warm-up step (default: 2)")
    return parser

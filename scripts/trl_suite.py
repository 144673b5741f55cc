"""Run TRL's own GRPO test file against PODSTrainer, offline, and print the pass/fail table.

    python scripts/trl_suite.py TRL_REPO [--modes grpo,pods_m_eq_n,pods_m_lt_n] [--work DIR]
                                         [--report FILE] [-k EXPR] [--timeout SECONDS]

TRL_REPO is a local copy of TRL's repository (its ``tests/`` folder is not in TRL's sdist,
and podsrl does not copy it). The test file runs three times, in a scratch folder:
- ``grpo``: as written, GRPOTrainer (the baseline);
- ``pods_m_eq_n``: the file's ``GRPOTrainer`` / ``GRPOConfig`` replaced by PODSTrainer /
  PODSConfig, num_kept = num_generations;
- ``pods_m_lt_n``: the same with num_kept < num_generations: the smallest m >= 2 that the
  batch arithmetic accepts (m = n where none does, e.g. n = 2; the table says which m ran).
Hub models and datasets are replaced by local stand-ins of the same names
(:mod:`podsrl.build.chat_standins`); tests that need what has no stand-in (VLMs, GPUs, vLLM,
hub token ids unless --scripted-ids) fail or skip in every mode. Packages the tests need that podsrl does not
(jmespath) go into the scratch folder, not the environment. Exit status 1 when a test that
passes with GRPOTrainer does not pass with PODSTrainer at num_kept = n.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

MODES = ("grpo", "pods_m_eq_n", "pods_m_lt_n")
TEST_FILE = "tests/test_grpo_trainer.py"
PLUGIN_FILE = "podsrl_trl_suite_plugin.py"  # also marks a scratch folder as this script's
EXTRA_PACKAGES = {"jmespath": "jmespath"}  # module -> requirement: TRL's tool tests skip without it

# Loaded by pytest in the scratch folder (-p): swaps the test module's trainer and config.
PLUGIN = '''
import importlib, json, os
from podsrl.trl import PODSConfig, PODSTrainer

MODE, LOG = os.environ["PODSRL_TRL_SUITE_MODE"], os.environ["PODSRL_TRL_SUITE_LOG"]


def _absent_feature(name):
    """A test file newer than the installed TRL asks for is_<x>_available checks this TRL
    lacks: the feature is absent, so the tests that need it skip."""
    if name.startswith("is_") and name.endswith("_available"):
        print(f"trl_suite: {name} is not in the installed TRL: treated as unavailable")
        return lambda *args, **kwargs: False
    raise AttributeError(name)


importlib.import_module("trl.import_utils").__getattr__ = _absent_feature


class FewerKeptConfig(PODSConfig):
    """num_kept < num_generations: the smallest m >= 2 whose kept rows split into the micro-batches."""

    def __post_init__(self):
        super().__post_init__()
        n, steps = self.num_generations, self.steps_per_generation
        groups = self.per_device_train_batch_size * steps // n
        fits = [m for m in range(2, n) if groups * m % steps == 0]
        self.num_kept = fits[0] if fits else n
        with open(LOG, "a") as fh:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            fh.write(json.dumps({"test": test, "n": n, "m": self.num_kept}) + "\\n")


def pytest_collection_modifyitems(session, config, items):
    if MODE == "grpo":
        return
    for module in {item.module for item in items}:
        if hasattr(module, "GRPOTrainer"):
            module.GRPOTrainer = PODSTrainer
            module.GRPOConfig = FewerKeptConfig if MODE == "pods_m_lt_n" else PODSConfig
'''


def prepare(trl_repo: Path, work: Path, scripted_ids: bool) -> None:
    """Copy TRL's tests into ``work``, build the stand-ins there, add missing test packages."""
    if not (trl_repo / TEST_FILE).is_file():
        sys.exit(f"trl_suite: {trl_repo / TEST_FILE} not found: TRL_REPO must be a copy of TRL's repository")
    shutil.copytree(trl_repo / "tests", work / "tests", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("distributed", "experimental", "__pycache__"))
    (work / PLUGIN_FILE).write_text(PLUGIN)
    from podsrl.build.chat_standins import build_standins

    build_standins(work, scripted_ids=scripted_ids)
    missing = [req for module, req in EXTRA_PACKAGES.items()
               if importlib.util.find_spec(module) is None and not (work / "site" / module).exists()]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(work / "site"), *missing],
                       check=True)


def run_mode(mode: str, work: Path, select: str | None, timeout: float) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, first line of the reason)} of one run of the test file."""
    report, log = work / f"{mode}.xml", work / f"{mode}.kept.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "PODSRL_TRL_SUITE_MODE": mode, "PODSRL_TRL_SUITE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(work), str(work / "site"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", TEST_FILE, "-p", PLUGIN_FILE.removesuffix(".py"),
               "-p", "no:cacheprovider", "-q", "--no-header", "-rN", f"--junitxml={report}"]
    command += ["-k", select] if select else []
    try:
        subprocess.run(command, cwd=work, env=env, timeout=timeout, stdout=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        print(f"trl_suite: mode {mode} ran past {timeout:.0f} s; its unfinished tests count as not passed")
    return parse_junit(report) if report.exists() else {}


def parse_junit(report: Path) -> dict[str, tuple[str, str]]:
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                text = (node.get("message") or node.text or "").strip()
                reason = text.splitlines()[0][:160] if text else ""
                break
        results[test] = (outcome, reason)
    return results


def kept_per_test(work: Path) -> dict[str, str]:
    """{test id: "n->m"} from the pods_m_lt_n run's config log."""
    log, kept = work / "pods_m_lt_n.kept.jsonl", {}
    for line in log.read_text().splitlines() if log.exists() else []:
        row = json.loads(line)
        test = row["test"].split("::", 1)[-1]
        kept[test] = f"{row['n']}->{row['m']}"
    return kept


def table(results: dict[str, dict], kept: dict[str, str]) -> list[str]:
    modes = [m for m in MODES if m in results]
    tests = sorted(set().union(*(r.keys() for r in results.values())))
    lines = ["| test | " + " | ".join(modes) + " | n->m |", "|" + " --- |" * (len(modes) + 2)]
    for test in tests:
        cells = [results[m].get(test, ("not run", ""))[0] for m in modes]
        lines.append(f"| {test} | " + " | ".join(cells) + f" | {kept.get(test, '')} |")
    return lines


def summary(results: dict[str, dict]) -> tuple[list[str], int]:
    """Counts per mode, and every test that passes with GRPOTrainer but not with PODSTrainer."""
    lines, regressions = [], 0
    for mode, outcomes in results.items():
        counts = {o: sum(1 for v in outcomes.values() if v[0] == o) for o in ("passed", "failed", "error", "skipped")}
        lines.append(f"{mode}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    baseline = {t for t, (o, _) in results.get("grpo", {}).items() if o == "passed"}
    for mode in ("pods_m_eq_n", "pods_m_lt_n"):
        if mode not in results or "grpo" not in results:
            continue
        lost = sorted(t for t in baseline if results[mode].get(t, ("not run",))[0] != "passed")
        lines.append(f"{mode}: passes {len(baseline) - len(lost)} of the {len(baseline)} tests GRPOTrainer passes")
        for test in lost:
            outcome, reason = results[mode].get(test, ("not run", ""))
            lines.append(f"  {test}: {outcome}: {reason}")
        regressions += len(lost) if mode == "pods_m_eq_n" else 0
    return lines, regressions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trl_repo", type=Path)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one, kept)")
    parser.add_argument("--report", type=Path, help="also write the table and summary here (markdown)")
    parser.add_argument("-k", dest="select", help="pytest -k expression: run only these tests")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per mode")
    parser.add_argument("--scripted-ids", action="store_true",
                        help="give the Qwen3 / Qwen3-MoE stand-ins Qwen's token ids, so that TRL's tool and "
                             "environment tests (which write those ids by hand) can pass; slow: up to 13 min per test "
                             "on 2 cores. Use a new --work folder when switching")
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    import trl

    version_file = args.trl_repo / "VERSION"
    repo_version = version_file.read_text().strip() if version_file.exists() else "unknown"
    print(f"TRL installed {trl.__version__}; tests from {args.trl_repo} (version {repo_version})")
    if args.work and args.work.is_dir() and any(args.work.iterdir()) and not (args.work / PLUGIN_FILE).exists():
        parser.error(f"--work: {args.work} is not empty and is not a folder this script made; its files could be "
                     "overwritten. Name a new or empty folder")
    work = args.work or Path(tempfile.mkdtemp(prefix="podsrl-trl-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare(args.trl_repo, work, args.scripted_ids)
    results = {mode: run_mode(mode, work, args.select, args.timeout) for mode in modes}
    lines = table(results, kept_per_test(work))
    notes, regressions = summary(results)
    print("\n".join(lines + [""] + notes))
    if args.report:
        args.report.write_text("\n".join([f"TRL installed {trl.__version__}; tests version {repo_version}", ""]
                                         + lines + ["", "```"] + notes + ["```", ""]))
    print(f"scratch folder: {work}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())

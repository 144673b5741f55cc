"""Several ``podsrl train`` runs in one ``accelerate launch`` (tests/test_distributed.py): each
launch costs the launcher's and every process's start (imports, the process group) before any
training, so the runs that share a launcher setup share one launch.

    accelerate launch ... -m tests.distributed_jobs JOBS.json

JOBS.json is a list of ``{"name": ..., "argv": [...], "output_dir": ..., "report": PATH}``; each
process runs the jobs in order with ``podsrl.cli.main(["train", *argv])`` and writes
``PATH.rankN.json``: the exit code, what the job printed, and the checkpoints its folder held
when it ended. A job that escapes the command line's own handling (a
traceback) ends the process, so the launcher ends the others instead of leaving them waiting
in a collective; the jobs after it have no report.
"""

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

from podsrl.cli import main


def run_jobs(jobs: list[dict]) -> None:
    rank = os.environ.get("RANK", "0")
    for job in jobs:
        out, err = io.StringIO(), io.StringIO()
        crashed = False
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["train", *job["argv"]])
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
            except BaseException:  # the report says what it was
                traceback.print_exc()
                code, crashed = 1, True
        checkpoints = Path(job["output_dir"]) / "checkpoints"  # as the job left them (a later job may add some)
        report = {"name": job["name"], "returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                  "checkpoints": sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else []}
        Path(f"{job['report']}.rank{rank}.json").write_text(json.dumps(report))
        if crashed:
            os._exit(1)


if __name__ == "__main__":
    run_jobs(json.loads(Path(sys.argv[1]).read_text()))

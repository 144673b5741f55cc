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
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

from podsrl.cli import main


@contextlib.contextmanager
def captured(fd: int) -> Iterator[list[str]]:
    """What is written to file descriptor ``fd`` (1 or 2) inside the block, appended to the list
    yielded once the block ends. The descriptor itself is redirected, not ``sys.stdout``: an engine
    may ask a stream for its ``fileno()`` (vLLM does), and its C code writes to the descriptor."""
    stream = sys.stdout if fd == 1 else sys.stderr
    text: list[str] = []
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+") as file:
        stream.flush()
        os.dup2(file.fileno(), fd)
        try:
            yield text
        finally:
            stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            file.seek(0)
            text.append(file.read())


def run_jobs(jobs: list[dict]) -> None:
    rank = os.environ.get("RANK", "0")
    for job in jobs:
        crashed = False
        with captured(1) as out, captured(2) as err:
            try:
                code = main(["train", *job["argv"]])
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
            except BaseException:  # the report says what it was
                traceback.print_exc()
                code, crashed = 1, True
        checkpoints = Path(job["output_dir"]) / "checkpoints"  # as the job left them (a later job may add some)
        report = {"name": job["name"], "returncode": code, "stdout": "".join(out), "stderr": "".join(err),
                  "checkpoints": sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else []}
        Path(f"{job['report']}.rank{rank}.json").write_text(json.dumps(report))
        if crashed:
            os._exit(1)


if __name__ == "__main__":
    run_jobs(json.loads(Path(sys.argv[1]).read_text()))

"""The run's thread count follows the cores other processes leave free (podsrl.trainer.cores, #80):
measured from /proc/stat less the run's own CPU time, kept where the user fixed it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from podsrl.trainer import cores
from podsrl.trainer.cores import CoreShare


class FakeMachine:
    """/proc/stat of a machine whose cores 0..N-1 are busy as the test says, a clock and this
    process's CPU seconds."""

    def __init__(self, tmp_path, monkeypatch, count: int) -> None:
        self.path, self.count = tmp_path / "stat", count
        self.busy = [0.0] * count  # seconds each core was busy
        self.now, self.own = 100.0, 0.0
        monkeypatch.setattr(cores, "PROC_STAT", self.path)
        monkeypatch.setattr(cores, "available_cores", lambda: list(range(count)))
        monkeypatch.setattr(cores, "own_seconds", lambda: self.own)
        monkeypatch.setattr(cores.time, "monotonic", lambda: self.now)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        self.write()

    def write(self) -> None:
        ticks = [round(b * cores.TICKS) for b in self.busy]
        lines = [f"cpu {sum(ticks)} 0 0 999 0 0 0 0 0 0"]
        # user nice system idle iowait irq softirq steal guest guest_nice: busy split over user and system
        lines += [f"cpu{i} {t // 2} 0 {t - t // 2} 999 7 0 0 0 0 0" for i, t in enumerate(ticks)]
        self.path.write_text("\n".join(lines + ["intr 0", "procs_running 1"]) + "\n")

    def run(self, seconds: float, others: float, own: float) -> None:
        """``seconds`` pass with other processes using ``others`` cores and the run ``own`` cores."""
        self.now += seconds
        self.own += own * seconds
        for i in range(self.count):  # spread over the cores: only the total is measured
            self.busy[i] += (others + own) * seconds / self.count
        self.write()


@pytest.mark.parametrize("count, others, threads", [(2, 0.0, 2), (2, 0.3, 2), (2, 1.0, 1), (2, 3.0, 1),
                                                    (8, 1.0, 7), (8, 2.6, 5), (4, 0.6, 3)])
def test_the_threads_are_the_cores_others_leave_free(tmp_path, monkeypatch, count, others, threads):
    machine = FakeMachine(tmp_path, monkeypatch, count)
    share = CoreShare()
    machine.run(2.0, others, own=max(0.5, count - others))  # the run takes what is left, or a share
    assert share.follow() == threads == torch.get_num_threads()
    assert share.others == pytest.approx(others, abs=0.01)


def test_it_follows_a_competitor_that_starts_and_ends_mid_run(tmp_path, monkeypatch):
    machine = FakeMachine(tmp_path, monkeypatch, 2)
    share = CoreShare()
    counts = []
    for others in (0.0, 1.0, 1.0, 0.0):
        machine.run(0.5, others, own=2.0 - others)
        counts.append(share.follow())
    assert counts == [2, 1, 1, 2]
    machine.run(0.01, 1.0, own=1.0)  # too short an interval to judge: the count stays
    assert share.follow() == 2


def test_a_count_the_user_fixed_is_kept(tmp_path, monkeypatch):
    machine = FakeMachine(tmp_path, monkeypatch, 2)
    share = CoreShare(fixed=2)
    machine.run(1.0, 1.0, own=1.0)
    assert share.follow() == 2 == torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    share = CoreShare()
    machine.run(1.0, 1.0, own=1.0)
    assert share.follow() == 2


def test_without_proc_stat_torchs_count_stands(tmp_path, monkeypatch):
    machine = FakeMachine(tmp_path, monkeypatch, 2)
    machine.path.unlink()
    torch.set_num_threads(2)
    share = CoreShare()
    machine.now += 1.0
    assert share.follow() == 2


@pytest.mark.skipif(not cores.PROC_STAT.exists() or len(cores.available_cores()) < 2, reason="needs Linux, 2 cores")
def test_a_busy_process_beside_the_run_takes_one_thread_away(monkeypatch):
    """The real /proc/stat: a child spinning on one core while this process sleeps."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spin = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"  # ends by itself, whatever happens
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)  # the child is up
        share = CoreShare()
        time.sleep(0.6)
        # the child is this process's: measured as its own, it takes nothing from the run's share
        assert share.follow() == len(cores.available_cores())
        monkeypatch.setattr(cores, "running_children_seconds", lambda: 0.0)  # as if another process's
        share = CoreShare()
        time.sleep(0.6)
        assert share.follow() == len(cores.available_cores()) - 1
        assert 0.6 < share.others < 1.4
    finally:
        busy.kill()
        busy.wait()

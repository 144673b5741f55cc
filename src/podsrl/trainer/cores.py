"""How many threads torch runs on: the cores other processes leave free, measured (#80).

Torch's intra-op threads meet at a barrier after each parallel operation. When another process
holds one of the cores, the thread that shares it waits for the scheduler, and every small
operation pays a time slice: on the 2-core AVX2 EPYC the main job's step took 0.26 s alone and
1.00 s beside one busy process with 2 threads, 0.38 s with 1 (2.38 s and 0.58 s beside three;
benchmarks/RESULTS.md, "A run that shares the machine"). OpenMP's passive wait policy avoided
the spinning but cost 1.7x alone (0.45 s), so the wait policy stays libgomp's and the thread
count follows the free cores instead.

Measured from /proc/stat (Linux): the busy time of the cores this process may run on, less this
process's own CPU time (its threads, and its children's: the reward worker runs while the run
waits for it), over an interval: the cores others keep busy, rounded. Set once the
run is set up and again after every step (the interval: since the last), so a competitor that
starts or ends mid-run is followed within a step. A count fixed by the user (``torch_threads``
> 0, or ``OMP_NUM_THREADS``) is kept as it is. Where /proc/stat cannot be read it leaves torch's
count alone. Floating-point results can differ with the thread count (a parallel reduction
splits its sum by threads): a run that must repeat bit for bit fixes it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from podsrl.options import NON_NEGATIVE, option

PROC_STAT = Path("/proc/stat")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit, per second


@dataclass(frozen=True)
class ThreadOptions:
    """How many threads torch's operations run on (the config's field of this name)."""

    torch_threads: int = option(0, "Threads of torch's operations: 0 = the cores other processes leave free, "
                                   "measured after set-up and after every step (OMP_NUM_THREADS, when set, "
                                   "is kept); N = always N. A process beside busy ones waits at every "
                                   "operation's barrier (docs/reliability.md).", NON_NEGATIVE)


def available_cores() -> list[int]:
    """The cores this process may run on."""
    return (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else list(range(os.cpu_count() or 1)))


def busy_seconds(cores: list[int]) -> float | None:
    """Seconds the ``cores`` have spent busy since boot (every state but idle and iowait), or
    None where /proc/stat cannot be read."""
    wanted = {f"cpu{core}" for core in cores}
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, *ticks = line.split()
        if name in wanted:
            values = [int(tick) for tick in ticks[:8]]  # user nice system idle iowait irq softirq steal
            busy += sum(values) - values[3] - values[4]
    return busy / TICKS


def own_seconds() -> float:
    """CPU seconds this process (every thread) and its children have used: the ended ones the
    kernel has summed, and the running ones (the reward worker) read from /proc."""
    times = os.times()
    return (times.user + times.system + times.children_user + times.children_system
            + running_children_seconds())


def running_children_seconds() -> float:
    """CPU seconds of this process's running children (0 where /proc does not list them)."""
    ticks = 0
    try:
        for task in Path("/proc/self/task").iterdir():
            for pid in (task / "children").read_text().split():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, ValueError, IndexError):  # a child that ended meanwhile, or no /proc
        pass
    return ticks / TICKS


class CoreShare:
    """The run's thread count: ``fixed`` (> 0) always, else the cores other processes left free
    over the last interval (:meth:`follow`), at least one."""

    @classmethod
    def of(cls, options: ThreadOptions) -> CoreShare:
        """The run's, from its settings (``torch_threads``); its measurement begins now."""
        return cls(options.torch_threads)

    def __init__(self, fixed: int = 0) -> None:
        self.cores = available_cores()
        if not fixed and os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
            fixed = int(os.environ["OMP_NUM_THREADS"])
        self.fixed = fixed
        self.others = 0.0  # cores other processes kept busy over the last interval
        self.last = self._sample()
        if fixed and fixed != torch.get_num_threads():
            torch.set_num_threads(fixed)

    def _sample(self) -> tuple[float, float, float] | None:
        busy = busy_seconds(self.cores)
        return None if busy is None else (time.monotonic(), busy, own_seconds())

    def follow(self) -> int:
        """Measure the interval since the last call (or since it was made) and set torch's thread
        count for what comes next; returns the count."""
        if self.fixed:
            return self.fixed
        now = self._sample()
        if now is None or self.last is None:  # not Linux: torch's own choice stands
            return torch.get_num_threads()
        (start, busy, own), (end, busy_now, own_now) = self.last, now
        self.last = now
        if end - start < 0.05:  # too short to say anything
            return torch.get_num_threads()
        self.others = max(0.0, (busy_now - busy) - (own_now - own)) / (end - start)
        threads = max(1, len(self.cores) - int(self.others + 0.5))
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads

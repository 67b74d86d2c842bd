"""How fast each rank works, so that each gets a share of the work in proportion.

The ranks of one job need not be equally fast: a virtual machine's CPUs may share cores with
other guests, a node may run other jobs, cores of one chip clock differently. An even split
waits for the slowest rank. On the 16-CPU device machine one Python loop ran 1.0x to 1.8x as
long on one CPU as on another, alone, and the 16 ranks' input loading split the same way
(benchmarks/RESULTS.md, issue #19).

So each rank times a short fixed loop at the start (:func:`probe`, ~30 ms), the times are
all-gathered, and :func:`.exchange.split_even` gives each rank a share of the input bytes
(read and statistics) in proportion to its speed. How fast each rank then read its share
(bytes a second, gathered with the profiles' briefs) gives the speeds for cct.db's contexts
(:func:`read_speeds`). Any contiguous
split in rank order writes the same bytes (:mod:`.pipeline`), so this changes only who does
what, never the database.

``PYHPCTK_PYPROF_SPEEDS``: ``even`` for equal shares (no probe), or one relative speed per rank,
comma-separated (``1,1,0.5,...``), to repeat a split.
"""

from __future__ import annotations

import os
import time

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.comm import Comm
from pyhpctk.errors import UsageError

SPEEDS_ENV = "PYHPCTK_PYPROF_SPEEDS"

PROBE_ROUNDS = 10
"""Rounds of one timing of :func:`probe`'s loop (about 1 ms each on the device machine's
faster CPUs); :data:`PROBE_TIMES` timings, their median kept. A timing must span several of
the scheduler's time slices (a few ms each) to see a CPU that another process shares: timings
of 4 ms missed a busy loop on the rank's CPU that halved its speed (benchmarks/RESULTS.md)."""

PROBE_TIMES = 3

SPEED_RANGE = (0.5, 2.0)
"""Speeds against the median are clipped to this: a probe disturbed by chance cannot give a
rank more than twice, or less than half, the median share."""

DEAD_BAND = 0.1
"""Speeds within this of the median's count as the median's: among equal ranks the probes'
noise moves no work (at scale, the one rank given more than its share sets the wall)."""


def probe(rounds: int = PROBE_ROUNDS, times: int = PROBE_TIMES) -> float:
    """Seconds of wall time for a fixed interpreter loop, the median of ``times`` timings (wall,
    not CPU: a CPU that another guest shares runs the loop for as long, but the rank waits for
    it; the median, so that one preemption does not count)."""
    walls = []
    for _ in range(times):
        start = time.perf_counter()
        total = 0
        for _ in range(rounds):
            for i in range(10_000):
                total += i * i & 0xFF
        walls.append(time.perf_counter() - start)
    return float(np.median(walls))


def parse_speeds(setting: str, ranks: int) -> npt.NDArray[np.float64] | None:
    """``PYHPCTK_PYPROF_SPEEDS``' value: the speeds it fixes, or None (measure them)."""
    setting = setting.strip()
    if not setting:
        return None
    if setting == "even":
        return np.ones(ranks, dtype=np.float64)
    try:
        speeds = np.array([float(part) for part in setting.split(",")], dtype=np.float64)
    except ValueError:
        speeds = np.zeros(0)
    if len(speeds) != ranks or not np.all(np.isfinite(speeds)) or np.any(speeds <= 0):
        raise UsageError(
            f"{SPEEDS_ENV}={setting!r}: give 'even' or {ranks} positive numbers, one per rank, "
            "separated by commas"
        )
    return speeds


def rank_speeds(comm: Comm) -> npt.NDArray[np.float64]:
    """Every rank's relative speed (the median rank's is 1), the same array on every rank; a
    collective when measured. One rank: 1."""
    if comm.size == 1:
        return np.ones(1, dtype=np.float64)
    fixed = parse_speeds(os.environ.get(SPEEDS_ENV, ""), comm.size)
    if fixed is not None:
        return fixed
    seconds = np.array(comm.allgather(probe()), dtype=np.float64)
    return _relative(1.0 / np.maximum(seconds, 1e-9))


MIN_READ_BYTES = 8 << 20
"""A rank's share of the input below which its reading rate is too short a measure to use."""


def read_speeds(
    probed: npt.NDArray[np.float64] | None, rates: list[float], per_rank: float
) -> npt.NDArray[np.float64] | None:
    """Speeds from how fast each rank read its share (bytes a second), for the splits after
    the read (cct.db's owners): a measure of the real work over the whole read, where the probe
    timed a loop at the start. ``probed`` stays when the speeds are fixed
    (``PYHPCTK_PYPROF_SPEEDS``), when there is one rank, or when the shares are too small
    (``per_rank`` bytes, under :data:`MIN_READ_BYTES`) or some rank read nothing."""
    if probed is None or len(rates) <= 1 or os.environ.get(SPEEDS_ENV, "").strip():
        return probed
    observed = np.asarray(rates, dtype=np.float64)
    if per_rank < MIN_READ_BYTES or not np.all(observed > 0):
        return probed
    return _relative(observed)


def _relative(speeds: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Against the median, within the dead band equal, clipped (module docstring)."""
    speeds = speeds / float(np.median(speeds))
    speeds[np.abs(speeds - 1.0) <= DEAD_BAND] = 1.0
    clipped: npt.NDArray[np.float64] = np.clip(speeds, *SPEED_RANGE)
    return clipped


__all__ = ["SPEEDS_ENV", "parse_speeds", "probe", "rank_speeds", "read_speeds"]

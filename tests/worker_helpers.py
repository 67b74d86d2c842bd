"""A measurement of one Python process whose two lines call OpenBLAS, and OpenBLAS's worker.

Written node by node with pyhpctk's own writers (:mod:`measurement_helpers`), so the truth is
known exactly. The main thread (thread 0) runs, at module level of ``/work/app.py``:

* line 10: the matrix product ``A`` (numpy → OpenBLAS's ``cblas_dgemm`` at +0x2000 → kernel
  +0x3000), ``DISPATCH_A`` seconds;
* line 11: the matrix product ``B``, the same frames, ``DISPATCH_B`` seconds;
* line 12: Python only, ``PYTHON_ONLY`` seconds.

OpenBLAS's worker (thread 1) starts in ``blas_thread_server`` (+0x5000) and runs kernel X
(+0x6000, ``WORKER_X`` s), kernel Y (+0x6100, ``WORKER_Y`` s), and spins in the server itself
(``WORKER_SPIN`` s). With traces (``traced=True``), the main thread is in line 10 at times
0-9 µs and in line 11 at 10-19 µs, line 12 at 30-39 µs; the worker's X samples fall in line
10's time, its Y and spin samples in line 11's.

So in proportion to the main thread's time in OpenBLAS, lines 10 and 11 each get half of the
worker's time; by time, line 10 gets X and line 11 gets Y and the spin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from measurement_helpers import cpu_profile, profile_name
from pyhpctk.formats import hpcrun, hpctrace, logical
from pyhpctk.formats.hpcrun_model import (
    TRACE_RECORD_DTYPE,
    HpctraceFile,
    LoadModule,
    MetricDescriptor,
    placeholder_ip,
)

CPUTIME = "CPUTIME (sec)"
SCRIPT = "/work/app.py"
OPENBLAS = "/opt/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so"
NUMPY = "/opt/site-packages/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"

DISPATCH_A = 1.0
DISPATCH_B = 1.0
PYTHON_ONLY = 0.5
WORKER_X = 1.0
WORKER_Y = 3.0
WORKER_SPIN = 0.5

LINE_A, LINE_B, LINE_C = 10, 11, 12
MODULES = [
    LoadModule(1, "logical/python.00001234"),
    LoadModule(2, NUMPY),
    LoadModule(3, OPENBLAS),
    LoadModule(4, LIBC),
]


def _frame(line: int) -> int:
    return 1 << 32 | line  # fid 1: the script's module-level code


def _trace(records: list[tuple[int, int]], directory: Path, name: str) -> None:
    array = np.array([(t * 1000, n) for t, n in records], dtype=TRACE_RECORD_DTYPE)
    hpctrace.write(HpctraceFile(records=array), directory / name.replace(".hpcrun", ".hpctrace"))


def write_process(
    measurement: Path,
    pid: int = 4321,
    traced: bool = False,
    dispatch: bool = True,
    worker_start: int = 0x5000,
    cut_short: float = 0.0,
) -> None:
    """The main thread and the OpenBLAS worker of one process into ``measurement``
    (``dispatch=False``: the main thread never calls OpenBLAS, it only runs Python;
    ``cut_short``: seconds of the worker's samples whose stack ends in numpy's function at
    +0x6200 the pool ran, not unwound to the thread's start, as the engine leaves a few under
    load)."""
    (measurement / "logical").mkdir(parents=True, exist_ok=True)
    logical.write(
        logical.LogicalMetadata([logical.LogicalStanza(1, "", filename=SCRIPT)]),
        measurement / "logical" / "python.00001234",
    )
    metrics = [MetricDescriptor(CPUTIME, CPUTIME)]
    main_nodes = [
        (2, 0, 0, placeholder_ip("^Primary"), 1),
        (4, 2, 0, placeholder_ip("| Main  "), 1),
        (6, 4, 1, _frame(LINE_C), 1),
    ]
    main_values = {6: {0: PYTHON_ONLY}}
    if dispatch:
        for line, base, seconds in ((LINE_A, 10, DISPATCH_A), (LINE_B, 20, DISPATCH_B)):
            main_nodes += [
                (base, 4, 1, _frame(line), 1),
                (base + 1, base, 2, 0x100, 1),
                (base + 2, base + 1, 3, 0x2000, 1),
                (base + 3, base + 2, 3, 0x3000, 1),
            ]
            main_values[base + 3] = {0: seconds}
    main = cpu_profile(MODULES, main_nodes, main_values, metrics)
    main_name = profile_name(pid=pid, thread=0)
    hpcrun.write(main, measurement / main_name)
    worker_nodes = [
        (2, 0, 0, placeholder_ip("^Primary"), 1),
        (4, 2, 0, placeholder_ip("| Thread"), 1),
        (5, 4, 4, 0x1000, 1),  # libc's start_thread
        (6, 5, 3, worker_start, 1),  # blas_thread_server
        (8, 6, 3, 0x6000, 1),
        (10, 6, 3, 0x6100, 1),
    ]
    worker_values = {6: {0: WORKER_SPIN}, 8: {0: WORKER_X}, 10: {0: WORKER_Y}}
    if cut_short:
        worker_nodes.append((12, 4, 2, 0x6200, 1))
        worker_values[12] = {0: cut_short}
    worker = cpu_profile(MODULES, worker_nodes, worker_values, metrics, thread=1)
    worker_name = profile_name(pid=pid, thread=1)
    hpcrun.write(worker, measurement / worker_name)
    if traced:
        timeline = [(t, 13 if dispatch else 6) for t in range(10)]
        timeline += [(t, 23 if dispatch else 6) for t in range(10, 20)]
        timeline += [(t, 6) for t in range(30, 40)]
        _trace(timeline, measurement, main_name)
        samples = [(1, 8), (4, 8), (12, 10), (15, 10), (18, 10), (21, 6)]
        _trace(samples, measurement, worker_name)

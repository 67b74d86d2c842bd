"""What pyrun's GPU layer costs per operation on the CPU, hook against hook (issue #6, item 8).

    python benchmarks/gpu_hook_cost.py [--operations 200000] [--repeat 5]

No GPU: the simulated backend issues operations the way CUPTI reports them, inside a real
session and monitor, from a loop of the shapes that matter:

- ``loop``: one line launching repeatedly (a launch loop);
- ``wrapper``: a library's Python wrapper between the loop and the launch (a new frame object
  at every call, as CuPy's and PyTorch's Python layers have);
- ``sites``: four lines in turn, each through the wrapper (a model's forward pass).

For each shape and each hook (``c``: the C CUPTI hook, called through ``invoke()`` as CUPTI would
call it; ``python``: ``GpuMonitor.operation``, which cupti-python's callback calls, without the
bindings' own cost per call) the time per operation is printed above a baseline measured in the
same run: the same loop calling a C function that does nothing. Then the monitor's work per
activity record: one buffer of kernels matched to the operations each hook recorded and
attributed (the C hook's tokens are matched as arrays; the Python path's operations one tuple
each). Last, reading CUPTI's buffers (the same for both hooks): a buffer of 7,440 records
(``gpu_model_sim.py``'s stand-in layouts, ~200-byte kernels) of kernels only, kernels with a
memset in every 16 (a model's buffers), and kernels and memsets alternating. Times are the
calling thread's CPU time (``time.thread_time``): on a shared machine wall time mostly measures
the neighbours.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import threading
import time
from collections.abc import Callable

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu import simulated
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.gpu.simulated import DEFAULT_RECORDING
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

FIXTURE = DEFAULT_RECORDING
# The callback domain and ids the simulated backend configures the C hook with.
DOMAIN, FIRST_CBID = simulated._DRIVER, simulated._FIRST_CBID


def wrapper(issue: Callable[[int], object], correlation: int) -> None:
    issue(correlation)


def shape_loop(issue: Callable[[int], object], n: int) -> None:
    for correlation in range(n):
        issue(correlation)


def shape_wrapper(issue: Callable[[int], object], n: int) -> None:
    for correlation in range(n):
        wrapper(issue, correlation)


def shape_sites(issue: Callable[[int], object], n: int) -> None:
    for correlation in range(0, n, 4):
        wrapper(issue, correlation)
        wrapper(issue, correlation + 1)
        wrapper(issue, correlation + 2)
        wrapper(issue, correlation + 3)


SHAPES = {"loop": shape_loop, "wrapper": shape_wrapper, "sites": shape_sites}


def measure(hook: str, shape: str, n: int, repeat: int) -> float:
    """Best seconds per operation of ``shape`` through ``hook`` ("none": the bare loop)."""
    with tempfile.TemporaryDirectory() as directory:
        session = Session(MeasureOptions(directory, trace=False, checkpoint_s=0))
        session.register_thread(threading.current_thread(), main=True)
        recording = rec.load(FIXTURE)
        backend = SimulatedBackend(recording, hook="c" if hook == "c" else "python")
        monitor = GpuMonitor(
            session, session.add_metric_kind(gm.gpu_metric_kind()), backend=backend
        )
        backend.start(monitor, paused=True)
        native = backend.native
        # functools.partial is C: no Python frame between the program's frame and the hook,
        # as when CUPTI calls from inside the CUDA library the program called.
        if hook == "c":
            assert native is not None, "the C hook is not built (pip install -e .)"
            cbid = FIRST_CBID + act.KERNEL  # the simulated backend's made-up launch callback
            issue: Callable[[int], object] = functools.partial(native.invoke, DOMAIN, cbid, 0)  # type: ignore[attr-defined]
        elif hook == "python":  # what cupti-python's callback calls (less the bindings' cost)
            issue = functools.partial(monitor.operation, act.KERNEL)
        else:
            issue = int  # a C call that does nothing worth measuring

        best = float("inf")
        for _ in range(repeat):
            began = time.thread_time()
            SHAPES[shape](issue, n)
            best = min(best, time.thread_time() - began)
            monitor._drain_operations()  # what the monitor thread does between buffers
            monitor.matcher.pending.clear()
        if native is not None:
            native.reset()  # type: ignore[attr-defined]
        backend.native = None
        return best / n


def attribution(hook: str, n: int, repeat: int) -> float:
    """Best seconds per activity record to match and attribute a buffer of ``n`` kernels."""
    import numpy as np

    with tempfile.TemporaryDirectory() as directory:
        session = Session(MeasureOptions(directory, trace=False, checkpoint_s=0))
        session.register_thread(threading.current_thread(), main=True)
        recording = rec.load(FIXTURE)
        backend = SimulatedBackend(recording, hook=hook)
        monitor = GpuMonitor(
            session, session.add_metric_kind(gm.gpu_metric_kind()), backend=backend
        )
        backend.start(monitor, paused=True)
        if hook == "c":
            issue: Callable[[int], object] = functools.partial(
                backend.native.invoke,  # type: ignore[union-attr]
                DOMAIN,
                FIRST_CBID + act.KERNEL,
                0,
            )
        else:
            issue = functools.partial(monitor.operation, act.KERNEL)
        template = recording.activities[recording.activities["kind"] == act.KERNEL][0]
        state = None
        best = float("inf")
        for round_ in range(repeat + 1):
            base = 1 + round_ * n
            for correlation in range(base, base + n):  # not timed: the operations to match
                issue(correlation)
            rows = act.empty_activities(n)
            rows[:] = template
            rows["correlation"] = np.arange(base, base + n)
            began = time.thread_time()
            monitor._process(rows, recording.functions, 0)
            state = state or monitor.threads[0]
            # Before issue #18 the thread attributed its own activities at its next safe point;
            # since, the monitor attributes them in _process.
            pending = getattr(monitor.attributor, "attribute_pending", None)
            if pending is not None:
                with session.lock:
                    pending(state)
            if round_:  # the first round creates the nodes
                best = min(best, time.thread_time() - began)
        if backend.native is not None:
            backend.native.reset()  # type: ignore[attr-defined]
        return best / n


def parsing(pattern: str, repeat: int) -> float:
    """Best CPU seconds per record to read a raw buffer of kernels (and memsets)."""
    import gpu_model_sim as sim

    every = {"kernels": 0, "mixed": 16, "alternating": 2}[pattern]
    kinds = [
        (2 * i + 1, sim.MEMSET_RECORD if every and i % every == 0 else sim.KERNEL_RECORD)
        for i in range(7440)
    ]
    raw = sim.raw_buffer(kinds, 1 << 60)
    reader = sim.parser()
    reader.parse_raw(raw.ctypes.data, len(raw))  # sizes, kernel names: learned once
    best = float("inf")
    for _ in range(repeat):
        began = time.thread_time()
        reader.parse_raw(raw.ctypes.data, len(raw))
        best = min(best, time.thread_time() - began)
    return best / len(kinds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'shape':8} {'bare (ns)':>10} {'c (ns)':>8} {'python (ns)':>12} {'python/c':>9}")
    for shape in SHAPES:
        bare, c, python = (
            measure(hook, shape, args.operations, args.repeat) * 1e9
            for hook in ("none", "c", "python")
        )
        extra_c, extra_python = c - bare, python - bare
        print(
            f"{shape:8} {bare:10.0f} {extra_c:8.0f} {extra_python:12.0f} "
            f"{extra_python / max(extra_c, 1e-9):9.1f}"
        )
    print("(c / python: nanoseconds per operation above the bare loop)")
    c, python = (attribution(hook, args.operations, args.repeat) * 1e9 for hook in ("c", "python"))
    print(f"matching + attribution per activity record: c {c:.0f} ns, python {python:.0f} ns")
    for pattern in ("kernels", "mixed", "alternating"):
        per_record = parsing(pattern, args.repeat) * 1e9
        print(f"reading a buffer, {pattern}: {per_record:.0f} ns per record")


if __name__ == "__main__":
    main()

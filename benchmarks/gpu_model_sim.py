"""GPU measurement on a model-shaped program, without a GPU (issue #18, item 1).

    PYTHONPATH=src python3 benchmarks/gpu_model_sim.py [--sites 300] [--steps 20] [--rounds 3]
    python3 benchmarks/gpu_model_sim.py --trees OLD/src,src [--times 3]

What ResNet-18 and GPT-2 training steps do to pyrun's GPU layer, reproduced on the CPU:

- a forward pass from ``--sites`` distinct Python call chains (layer instances reached through
  different lines, under a framework stack ``--depth`` frames deep), two launches each;
- each launch a runtime API call with a driver call inside (``cudaLaunchKernel`` calls
  ``cuLaunchKernel``), each with its own correlation id, one in ``--memsets`` a memset;
- a backward pass on a worker thread that has a Python thread state, no Python frame, and does
  not hold the GIL (PyTorch's autograd worker), while the main thread waits;
- an optimizer step: ``--optimizer`` launches from one line;
- activity buffers of kernel and memset records mixed, completed every ``--buffer-steps``
  steps on a thread of their own and read by the CUPTI backend's buffer parser;
- with ``--trace``, stream traces as ``pyrun -t`` records them.

The CUPTI callbacks come from ``tests/data/gpu/fake_cupti.c`` (built here with ``cc``), which
calls the C hook's subscriber from C exactly as libcupti does; the session, monitor, matching,
attribution and parsing are pyrun's own. Each round times ``--steps`` steps unmeasured and then
measured (after ``--warm`` measured steps), in the same process; the line printed is JSON: the
median step times, their ratio, the microseconds added per launch, the hook's counters (slow
paths in the timed steps: Python entered at a call site), the time spent in the monitor's
buffer processing and the parser, and the monitor's counts (every activity attributed).

``--trees A,B`` compares checkouts (each ``src`` folder with its C hook built for this Python):
it runs itself ``--times`` times with each as ``PYTHONPATH``, in turn, and prints a table of
the medians: wall time per step (noisy on a shared machine), CPU time of the monitor's and the
parser's threads per activity, and the slow paths per step.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.cupti.backend import CuptiBackend, Gather, load_hook
from pyhpctk.measure.gpu.cupti.buffers import BufferReader
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.gpu.operations import SKIP
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

FAKE = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gpu", "fake_cupti.c")
RUNTIME, DRIVER = 2, 1  # CUpti_CallbackDomain: CUPTI_CB_DOMAIN_RUNTIME_API, _DRIVER_API
RT_LAUNCH, DRV_LAUNCH, RT_MEMSET, DRV_MEMSET = 211, 307, 50, 60  # any ids: the table says
KERNEL_RECORD, MEMSET_RECORD = 10, 2  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, _MEMSET
# Stand-ins for cupti-python's record layouts (the fields the parser reads, CUPTI's order).
KERNEL = np.dtype(
    [
        ("kind", "<u4"),
        ("registers_per_thread", "<u2"),
        ("pad0", "<u2"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("device_id", "<u4"),
        ("context_id", "<u4"),
        ("stream_id", "<u4"),
        ("grid_x", "<i4"),
        ("grid_y", "<i4"),
        ("grid_z", "<i4"),
        ("block_x", "<i4"),
        ("block_y", "<i4"),
        ("block_z", "<i4"),
        ("static_shared_memory", "<i4"),
        ("dynamic_shared_memory", "<i4"),
        ("local_memory_total", "<u4"),
        ("correlation_id", "<u4"),
        ("pad1", "<u4"),
        ("name", "<u8"),
        ("rest", "<u8", 12),  # CUPTI's kernel records are ~200 bytes
    ]
)
MEMSET = np.dtype(
    [
        ("kind", "<u4"),
        ("value", "<u4"),
        ("bytes", "<u8"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("device_id", "<u4"),
        ("context_id", "<u4"),
        ("stream_id", "<u4"),
        ("correlation_id", "<u4"),
        ("memory_kind", "<u2"),
        ("pad", "<u2", 3),
    ]
)
KERNEL_NAME = ctypes.create_string_buffer(b"sim_kernel")


def build_fake(directory: str) -> ctypes.CDLL:
    """libcupti's stand-in, compiled now (a C compiler is needed, as for the hook)."""
    path = os.path.join(directory, "libcupti_fake.so")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", path, FAKE, "-lpthread", "-ldl"], check=True
    )
    return ctypes.CDLL(path)


class Model:
    """The program: call sites, launches, the backward worker (see the module docstring)."""

    def __init__(self, fake: ctypes.CDLL, args: argparse.Namespace) -> None:
        self.fake = fake
        self.args = args
        self.next = 1  # correlation ids: runtime calls odd-free pairs (id, id + 1 inside)
        self.kinds: list[tuple[int, int]] = []  # (runtime correlation id, record kind)
        self.layers = [self._layer(index) for index in range(args.sites)]

    def _layer(self, index: int) -> Callable[[], None]:
        # One code object per layer: its two launches are two call sites of their own.
        namespace: dict[str, object] = {"op": self.op}
        source = f"def layer_{index}():\n    op(0)\n    op({index % self.args.memsets == 0:d})\n"
        exec(compile(source, f"<layer {index}>", "exec"), namespace)
        return namespace[f"layer_{index}"]  # type: ignore[return-value]

    def op(self, memset: int) -> None:
        """A framework function (the same code for every layer), then the library call."""
        correlation = self.next
        self.next += 2
        if memset:
            self.kinds.append((correlation, MEMSET_RECORD))
            self.fake.fake_runtime(RT_MEMSET, correlation, DRV_MEMSET, correlation + 1)
        else:
            self.kinds.append((correlation, KERNEL_RECORD))
            self.fake.fake_runtime(RT_LAUNCH, correlation, DRV_LAUNCH, correlation + 1)

    def step(self, depth: int) -> None:
        if depth:  # the framework's frames between the training loop and the layers
            self.step(depth - 1)
            return
        for layer in self.layers:  # forward
            layer()
        calls = self.args.backward
        first = self.next
        self.next += 2 * calls
        self.kinds.extend((first + 2 * i, KERNEL_RECORD) for i in range(calls))
        self.fake.fake_worker_start(calls, RT_LAUNCH, DRV_LAUNCH, first)
        while not self.fake.fake_worker_done():  # backward: the main thread waits
            time.sleep(0.0002)
        for _ in range(self.args.optimizer):  # optimizer: one line, many launches
            self.op(0)


def raw_buffer(kinds: list[tuple[int, int]], start_ns: int) -> np.ndarray:
    """CUPTI's buffer for these operations: one record each, in issue order, kinds mixed."""
    sizes = {KERNEL_RECORD: KERNEL.itemsize, MEMSET_RECORD: MEMSET.itemsize}
    total = sum(sizes[kind] for _, kind in kinds)
    raw = np.zeros(total, dtype=np.uint8)
    at = 0
    kernel = np.zeros(1, KERNEL)
    kernel["kind"] = KERNEL_RECORD
    kernel["name"] = ctypes.addressof(KERNEL_NAME)
    kernel["block_x"] = kernel["grid_x"] = 128
    kernel["stream_id"] = 7
    memset = np.zeros(1, MEMSET)
    memset["kind"] = MEMSET_RECORD
    memset["bytes"] = 4096
    memset["stream_id"] = 7
    for index, (correlation, kind) in enumerate(kinds):
        record = kernel if kind == KERNEL_RECORD else memset
        record["correlation_id"] = correlation
        record["start"] = start_ns + 1000 * index
        record["end"] = start_ns + 1000 * index + 500
        raw[at : at + record.itemsize] = record.view(np.uint8)
        at += record.itemsize
    return raw


def parser() -> BufferReader:
    """The CUPTI backend's buffer parser, knowing the stand-in layouts (no libcupti here)."""
    backend = CuptiBackend().buffers
    backend.record_sizes = {KERNEL_RECORD: KERNEL.itemsize, MEMSET_RECORD: MEMSET.itemsize}
    backend.checks_left = 0
    backend._kinds = {KERNEL_RECORD: act.KERNEL, MEMSET_RECORD: act.MEMSET}
    backend._gathers = {act.KERNEL: Gather([KERNEL]), act.MEMSET: Gather([MEMSET])}
    return backend


def _timed(owner: object, name: str, spent: dict[str, float]) -> None:
    """Wall and CPU time of every call of ``owner.name`` (CPU: of the calling thread alone;
    the wall time also counts waits for the GIL)."""
    original = getattr(owner, name)

    def timed(*args: object, **kwargs: object) -> object:
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - began
            spent[name + " cpu"] = spent.get(name + " cpu", 0.0) + time.thread_time() - cpu

    setattr(owner, name, timed)


def run(args: argparse.Namespace) -> dict[str, object]:
    directory = tempfile.mkdtemp(prefix="gpu-model-sim-")
    fake = build_fake(directory)
    fake.fake_worker_start.argtypes = [ctypes.c_long, ctypes.c_uint32, ctypes.c_uint32]
    fake.fake_worker_start.argtypes += [ctypes.c_uint32]
    hook = load_hook()
    assert hook is not None, "the C hook is not built"
    hook.reset()
    session = Session(MeasureOptions(directory, trace=args.trace, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    monitor = GpuMonitor(session, session.add_metric_kind(gm.gpu_metric_kind()))
    spent: dict[str, float] = {}
    _timed(monitor, "_process", spent)
    _timed(monitor.matcher, "match", spent)
    _timed(monitor.attributor, "attribute", spent)  # on the program's thread before issue #18
    _timed(monitor.tracer, "drain", spent)
    reader = parser()
    _timed(reader, "parse_raw", spent)
    model = Model(fake, args)
    entries = [
        (RUNTIME, RT_LAUNCH, act.KERNEL, 0, 0),
        (DRIVER, DRV_LAUNCH, act.KERNEL, 0, 0),
        (RUNTIME, RT_MEMSET, act.MEMSET, 0, 0),
        (DRIVER, DRV_MEMSET, act.MEMSET, 0, 0),
    ]
    hook.configure(entries, monitor.operation_token, None, 0xFFFFFFFF, 0xFFFFFFFF, SKIP)
    monitor.attach_hook(hook)
    path = os.path.join(directory, "libcupti_fake.so")
    plain: list[float] = []
    measured: list[float] = []
    counts: dict[str, int] = {}
    delivered = 0
    deliveries: list[threading.Thread] = []
    for _ in range(args.rounds):
        for _ in range(args.steps):  # unmeasured: no subscriber, the same calls
            began = time.perf_counter()
            model.step(args.depth)
            plain.append(time.perf_counter() - began)
        model.kinds.clear()
        hook.subscribe(path)
        before = hook.stats()
        for step in range(args.warm + args.steps):
            if step == args.warm:
                before = hook.stats()
            began = time.perf_counter()
            model.step(args.depth)
            if step >= args.warm:
                measured.append(time.perf_counter() - began)
            if (step + 1) % args.buffer_steps == 0 or step + 1 == args.warm + args.steps:
                kinds, model.kinds = model.kinds, []
                buffer = raw_buffer(kinds, time.time_ns())
                delivered += len(kinds)
                # CUPTI's buffer thread: parse, hand over (the monitor matches and attributes)
                thread = threading.Thread(target=_deliver, args=(monitor, reader, buffer))
                thread.start()
                deliveries.append(thread)
        after = hook.stats()
        for key, value in after.items():
            counts[key] = counts.get(key, 0) + value - before.get(key, 0)
        for thread in deliveries:
            thread.join()
        monitor.wait_processed(60)
        hook.unsubscribe()
    stats = monitor.finish(report=False)
    launches = len(model.layers) * 2 + args.backward + args.optimizer
    plain_step, measured_step = statistics.median(plain), statistics.median(measured)
    return {
        "sites": args.sites,
        "launches_per_step": launches,
        "plain_step_s": plain_step,
        "measured_step_s": measured_step,
        "ratio": measured_step / plain_step,
        "added_us_per_launch": (measured_step - plain_step) / launches * 1e6,
        "hook_in_timed_steps": counts,
        "slow_per_timed_step": counts.get("slow", 0) / (args.rounds * args.steps),
        "spent_s": spent,
        "delivered": delivered,
        "gpu": stats.as_dict(),
        "frame_walk": getattr(hook, "FRAME_WALK", "public"),
    }


def _deliver(monitor: GpuMonitor, reader: BufferReader, raw: np.ndarray) -> None:
    monitor.exclude_current_thread()
    records = reader.parse_raw(raw.ctypes.data, len(raw))
    monitor.buffer_completed(records, reader.functions)


def compare(trees: list[str], times: int, passed: list[str]) -> None:
    """Run this benchmark with each tree's code in turn; a markdown table of the medians."""
    runs: dict[str, list[dict[str, object]]] = {tree: [] for tree in trees}
    for _ in range(times):
        for tree in trees:
            environment = dict(os.environ, PYTHONPATH=tree)
            done = subprocess.run(
                [sys.executable, __file__, *passed],
                env=environment,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(tree, done.stdout.strip().splitlines()[-1], flush=True)
    print()
    print("| code | step, plain (ms) | step, measured (ms) | added per launch (µs) |", end="")
    print(" matching + attribution, CPU per activity (µs) |", end="")
    print(" parsing, CPU per activity (µs) | slow paths per step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tree, results in runs.items():
        columns = [
            [float(r["plain_step_s"]) * 1e3 for r in results],  # type: ignore[arg-type]
            [float(r["measured_step_s"]) * 1e3 for r in results],  # type: ignore[arg-type]
            [float(r["added_us_per_launch"]) for r in results],  # type: ignore[arg-type]
            [_per_activity(r, "match cpu", "attribute cpu") for r in results],
            [_per_activity(r, "parse_raw cpu") for r in results],
            [float(r["slow_per_timed_step"]) for r in results],  # type: ignore[arg-type]
        ]
        cells = " | ".join(f"{statistics.median(column):.2f}" for column in columns)
        print(f"| {tree} | {cells} |")


def _per_activity(result: dict[str, object], *names: str) -> float:
    spent: dict[str, float] = result["spent_s"]  # type: ignore[assignment]
    return sum(spent.get(name, 0.0) for name in names) / float(result["delivered"]) * 1e6  # type: ignore[arg-type]


def main() -> None:
    parser_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser_.add_argument("--sites", type=int, default=300, help="distinct forward call chains")
    parser_.add_argument("--depth", type=int, default=25, help="framework frames below them")
    parser_.add_argument("--backward", type=int, default=1200, help="frameless launches")
    parser_.add_argument("--optimizer", type=int, default=60, help="launches from one line")
    parser_.add_argument("--memsets", type=int, default=8, help="one layer in N: a memset")
    parser_.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser_.add_argument("--warm", type=int, default=3, help="measured steps not timed")
    parser_.add_argument("--buffer-steps", type=int, default=4, help="steps per buffer")
    parser_.add_argument("--rounds", type=int, default=3)
    parser_.add_argument("--trace", action="store_true", help="as pyrun -t: stream traces")
    parser_.add_argument("--trees", default="", help="src folders to compare, e.g. OLD/src,src")
    parser_.add_argument("--times", type=int, default=3, help="runs of each tree (--trees)")
    args = parser_.parse_args()
    if args.trees:
        compare([t for t in args.trees.split(",") if t], args.times, _without(sys.argv[1:]))
        return
    print(json.dumps(run(args)))


def _without(argv: list[str]) -> list[str]:
    """The arguments but ``--trees`` and ``--times`` (and their values)."""
    out: list[str] = []
    skip = False
    for argument in argv:
        if skip:
            skip = False
            continue
        if argument in ("--trees", "--times"):
            skip = True
            continue
        if not argument.startswith(("--trees=", "--times=")):
            out.append(argument)
    return out


if __name__ == "__main__":
    sys.exit(main())

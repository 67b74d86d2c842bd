"""Record CUPTI PC samples of the ground-truth kernel on a real GPU (issue #7 fixture).

Run on the device (``tests/data/gpu/device_pc.sh``)::

    python3 tests/data/gpu/record_pc.py OUT.json [--period 12] [--launches 4] [--iters 256]
    python3 tests/data/gpu/record_pc.py OUT.json --inst [--launches 1]     # instruction counts

The kernel (compiled at run time with cupy.RawModule / NVRTC) has a chain of ``__noinline__``
device functions (``top → mid → leaf``), a function called from two sites 1:3 (``shared_fn``:
once at site A, three times at site B, in a loop that is not unrolled, both repeated
``--reps`` times), direct recursion (``rec``, ``--depth`` calls), mutual recursion
(``ping ↔ pong``, ``--turns`` calls each way) and loops in device functions; every thread takes
the same path, so :func:`calls_per_thread` is exact for every thread and every warp.

PC mode (default) records everything pyrun's PC sampling path sees: the stall reasons, the
sample rows (:data:`pyhpctk.measure.gpu.cupti.pcsampling.SAMPLE_DTYPE`, as lists), CUPTI's totals,
each loaded cubin (base64) with its md5 and CUPTI CRC, the kernel's duration and the device's
SM count and clock, and the known call counts per thread. ``--inst`` records exact counts
instead (:data:`pyhpctk.measure.gpu.cupti.sassmetrics.INST_DTYPE` rows: the totals of ``--launches``
launches, CUPTI's one counting window, as one group with correlation id 1); with
``--launches 1`` that group is one launch's, as ``gpu=simulated,inst=PATH`` replays it. nvcc
builds the same source for CI (``tests/data/gpu/gt_sm90.cubin``, see ``tests/test_gpu_inst.py``).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import json
import os
import sys
import time

SOURCE = r"""
extern "C" {
__device__ __noinline__ float leaf(float x, int n) {
    for (int i = 0; i < n; ++i) { x = x * 1.0001f + 0.5f; }
    return x;
}
__device__ __noinline__ float mid(float x, int n) { return leaf(x, n) + 1.0f; }
__device__ __noinline__ float top(float x, int n) { return mid(x, n) * 0.5f; }
__device__ __noinline__ float shared_fn(float x, int n) {
    for (int i = 0; i < n; ++i) { x = x * 0.999f + 0.25f; }
    return x;
}
// direct recursion, not a tail call: rec(d) calls rec(d - 1) until d == 0 (d calls)
__device__ __noinline__ float rec(float x, int d) {
    if (d <= 0) { return x; }
    return rec(x * 0.5f + 1.0f, d - 1) * 0.75f + x;
}
__device__ __noinline__ float pong(float x, int d);
// mutual recursion: ping(2t) -> pong(2t - 1) -> ping(2t - 2) ... -> ping(0) (t calls each way)
__device__ __noinline__ float ping(float x, int d) {
    if (d <= 0) { return x; }
    return pong(x + 0.5f, d - 1) * 0.5f + x;
}
__device__ __noinline__ float pong(float x, int d) {
    if (d <= 0) { return x; }
    return ping(x * 0.25f, d - 1) * 0.25f + x;
}
__global__ void gt_kernel(float *out, int n, int depth, int turns, int reps) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    float x = out[t];
    x = top(x, n);
#pragma unroll 1
    for (int r = 0; r < reps; ++r) {
        x += shared_fn(x, n);            // site A: 1 call per repetition
#pragma unroll 1
        for (int k = 0; k < 3; ++k) {    // site B: 3 calls per repetition
            x += shared_fn(x + k, n);
        }
    }
    x += rec(x, depth);
    x += ping(x, 2 * turns);
    out[t] = x;
}
}
"""
KERNEL = "gt_kernel"


def calls_per_thread(depth: int, turns: int, reps: int) -> dict[str, int]:
    """Calls per thread of each call edge (the ground truth edge weights are checked against).

    Every thread of the grid takes the same path, so a warp executes each call instruction
    exactly as often as each of its threads. ``@A``/``@B``: the first and second call site of
    ``shared_fn`` in the kernel, in address order.
    """
    return {
        "gt_kernel->top": 1,
        "top->mid": 1,
        "mid->leaf": 1,
        "gt_kernel->shared_fn@A": reps,
        "gt_kernel->shared_fn@B": 3 * reps,
        "gt_kernel->rec": 1,
        "rec->rec": depth,
        "gt_kernel->ping": 1,
        "ping->pong": turns,
        "pong->ping": turns,
    }


#: The ground truth of the default arguments (``--depth 5 --turns 3 --reps 1``).
CALLS = calls_per_thread(5, 3, 1)


def _header_has_correlation() -> bool | None:
    path = os.environ.get("PCS_HEADER", "")
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as stream:
        text = stream.read()
    start = text.find("CUpti_PCSamplingStallReason *stallReason;")
    end = text.find("} CUpti_PCSamplingPCData;")
    return start >= 0 and end > start and "correlationId" in text[start:end]


def _cubins_and_subscriber() -> tuple[list[bytes], object]:
    """Subscribe to MODULE_LOADED (cupti-python) and collect every cubin the driver loads."""
    from cupti import cupti

    cubins: list[bytes] = []

    def on_callback(userdata: object, domain: int, cbid: int, data: object) -> None:
        if domain == int(cupti.CallbackDomain.RESOURCE) and cbid == int(
            cupti.CallbackIdResource.MODULE_LOADED
        ):
            descriptor = int(data.resource_descriptor)  # type: ignore[attr-defined]
            size = ctypes.c_uint64.from_address(descriptor + 8).value
            pointer = ctypes.c_void_p.from_address(descriptor + 16).value
            if size and pointer:
                cubins.append(ctypes.string_at(pointer, size))

    subscriber = cupti.subscribe(on_callback, None)
    cupti.enable_callback(
        1, subscriber, cupti.CallbackDomain.RESOURCE, cupti.CallbackIdResource.MODULE_LOADED
    )
    return cubins, subscriber


def _cubin_entries(lib: ctypes.CDLL, cubins: list[bytes]) -> list[dict[str, object]]:
    from pyhpctk.measure.gpu.cupti import pcsampling as pcs

    entries: list[dict[str, object]] = []
    for cubin in cubins:
        try:
            crc = pcs.cubin_crc(lib, cubin)
        except OSError as error:
            crc = -1
            print("crc failed", error, file=sys.stderr)
        entries.append(
            {
                "md5": hashlib.md5(cubin, usedforsecurity=False).hexdigest(),
                "crc": crc,
                "size": len(cubin),
                "base64": base64.b64encode(cubin).decode(),
            }
        )
    return entries


def _device() -> dict[str, object]:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    return {
        "name": name.decode() if isinstance(name, bytes) else name,
        "sm_count": int(props["multiProcessorCount"]),
        "clock_khz": int(cupy.cuda.runtime.deviceGetAttribute(13, 0)),  # ClockRate
        "warp_size": int(props["warpSize"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--period", type=int, default=12)
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--iters", type=int, default=256)
    parser.add_argument("--depth", type=int, default=5, help="rec() recursion depth")
    parser.add_argument("--turns", type=int, default=3, help="ping() <-> pong() round trips")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of sites A and B")
    parser.add_argument("--blocks", type=int, default=264)
    parser.add_argument("--threads", type=int, default=128)
    parser.add_argument("--no-sampling", action="store_true", help="plain timing only")
    parser.add_argument(
        "--profiler-start",
        action="store_true",
        help="with --no-sampling: cudaProfilerStart() before the first launch (where"
        " pyrun -e gpu=nvidia,inst starts counting)",
    )
    parser.add_argument("--inst", action="store_true", help="instruction counts, not samples")
    parser.add_argument("--mode", default="serialized", choices=("serialized", "continuous"))
    parser.add_argument("--no-start-stop", action="store_true", help="sample enable..disable")
    args = parser.parse_args(argv)

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))
    import cupy
    import numpy as np

    cupy.cuda.Device(0).use()
    cupy.cuda.runtime.free(0)
    values = (np.int32(args.iters), np.int32(args.depth), np.int32(args.turns), np.int32(args.reps))
    grid, block = (args.blocks,), (args.threads,)
    if args.no_sampling:  # a plain program (also what pyrun -e gpu=nvidia,pc|inst measures)
        module = cupy.RawModule(code=SOURCE, options=("-lineinfo",))
        kernel = module.get_function(KERNEL)
        out = cupy.zeros(args.blocks * args.threads, dtype=cupy.float32)
        if args.profiler_start:
            cupy.cuda.runtime.deviceSynchronize()
            cupy.cuda.runtime.profilerStart()
        kernel(grid, block, (out, *values))
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for _ in range(args.launches):
            kernel(grid, block, (out, *values))
        cupy.cuda.runtime.deviceSynchronize()
        print(json.dumps({"sampled_wall_s": time.perf_counter() - t0}))
        return 0

    from pyhpctk.measure.gpu.cupti.lib import loaded_library

    context = int(cupy.cuda.driver.ctxGetCurrent())
    cubins, _subscriber = _cubins_and_subscriber()
    lib = ctypes.CDLL(loaded_library("libcupti") or "libcupti.so")
    common = {
        "kernel": KERNEL,
        "calls_per_thread": calls_per_thread(args.depth, args.turns, args.reps),
        "launches": args.launches,
        "iters": args.iters,
        "depth": args.depth,
        "turns": args.turns,
        "reps": args.reps,
        "grid": [args.blocks, args.threads],
        "device": _device(),
    }
    if args.inst:
        recording = _record_inst(args, lib, context, cubins, values)
    else:
        recording = _record_pc(args, lib, context, cubins, values)
    recording = {**common, **recording}
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(recording, stream)
    return 0


def _record_inst(
    args: argparse.Namespace,
    lib: ctypes.CDLL,
    context: int,
    cubins: list[bytes],
    values: tuple[object, ...],
) -> dict[str, object]:
    """Exact counts of ``--launches`` launches: CUPTI's one counting window.

    CUPTI counts only the first kernel launched after Enable, adds its later launches to the
    same counters, stops at the first flush, and counts nothing when other GPU work runs
    between Enable and that launch (``sassmetrics``' docstring). So everything the kernel
    needs (module, zeroed output) is made and the GPU is idle before Enable; then the launches,
    one synchronize, one collect: the rows are the totals of the launches (one group,
    correlation 1). The kernel is never launched before Enable (a kernel that ran before was
    not counted in any later window on the H200), so its duration is the counted launches'
    wall time, patching included.
    """
    import cupy

    from pyhpctk.measure.gpu.cupti import sassmetrics as sm

    module = cupy.RawModule(code=SOURCE, options=("-lineinfo",))
    kernel = module.get_function(KERNEL)
    out = cupy.zeros(args.blocks * args.threads, dtype=cupy.float32)
    grid, block = (args.blocks,), (args.threads,)
    counter = sm.SassCounter(lib, context)
    timings: dict[str, float] = {}
    counter.synchronize()
    t0 = time.perf_counter()
    counter.enable()
    timings["enable_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.launches):
        kernel(grid, block, (out, *values))
    counter.synchronize()
    timings["counted_wall_s"] = time.perf_counter() - t0
    batch = counter.collect(1)
    rest = counter.disable()
    counter.release()
    try:
        available = [name for name, _ in counter.available()]
    except OSError as error:  # only informative: the recording does not need it
        available = [f"error: {error}"]
    rows = batch.rows
    print(
        f"inst: rows={len(rows)} launches={args.launches} left at disable={len(rest.rows)}"
        f" dropped={counter.dropped_records} functions={batch.functions}"
        f" warp inst={int(rows['inst'].sum())} thread inst={int(rows['threads'].sum())}"
        f" chip={counter.chip} cubins={[len(c) for c in cubins]} timings={timings}"
        f" statuses={counter.statuses}"
    )
    if not len(rows):
        print("inst: CUPTI counted nothing", file=sys.stderr)
    return {
        "format": "inst",
        "metrics": [name for name, _ in counter.metrics],
        "available_metrics": available,
        "chip": counter.chip,
        "kernels_ns": int(timings["counted_wall_s"] * 1e9),
        "functions": list(batch.functions),
        "counted_launches": args.launches,  # the rows are the totals of this many launches
        "rows_left_at_disable": len(rest.rows),
        "dropped_records": counter.dropped_records,
        "statuses": counter.statuses,
        "rows": {name: rows[name].tolist() for name in rows.dtype.names or ()},
        "cubins": _cubin_entries(lib, cubins),
        "timings": timings,
    }


def _record_pc(
    args: argparse.Namespace,
    lib: ctypes.CDLL,
    context: int,
    cubins: list[bytes],
    values: tuple[object, ...],
) -> dict[str, object]:
    """PC samples of ``--launches`` launches in one start/stop range (or enable..disable)."""
    import cupy
    import numpy as np

    from pyhpctk.measure.gpu.cupti import pcsampling as pcs

    has_correlation = _header_has_correlation()
    size = pcs.PC_DATA_SIZE if has_correlation in (True, None) else pcs.PC_DATA_SIZE_LEGACY
    sampler = pcs.PcSampler(
        lib,
        context,
        period=args.period,
        pc_data_size=size,
        mode=args.mode,
        start_stop=not args.no_start_stop,
    )
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    sampler.enable()
    timings["enable_s"] = time.perf_counter() - t0
    module = cupy.RawModule(code=SOURCE, options=("-lineinfo",))
    kernel = module.get_function(KERNEL)
    out = cupy.zeros(args.blocks * args.threads, dtype=cupy.float32)
    grid, block = (args.blocks,), (args.threads,)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    kernel(grid, block, (out, *values))  # warm-up, unsampled
    cupy.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    if sampler.start_stop:
        sampler.start()
    start.record()
    for _ in range(args.launches):
        kernel(grid, block, (out, *values))
    end.record()
    end.synchronize()
    batch = sampler.stop() if sampler.start_stop else sampler.collect()
    timings["sampled_wall_s"] = time.perf_counter() - t0
    timings["kernels_ms"] = cupy.cuda.get_elapsed_time(start, end)
    rest = sampler.disable()
    print(f"after disable: rows={len(rest.rows)} total={rest.total_samples}", file=sys.stderr)
    if len(rest.rows) or rest.total_samples:
        batch.rows = np.concatenate([batch.rows, rest.rows])
        batch.total_samples += rest.total_samples
        batch.dropped_samples += rest.dropped_samples
        batch.non_user_samples += rest.non_user_samples
    rows = batch.rows
    base = pcs.sample_count(rows, sampler.reasons)
    print(
        f"reasons={len(sampler.reasons)} rows={len(rows)} samples={int(rows['samples'].sum())}"
        f" base={base} total={batch.total_samples} dropped={batch.dropped_samples}"
        f" non_user={batch.non_user_samples} functions={batch.functions}"
        f" cubins={[len(c) for c in cubins]}"
        f" row_crcs={sorted(set(rows['cubin_crc'].tolist()))} timings={timings}"
    )
    return {
        "format": "pc",
        "period_exponent": args.period,
        "mode": args.mode,
        "start_stop": not args.no_start_stop,
        "pc_data_size": size,
        "header_has_correlation": has_correlation,
        "kernels_ns": int(timings["kernels_ms"] * 1e6),
        "reasons": sampler.reasons,
        "reason_indices": sampler.reason_indices,
        "functions": batch.functions,
        "total_samples": batch.total_samples,
        "dropped_samples": batch.dropped_samples,
        "non_user_samples": batch.non_user_samples,
        "hardware_buffer_full": batch.hardware_buffer_full,
        "rows": {name: rows[name].tolist() for name in rows.dtype.names or ()},
        "cubins": _cubin_entries(lib, cubins),
        "timings": timings,
    }


if __name__ == "__main__":
    sys.exit(main())

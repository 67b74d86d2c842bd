"""Record CUPTI PC samples of the ground-truth kernel on a real GPU (issue #7 fixture).

Run on the device (``tests/data/gpu/device_pc.sh``)::

    python3 tests/data/gpu/record_pc.py OUT.json [--period 12] [--launches 4] [--iters 256]

The kernel (compiled at run time with cupy.RawModule / NVRTC) has a chain of ``__noinline__``
device functions (``top → mid → leaf``), a function called from two sites 1:3 (``shared_fn``:
once at site A, three times at site B, in a loop that is not unrolled) and loops in device
functions. The recording holds everything pyrun's PC sampling path sees: the stall reasons, the
sample rows (:data:`pyhpctk.measure.gpu.pcsampling.SAMPLE_DTYPE`, as lists), the totals, each
loaded cubin (base64) with its md5 and CUPTI CRC, the kernel's duration and the device's SM
count and clock, and the known call counts per thread.
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
__global__ void gt_kernel(float *out, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    float x = out[t];
    x = top(x, n);
    x += shared_fn(x, n);            // site A: 1 call
#pragma unroll 1
    for (int k = 0; k < 3; ++k) {    // site B: 3 calls
        x += shared_fn(x + k, n);
    }
    out[t] = x;
}
}
"""
KERNEL = "gt_kernel"
#: Calls per thread (the ground truth the reconstructed edge weights are checked against).
CALLS = {
    "gt_kernel->top": 1,
    "top->mid": 1,
    "mid->leaf": 1,
    "gt_kernel->shared_fn@A": 1,
    "gt_kernel->shared_fn@B": 3,
}


def _header_has_correlation() -> bool | None:
    path = os.environ.get("PCS_HEADER", "")
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as stream:
        text = stream.read()
    start = text.find("CUpti_PCSamplingStallReason *stallReason;")
    end = text.find("} CUpti_PCSamplingPCData;")
    return start >= 0 and end > start and "correlationId" in text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--period", type=int, default=12)
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--iters", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=264)
    parser.add_argument("--threads", type=int, default=128)
    parser.add_argument("--no-sampling", action="store_true", help="plain timing only")
    parser.add_argument("--mode", default="serialized", choices=("serialized", "continuous"))
    parser.add_argument("--no-start-stop", action="store_true", help="sample enable..disable")
    args = parser.parse_args(argv)

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))
    import cupy
    import numpy as np

    cupy.cuda.Device(0).use()
    cupy.cuda.runtime.free(0)
    if args.no_sampling:  # a plain program (also what pyrun -e gpu=nvidia,pc measures)
        module = cupy.RawModule(code=SOURCE, options=("-lineinfo",))
        kernel = module.get_function(KERNEL)
        out = cupy.zeros(args.blocks * args.threads, dtype=cupy.float32)
        kernel((args.blocks,), (args.threads,), (out, np.int32(args.iters)))
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for _ in range(args.launches):
            kernel((args.blocks,), (args.threads,), (out, np.int32(args.iters)))
        cupy.cuda.runtime.deviceSynchronize()
        print(json.dumps({"sampled_wall_s": time.perf_counter() - t0}))
        return 0

    from cupti import cupti

    from pyhpctk.measure.gpu import pcsampling as pcs
    from pyhpctk.measure.gpu.cupti_backend import _loaded_library

    context = int(cupy.cuda.driver.ctxGetCurrent())
    props = cupy.cuda.runtime.getDeviceProperties(0)
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
    lib = ctypes.CDLL(_loaded_library("libcupti") or "libcupti.so")
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
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    kernel((args.blocks,), (args.threads,), (out, np.int32(args.iters)))  # warm-up, unsampled
    cupy.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    if sampler.start_stop:
        sampler.start()
    start.record()
    for _ in range(args.launches):
        kernel((args.blocks,), (args.threads,), (out, np.int32(args.iters)))
    end.record()
    end.synchronize()
    batch = sampler.stop() if sampler.start_stop else sampler.collect()
    timings["sampled_wall_s"] = time.perf_counter() - t0
    timings["kernels_ms"] = cupy.cuda.get_elapsed_time(start, end)
    rest = sampler.disable()
    print(f"after disable: rows={len(rest.rows)} total={rest.total_samples}", file=sys.stderr)
    if len(rest.rows):
        batch.rows = np.concatenate([batch.rows, rest.rows])
        batch.total_samples += rest.total_samples
    crcs = []
    for cubin in cubins:
        try:
            crcs.append(pcs.cubin_crc(lib, cubin))
        except OSError as error:
            crcs.append(-1)
            print("crc failed", error, file=sys.stderr)
    rows = batch.rows
    recording = {
        "kernel": KERNEL,
        "calls_per_thread": CALLS,
        "launches": args.launches,
        "iters": args.iters,
        "grid": [args.blocks, args.threads],
        "period_exponent": args.period,
        "mode": args.mode,
        "start_stop": not args.no_start_stop,
        "pc_data_size": size,
        "header_has_correlation": has_correlation,
        "device": {
            "name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "sm_count": int(props["multiProcessorCount"]),
            "clock_khz": int(cupy.cuda.runtime.deviceGetAttribute(13, 0)),  # ClockRate
        },
        "kernels_ns": int(timings["kernels_ms"] * 1e6),
        "reasons": sampler.reasons,
        "reason_indices": sampler.reason_indices,
        "functions": batch.functions,
        "total_samples": batch.total_samples,
        "dropped_samples": batch.dropped_samples,
        "non_user_samples": batch.non_user_samples,
        "hardware_buffer_full": batch.hardware_buffer_full,
        "rows": {name: rows[name].tolist() for name in rows.dtype.names or ()},
        "cubins": [
            {
                "md5": hashlib.md5(c, usedforsecurity=False).hexdigest(),
                "crc": crc,
                "size": len(c),
                "base64": base64.b64encode(c).decode(),
            }
            for c, crc in zip(cubins, crcs, strict=True)
        ],
        "timings": timings,
    }
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(recording, stream)
    print(
        f"reasons={len(sampler.reasons)} rows={len(rows)} samples={int(rows['samples'].sum())}"
        f" total={batch.total_samples} dropped={batch.dropped_samples} functions={batch.functions}"
        f" cubins={[len(c) for c in cubins]} crcs={crcs}"
        f" row_crcs={sorted(set(rows['cubin_crc'].tolist()))} timings={timings}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

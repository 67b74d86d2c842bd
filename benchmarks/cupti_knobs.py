"""What CUPTI's activity tracing itself costs, and which of its settings change that (issue #18).

    PYTHONPATH=src python3 benchmarks/cupti_knobs.py [--workloads gpt2,launch] [--rounds 5]
        [--configs all,kernel,no-sync,no-memory,zeroed,pinned,devbuf,shared-buffers]

``gpu_breakdown.py`` found that on GPT-2 CUPTI's activity kinds alone (buffers handed back
unread) cost 1.39-1.44x, the whole of pyrun's cost there: no change to pyrun's own code can bring
that workload to its goal, only a cheaper way of asking CUPTI. Each configuration runs in a
child process of its own (CUPTI's attributes are read when the CUDA context is made), and in it
the workload is timed with tracing off and on in alternation (``cuptiActivityDisable`` /
``Enable``), ``--rounds`` pairs: the ratio of the best traced to the best plain time, and the
median of the paired ratios, so the drift between processes (up to 30 % on the device machine)
does not enter the comparison.

Configurations (``all``: the five kinds ``gpu=nvidia`` enables, CUPTI's defaults):

- ``kernel``: ``CONCURRENT_KERNEL`` alone; ``no-sync``, ``no-memory``: without
  ``SYNCHRONIZATION``, without ``MEMORY2``: what each kind adds;
- ``zeroed``: ``CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER`` = 1 (the buffers we hand over
  are zero already, so CUPTI need not clear them on the launching thread);
- ``pinned``: profiling data in page-locked host memory instead of device memory;
- ``devbuf``: device buffers of 32 MB, 8 preallocated (the default is 3.2 MB, 3);
- ``shared-buffers``: ``PER_THREAD_ACTIVITY_BUFFER`` = 0 (one buffer for all threads).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "MEMORY2")
ATTR_DEVICE_BUFFER_SIZE = 0
ATTR_ZEROED_OUT_ACTIVITY_BUFFER = 5
ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE = 6
ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED = 8
ATTR_PER_THREAD_ACTIVITY_BUFFER = 9
CONFIGS: dict[str, dict[str, object]] = {
    "all": {},
    "kernel": {"kinds": ("CONCURRENT_KERNEL",)},
    "no-sync": {"kinds": tuple(k for k in KINDS if k != "SYNCHRONIZATION")},
    "no-memory": {"kinds": tuple(k for k in KINDS if k != "MEMORY2")},
    "zeroed": {"attrs": ((ATTR_ZEROED_OUT_ACTIVITY_BUFFER, ctypes.c_uint8, 1),)},
    "pinned": {"attrs": ((ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED, ctypes.c_uint8, 1),)},
    "devbuf": {
        "attrs": (
            (ATTR_DEVICE_BUFFER_SIZE, ctypes.c_size_t, 32 << 20),
            (ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, ctypes.c_size_t, 8),
        )
    },
    "shared-buffers": {"attrs": ((ATTR_PER_THREAD_ACTIVITY_BUFFER, ctypes.c_uint8, 0),)},
}


def _workload(name: str) -> Callable[[], float]:
    """Seconds of one run: 10 training steps (``gpt2``, ``resnet18``) or 20,000 CuPy launches."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if name == "launch":
        import cupy as cp
        from gpu_breakdown import _loop

        return lambda: _loop(cp, 20000)
    from gpu_breakdown import _steps

    return _steps(name)


def child(workload: str, config: str, rounds: int) -> dict[str, object]:
    from cupti import cupti

    from pyhpctk.measure.gpu.cupti.lib import loaded_library

    cupti.get_timestamp()  # loads libcupti before CUDA makes its context
    lib = ctypes.CDLL(loaded_library("libcupti") or "libcupti.so")
    settings = CONFIGS[config]
    refused = []
    for attr, ctype, value in settings.get("attrs", ()):  # type: ignore[attr-defined]
        cell = ctype(value)
        size = ctypes.c_size_t(ctypes.sizeof(cell))
        status = lib.cuptiActivitySetAttribute(attr, ctypes.byref(size), ctypes.byref(cell))
        if status != 0:
            refused.append((attr, status))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_breakdown import discarding_buffers

    keep = discarding_buffers(lib)  # noqa: F841 (CUPTI calls them until the process ends)
    body = _workload(workload)
    body()
    first = [body() for _ in range(rounds)]  # before CUPTI has ever traced anything
    kinds = [getattr(cupti.ActivityKind, k) for k in settings.get("kinds", KINDS)]  # type: ignore[attr-defined]
    for kind in kinds:  # once, so that CUPTI sets up its buffers before the rounds
        cupti.activity_enable(kind)
    body()
    plain: list[float] = []
    traced: list[float] = []
    for _ in range(rounds):
        for kind in kinds:
            cupti.activity_disable(kind)
        plain.append(body())
        for kind in kinds:
            cupti.activity_enable(kind)
        traced.append(body())
    lib.cuptiActivityFlushAll(1)
    paired = [t / p for t, p in zip(traced, plain, strict=True)]
    return {
        "first": min(first),
        "plain": min(plain),
        "traced": min(traced),
        "ratio": min(traced) / min(plain),
        "ratio_first": min(traced) / min(first),
        "median_paired": statistics.median(paired),
        "refused": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="gpt2,launch")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        workload, config = args.child.split(":")
        print(json.dumps(child(workload, config, args.rounds)))
        return
    print(f"rounds {args.rounds}; ratio = best traced / best plain; paired = median of pairs")
    print(
        "| workload | config | never traced (s) | plain (s) | traced (s) | ratio "
        "| to never traced | paired | refused |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for workload in args.workloads.split(","):
        for config in args.configs.split(","):
            began = time.perf_counter()
            run = subprocess.run(
                [sys.executable, __file__, "--child", f"{workload}:{config}",
                 "--rounds", str(args.rounds)],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            if run.returncode != 0:
                print(f"| {workload} | {config} | failed: {run.stderr.strip()[-300:]} |")
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            print(
                f"| {workload} | {config} | {r['first']:.4f} | {r['plain']:.4f} | "
                f"{r['traced']:.4f} | {r['ratio']:.3f} | {r['ratio_first']:.3f} | "
                f"{r['median_paired']:.3f} | {r['refused'] or ''} |"
                f"  ({time.perf_counter() - began:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()

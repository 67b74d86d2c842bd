"""probe_host.c's steps from a Python process, with chosen modules imported first (issue #7).

    python3 tests/data/gpu/probe_from_python.py [MODULE|/PATH ...]   # e.g. numpy cupy

Loads sass_probe.cu's library (PROBE_LIB, default /tmp/libsass_probe.so) with ctypes after
importing each MODULE (loading each /PATH with ctypes, e.g. a libcupti), then: cuInit, primary
context, the probe's CUPTI setup, gt_kernel from gt_sm90.cubin loaded and launched by the
probe, its collect. Prints ``RESULT records=N``. PFP_STEPS="setup load gt collect disable
enable gt collect ..." runs such a sequence instead (setup/setup0/setupN = init, SetConfig,
Enable lazy/not lazy/no Enable; load = gt_sm90.cubin; enable/enable0, disable, gt, own = the
probe's own kernel, memset, collect, unset, deinit) and prints each step's result.
PFP_ACTIVITY=CONCURRENT_KERNEL,... turns those CUPTI activity kinds on first (as pyrun does).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import time
from pathlib import Path

CUBIN = Path(__file__).resolve().parent / "gt_sm90.cubin"


def main(modules: list[str]) -> int:
    for name in modules:
        if name.startswith("/"):
            ctypes.CDLL(name)
        else:
            importlib.import_module(name)
    probe = ctypes.CDLL(os.environ.get("PROBE_LIB", "/tmp/libsass_probe.so"))
    cuda = ctypes.CDLL("libcuda.so.1")
    probe.probe_load_cubin.restype = ctypes.c_void_p
    probe.probe_load_cubin.argtypes = [ctypes.c_char_p]
    probe.probe_launch_function.argtypes = [ctypes.c_void_p, ctypes.c_int]
    probe.probe_collect.restype = ctypes.c_longlong
    context = ctypes.c_void_p(0)
    status = (
        cuda.cuInit(0),
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0),
        cuda.cuCtxSetCurrent(context),
    )
    activity = [k for k in os.environ.get("PFP_ACTIVITY", "").split(",") if k]
    if activity:  # cupti-python activity kinds on (CONCURRENT_KERNEL, MEMSET, ...), as pyrun
        from cupti import cupti

        cupti.activity_register_callbacks(lambda: (8 << 20, 0), lambda records: None)
        for kind in activity:
            cupti.activity_enable(getattr(cupti.ActivityKind, kind))
    steps = os.environ.get("PFP_STEPS", "")
    if steps:  # a sequence: enable disable gt own memset collect, after the setup (enabled)
        probe.probe_disable.restype = ctypes.c_longlong
        buffer = ctypes.c_uint64(0)
        cuda.cuMemAlloc_v2(ctypes.byref(buffer), ctypes.c_size_t(1 << 20))
        function = None
        probe.probe_executed.restype = ctypes.c_ulonglong
        said = []
        for step in steps.split():
            start = time.perf_counter()
            if step in ("setup", "setup0", "setupN"):  # init, SetConfig, Enable lazy/not/none
                lazy = {"setup": 1, "setup0": 0, "setupN": -1}[step]
                said.append(f"{step}={probe.probe_setup(lazy, 0)}")
            elif step == "load":
                function = probe.probe_load_cubin(str(CUBIN).encode())
                said.append("load")
            elif step in ("enable", "enable0"):
                said.append(f"{step}={probe.probe_enable(int(step == 'enable'))}")
            elif step == "unset":
                said.append(f"unset={probe.probe_unset()}")
            elif step == "deinit":
                said.append(f"deinit={probe.probe_deinit()}")
            elif step == "disable":
                said.append(f"disable={probe.probe_disable()}")
            elif step == "gt":
                probe.probe_launch_function(function, 64)
                said.append("gt")
            elif step == "own":
                probe.probe_launch(1000)
                said.append("own")
            elif step == "memset":
                cuda.cuMemsetD8_v2(buffer, ctypes.c_ubyte(0), ctypes.c_size_t(1 << 20))
                cuda.cuCtxSynchronize()
                said.append("memset")
            elif step == "collect":
                said.append(f"collect={probe.probe_collect()}/{probe.probe_executed()}")
            said[-1] += f"({(time.perf_counter() - start) * 1e3:.1f}ms)"
        print("RESULT " + " ".join(said), flush=True)
        return 0

    # PFP_MEMSET: where a cuMemsetD8 runs — "" nowhere, or any of before_setup, after_setup,
    # after_load, between (after the first collect, before a second launch)
    where = os.environ.get("PFP_MEMSET", "").split(",")
    buffer = ctypes.c_uint64(0)
    cuda.cuMemAlloc_v2(ctypes.byref(buffer), ctypes.c_size_t(1 << 20))

    def memset(step: str) -> None:
        if step in where:
            cuda.cuMemsetD8_v2(buffer, ctypes.c_ubyte(0), ctypes.c_size_t(1 << 20))
            cuda.cuCtxSynchronize()

    memset("before_setup")
    probe.probe_setup(1, 0)
    memset("after_setup")
    function = probe.probe_load_cubin(str(CUBIN).encode())
    memset("after_load")
    probe.probe_launch_function(function, 64)
    records = int(probe.probe_collect())
    memset("between")
    probe.probe_launch_function(function, 64)
    again = int(probe.probe_collect())
    print(
        f"RESULT records={records} then={again} memset={where} imports={modules} cuda={status}",
        flush=True,
    )
    return 0 if records > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What timing synchronizations in the C hook (``sync=api``) costs per call, without a GPU.

    PYTHONPATH=src python3 benchmarks/gpu_sync_cost.py [--calls 200000] [--rounds 5]

libcupti's stand-in (``tests/data/gpu/fake_cupti.c``, built here with ``cc``) makes
``--calls`` runtime synchronization calls, each with a driver call inside (cudaDeviceSynchronize
makes cuCtxSynchronize), from C on a thread with no Python frame, as a runtime's worker does:
the hook records each as an operation without Python. Rounds alternate the same calls with the
hook timing them (``sync_apis`` names the runtime call: two timestamps, one row) and without
(the operation only, as under ``sync=activity``); the process's CPU time per call is compared
(the main thread sleeps meanwhile), and the rows are then taken as the buffer thread takes
them (``take_syncs`` and the conversion to activity rows), per row. The stand-in's clock is an
atomic counter; CUPTI's ``cuptiGetTimestamp`` reads the system clock (some 20-50 ns more per
timestamp on Linux, two per call). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sysconfig
import tempfile
import time

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import syncapi
from pyhpctk.measure.gpu.cupti.backend import load_hook

FAKE = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gpu", "fake_cupti.c")
RUNTIME, DRIVER = 2, 1
RT_SYNC, DRV_SYNC = 165, 17  # cudaDeviceSynchronize, cuCtxSynchronize


def _fake() -> str:
    out = os.path.join(tempfile.mkdtemp(prefix="fake-cupti-"), "libcupti_fake.so")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", out, FAKE, "-lpthread", "-ldl"], check=True
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    native = load_hook()
    assert native is not None, "the C hook is not built"
    path = _fake()
    fake = ctypes.CDLL(path)
    done = ctypes.PyDLL(path).fake_worker_done
    native.reset()
    native.configure(
        [(RUNTIME, RT_SYNC, act.SYNC, 0, 0), (DRIVER, DRV_SYNC, act.SYNC, 0, 0)],
        lambda kind, correlation, multi: 1,
        None,
        0xFFFFFFFF,
        0xFFFFFFFF,
    )
    entries = [
        (RUNTIME, RT_SYNC, act.SYNC_CONTEXT, 0, 0),
        (DRIVER, DRV_SYNC, act.SYNC_CONTEXT, 0, 0),
    ]
    native.subscribe(path)
    per_call: dict[str, list[float]] = {"activity": [], "api": []}
    take_ns: list[float] = []
    first = 1
    try:
        for _ in range(args.rounds):
            for mode in ("activity", "api"):
                native.sync_apis(entries if mode == "api" else [])  # (subscribed: ids enabled)
                began = time.process_time_ns()
                fake.fake_worker_start(args.calls, RT_SYNC, DRV_SYNC, first)
                while not done():
                    time.sleep(0.001)
                per_call[mode].append((time.process_time_ns() - began) / args.calls)
                first += 2 * args.calls
                native.drain()  # the operations, as the monitor drains them
                began = time.perf_counter_ns()
                rows = syncapi.activity_rows(native.take_syncs())
                if mode == "api":
                    assert len(rows) == args.calls, len(rows)
                    take_ns.append((time.perf_counter_ns() - began) / args.calls)
    finally:
        native.unsubscribe()
        native.reset()
    activity, api = statistics.median(per_call["activity"]), statistics.median(per_call["api"])
    print(
        json.dumps(
            {
                "calls": args.calls,
                "rounds": args.rounds,
                "cpu_ns_per_call_activity": round(activity, 1),
                "cpu_ns_per_call_api": round(api, 1),
                "added_ns_per_call": round(api - activity, 1),
                "ratio": round(api / activity, 3),
                "take_ns_per_row": round(statistics.median(take_ns), 1),
                "per_round": {k: [round(v, 1) for v in values] for k, values in per_call.items()},
            }
        )
    )


if __name__ == "__main__":
    main()

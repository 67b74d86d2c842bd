"""Record the GPU activity fixture the simulated backend replays (run on a machine with a GPU).

    PYTHONPATH=src python3 tests/data/gpu/record_cupy.py tests/data/gpu/cupy_streams.json

Runs a small CuPy program on two application threads and three streams (default stream and two
created ones): kernels (elementwise and reductions), host-to-device, device-to-host and
device-to-device copies, memsets, allocations and frees (CuPy's memory pool turned off so every
array is a cudaMalloc/cudaFree), stream and device synchronizations. CUPTI (through
``cupti-python``, one Python object per record: the plain, documented path) reports the
operations (callbacks, with each one's thread and call site) and the activities (buffers, kept
in the order and grouping they arrived in). The result is a
:mod:`pyhpctk.measure.gpu.simulated.recording` JSON file; ``--check-raw`` also runs the
program under the raw (ctypes + numpy) buffer path and prints whether both paths saw the same
activities.
"""

from __future__ import annotations

import json
import sys
import threading

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.cupti.backend import CuptiBackend
from pyhpctk.measure.gpu.simulated.recording import OPERATION_DTYPE, Recording, save


class Recorder:
    """Stands in for the GPU monitor: keeps what the CUPTI backend reports."""

    def __init__(self) -> None:
        self.session = None
        self.errors: list[str] = []
        self.limits = act.DeviceLimits()
        self.ops: list[tuple[int, int, int, int]] = []
        self.batches: list[np.ndarray] = []
        self.functions: list[str] = []
        self.dropped = 0
        self.threads: dict[int, int] = {}
        self.sites: dict[tuple[str, int], int] = {}
        self.modules = 0

    def operation(self, kind: int, correlation: int, multi: bool = False) -> None:
        thread = self.threads.setdefault(threading.get_ident(), len(self.threads))
        frame = sys._getframe(1)
        while frame is not None and "pyhpctk" in frame.f_code.co_filename:
            frame = frame.f_back
        where = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("", 0)
        site = self.sites.setdefault(where, len(self.sites))
        self.ops.append((thread, correlation, kind, site))

    def buffer_completed(self, records: np.ndarray, functions: list[str], dropped: int) -> None:
        self.batches.append(records.copy())
        self.functions = list(functions)
        self.dropped += dropped

    def module_loaded(self, cubin: bytes) -> None:
        self.modules += 1


def workload(cp: object) -> None:
    """Two threads, three streams, every kind of operation (small: the fixture stays small)."""
    cp.cuda.set_allocator(None)  # type: ignore[attr-defined]  # every array: cudaMalloc/cudaFree
    host = np.arange(4096, dtype=np.float32)

    def work(seed: int) -> None:
        stream = cp.cuda.Stream(non_blocking=True)  # type: ignore[attr-defined]
        with stream:
            x = cp.asarray(host + seed)  # type: ignore[attr-defined]  # H2D copy
            y = cp.zeros_like(x)  # type: ignore[attr-defined]  # memset
            for _ in range(20):
                y = y + x * 2.0  # elementwise kernels
            total = float(y.sum())  # reduction, D2H copy, sync
            z = y.copy()  # D2D copy
            stream.synchronize()
            del x, y, z
        assert total > 0

    other = threading.Thread(target=work, args=(1,))
    other.start()
    work(2)
    other.join()
    a = cp.ones((256, 256), dtype=cp.float32)  # type: ignore[attr-defined]  # default stream
    for _ in range(10):
        a = a @ a / 256.0
    cp.cuda.Device().synchronize()  # type: ignore[attr-defined]
    a.get()


def record(mode: str) -> tuple[Recorder, CuptiBackend]:
    import cupy as cp

    recorder = Recorder()
    backend = CuptiBackend(records=mode)
    backend.start(recorder)  # type: ignore[arg-type]
    workload(cp)
    backend.stop()
    recorder.limits = backend.limits()
    return recorder, backend


def summary(records: np.ndarray) -> dict[str, list[int]]:
    out = {}
    for kind, name in act.KIND_NAMES.items():
        rows = records[records["kind"] == kind]
        out[name] = [
            len(rows),
            int(rows["bytes"].sum()),
            int((rows["end"] - rows["start"]).astype(np.int64).clip(0).sum() > 0),
        ]
    return out


def main(argv: list[str]) -> int:
    mode = "raw" if "--raw" in argv else "objects"
    paths = [arg for arg in argv if not arg.startswith("--")]
    recorder, backend = record(mode)
    records = np.concatenate(recorder.batches) if recorder.batches else act.empty_activities()
    ops = np.zeros(len(recorder.ops), dtype=OPERATION_DTYPE)
    for index, op in enumerate(recorder.ops):
        ops[index] = op
    print(
        mode,
        "summary",
        json.dumps(summary(records)),
        "ops",
        len(ops),
        "modules",
        recorder.modules,
        "threads",
        len(recorder.threads),
        "sites",
        len(recorder.sites),
        "buffers",
        len(recorder.batches),
        "dropped",
        recorder.dropped,
        "errors",
        recorder.errors[:3],
        "counts",
        backend.buffers.record_counts,
    )
    matched = len(set(ops["correlation"].tolist()) & set(records["correlation"].tolist()))
    print(mode, "activities with a recorded operation:", matched, "of", len(records))
    print(
        mode,
        "record sizes",
        backend.record_sizes,
        "fast walk",
        backend.fast_walk,
        "walk mismatches",
        backend.walk_mismatches,
        "unknown apis",
        backend.callbacks.unknown_apis,
    )
    kernels = records[records["kind"] == act.KERNEL]
    print(mode, "kernel sample", kernels[:2].tolist(), recorder.functions[:3])
    if paths:
        recording = Recording(
            backend.limits(),
            recorder.functions,
            ops,
            records,
            [len(batch) for batch in recorder.batches],
            recorder.dropped,
            note=(
                f"tests/data/gpu/record_cupy.py ({mode} buffer path) on one NVIDIA H200, CUDA 13, "
                "CuPy, cupti-python: 2 threads, 3 streams, kernels, copies, memsets, "
                "allocations, frees, syncs"
            ),
        )
        save(recording, paths[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

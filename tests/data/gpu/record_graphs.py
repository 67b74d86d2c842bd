"""Record a CUDA-graph program's GPU activity for the simulated backend (run on the device).

    PYTHONPATH=src python3 tests/data/gpu/record_graphs.py tests/data/gpu/graphs_h200.json

A torch.cuda.CUDAGraph captures four kernels from four lines of ``torch_body`` and is replayed
``--replays`` times from one line; a CuPy graph captures two kernels from two lines of
``cupy_body`` and is launched as often from another. CUPTI (cupti-python's callbacks and
activity objects: the documented path) reports every API call with its call site, every graph
node made (CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, at the capturing line) and cloned (at the
instantiation), and every activity with its graph node id. The result is a recording (format
1.1, :mod:`pyhpctk.measure.gpu.simulated.recording`); ``tests/test_gpu_graphs.py`` replays it. The
summary line prints the kernels per (launch line, capture line) that the test will expect.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.cupti.backend import CuptiBackend
from pyhpctk.measure.gpu.simulated.recording import OPERATION_DTYPE, Recording, save


class Recorder:
    """Stands in for the GPU monitor (backend.MonitorPort): keeps what CUPTI reports."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.ops: list[tuple[int, int, int, int]] = []
        self.batches: list[np.ndarray] = []
        self.functions: list[str] = []
        self.threads: dict[int, int] = {}
        self.sites: dict[tuple[str, int], int] = {}
        self.clones: dict[int, int] = {}
        self.limits = act.DeviceLimits()

    def _site(self) -> tuple[int, int]:
        thread = self.threads.setdefault(threading.get_ident(), len(self.threads))
        frame = sys._getframe(2)
        while frame is not None and "pyhpctk" in frame.f_code.co_filename:
            frame = frame.f_back
        where = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("", 0)
        return thread, self.sites.setdefault(where, len(self.sites))

    def operation(self, kind: int, correlation: int, multi: bool = False) -> None:
        thread, site = self._site()
        self.ops.append((thread, correlation, kind, site))

    def enter(self, kind: int, correlation: int, multi: bool = False) -> None:
        thread, site = self._site()
        self.ops.append((thread, correlation, kind, site))

    def exit(self) -> None:
        pass

    def operation_token(self, kind: int, correlation: int, multi: bool = False) -> int:
        thread, site = self._site()
        self.ops.append((thread, correlation, kind, site))
        return -1

    def graph_node(self, node: int, original: int = 0) -> None:
        if original:
            self.clones[node] = original
            return
        thread, site = self._site()
        self.ops.append((thread, node, act.GRAPH_NODE, site))

    def buffer_completed(
        self, records: np.ndarray, functions: object = (), dropped: int = 0
    ) -> None:
        self.batches.append(records.copy())
        self.functions = list(functions)  # type: ignore[call-overload]

    def own_call(self, correlation: int) -> None:
        pass

    def module_loaded(self, cubin: bytes) -> None:
        pass

    def set_limits(self, limits: act.DeviceLimits) -> None:
        self.limits = limits

    def pc_samples(self, *args: object) -> None:
        pass

    def inst_counts(self, *args: object) -> None:
        pass

    def exclude_current_thread(self) -> None:
        pass

    def attach_hook(self, hook: object) -> None:
        pass


def torch_body(torch: object, x: object) -> object:
    a = x * 2.0  # type: ignore[operator]  # TORCH-A
    b = a + 1.0  # TORCH-B
    c = torch.relu(b)  # type: ignore[attr-defined]  # TORCH-C
    return c.sum()  # TORCH-D


def torch_graph(replays: int) -> None:
    import torch

    x = torch.randn(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch asks
        for _ in range(2):
            torch_body(torch, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch_body(torch, x)
    for _ in range(replays):
        graph.replay()  # TORCH-REPLAY
    torch.cuda.synchronize()


def cupy_body(cp: object, x: object) -> object:
    y = x * 3.0  # type: ignore[operator]  # CUPY-A
    return y + x  # CUPY-B


def cupy_graph(replays: int) -> None:
    import cupy as cp

    x = cp.ones(1 << 16, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cupy_body(cp, x)  # warm-up: kernels compiled outside the capture
        stream.synchronize()
        stream.begin_capture()
        cupy_body(cp, x)
        graph = stream.end_capture()
    for _ in range(replays):
        graph.launch(stream)  # CUPY-REPLAY
    stream.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--replays", type=int, default=6)
    parser.add_argument("--programs", default="torch,cupy")
    parser.add_argument(
        "--plain", action="store_true", help="run the programs only, unrecorded (under pyrun)"
    )
    args = parser.parse_args()
    if args.plain:  # pyrun subscribes to CUPTI itself: CUPTI takes one subscriber
        for name in args.programs.split(","):
            (torch_graph if name == "torch" else cupy_graph)(args.replays)
        return 0
    recorder = Recorder()
    backend = CuptiBackend(records="objects", hook="python")
    backend.start(recorder)  # type: ignore[arg-type]
    for name in args.programs.split(","):
        (torch_graph if name == "torch" else cupy_graph)(args.replays)
    backend.stop()
    records = np.concatenate(recorder.batches) if recorder.batches else act.empty_activities()
    ops = np.zeros(len(recorder.ops), dtype=OPERATION_DTYPE)
    for index, op in enumerate(recorder.ops):
        ops[index] = op
    line_of = {
        site: f"{file.rsplit('/', 1)[-1]}:{line}" for (file, line), site in recorder.sites.items()
    }
    nodes = ops[ops["kind"] == act.GRAPH_NODE]
    made_at = dict(zip(nodes["correlation"].tolist(), nodes["site"].tolist(), strict=True))
    others = ops[ops["kind"] != act.GRAPH_NODE]
    launched_at = dict(zip(others["correlation"].tolist(), others["site"].tolist(), strict=True))
    kernels = records[records["kind"] == act.KERNEL]
    pairs: Counter[str] = Counter()
    for correlation, node in zip(
        kernels["correlation"].tolist(), kernels["graph_node"].tolist(), strict=True
    ):
        capture = made_at.get(recorder.clones.get(node, node), -1) if node else -1
        launch = line_of.get(launched_at.get(correlation, -1), "?")
        pairs[f"{launch} <- {line_of.get(capture, '-')}"] += 1
    print(
        json.dumps(
            {
                "ops": len(ops),
                "graph_nodes": len(nodes),
                "clones": len(recorder.clones),
                "activities": len(records),
                "graph_kernels": int((kernels["graph_node"] != 0).sum()),
                "kernels_by_launch_and_capture": dict(sorted(pairs.items())),
                "errors": recorder.errors[:3],
                "unknown_apis": backend.callbacks.unknown_apis,
            }
        )
    )
    if args.out:
        save(
            Recording(
                backend.limits(),
                recorder.functions,
                ops,
                records,
                [len(batch) for batch in recorder.batches],
                note=(
                    "tests/data/gpu/record_graphs.py on one NVIDIA H200, CUDA 13, torch, CuPy,"
                    f" cupti-python (objects): torch.cuda.CUDAGraph of 4 kernels and a CuPy graph"
                    f" of 2, each replayed {args.replays} times"
                ),
                clones=recorder.clones,
            ),
            args.out,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

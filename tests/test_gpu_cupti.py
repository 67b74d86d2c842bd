"""The CUPTI backend on a real NVIDIA GPU (issue #6, item 6): counts, times, bytes, threads.

Marked ``gpu``: CI deselects these; they run on the device machine. Each test drives a real
CuPy program under a library-level :class:`Session` with ``gpu=nvidia`` installed, then reads
the per-thread CCTs (and the files written) to check the attribution.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from formats_helpers import STREAM_PROFILES
from pyhpctk.formats import hpcrun, hpctrace
from pyhpctk.measure.gpu import install, shutdown
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

pytestmark = pytest.mark.gpu


def _session(tmp_path: Path, trace: bool = True) -> Session:
    session = Session(MeasureOptions(str(tmp_path), trace=trace, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    return session


def _under(session: Session, state_cct: object, code: object) -> set[int]:
    """Nodes of a CCT whose call path passes through a frame of ``code``."""
    cct = state_cct
    fid = session.functions.fid(code)
    inside: set[int] = set()
    for node in range(len(cct)):  # type: ignore[arg-type]
        walk = node
        while walk >= 0:
            if cct.lm[walk] == session.python_lm and cct.ip[walk] >> 32 == fid:  # type: ignore[attr-defined]
                inside.add(node)
                break
            walk = cct.parent[walk]  # type: ignore[attr-defined]
    return inside


def _metric(session: Session, cct: object, nodes: set[int], metric: int) -> float:
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = cct.kinds.get(kind.name)  # type: ignore[attr-defined]
    if store is None:
        return 0.0
    return sum(store.get(node, metric) for node in nodes)


def warm_up(cp: object, x: object) -> None:
    launch_loop(cp, x, 20)


def launch_loop(cp: object, x: object, count: int) -> object:
    for _ in range(count):
        cp.multiply(x, 1.0000001, out=x)  # type: ignore[attr-defined]  # in place: no allocation
    return x


def copies(cp: object, host: np.ndarray) -> np.ndarray:
    device = cp.asarray(host)  # type: ignore[attr-defined]
    return device.get()  # type: ignore[no-any-return]


def test_kernel_count_time_and_bytes_match_the_program(tmp_path: Path) -> None:
    import cupy as cp

    session = _session(tmp_path)
    monitor = install(session, "gpu=nvidia")
    x = cp.ones(1 << 28, dtype=cp.float32)  # 1 GiB: each kernel runs ~1 ms, back to back
    warm_up(cp, x)  # kernel compiled, clocks up
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    launches = 200
    x = launch_loop(cp, x, launches)
    stop.record()
    stop.synchronize()
    event_seconds = cp.cuda.get_elapsed_time(start, stop) / 1e3
    host = np.arange(1 << 20, dtype=np.float32)
    back = copies(cp, host)
    assert np.array_equal(back, host)
    stats = shutdown(monitor)
    main = session.states[threading.get_ident()].cct
    warm_nodes = _under(session, main, warm_up.__code__)
    loop_nodes = _under(session, main, launch_loop.__code__) - warm_nodes
    assert _metric(session, main, warm_nodes, gm.GKER_COUNT) == 20
    assert _metric(session, main, loop_nodes, gm.GKER_COUNT) == launches
    kernel_seconds = _metric(session, main, loop_nodes, gm.GKER)
    assert abs(kernel_seconds - event_seconds) <= 0.02 * event_seconds, (
        kernel_seconds,
        event_seconds,
    )
    copy_nodes = _under(session, main, copies.__code__)
    assert _metric(session, main, copy_nodes, gm.GXCOPY_BYTES + 1) == host.nbytes  # H2D
    assert _metric(session, main, copy_nodes, gm.GXCOPY_BYTES + 2) == host.nbytes  # D2H
    # Every activity an API call started is attributed; the driver's own (correlation id 0:
    # static memory of lazily loaded modules) are counted apart, under <GPU?????>.
    assert stats.unmatched == 0 and stats.dropped == 0
    assert stats.matched + stats.internal == stats.activities > launches
    gpubins = list((tmp_path / "gpubins").glob("*.gpubin"))
    assert gpubins, "every loaded module is saved"
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = main.kinds[kind.name]
    kernel_nodes = [n for n in loop_nodes if store.get(n, gm.GKER_COUNT)]
    paths = {lm_id: path for lm_id, path, _ in session.load_modules}
    assert kernel_nodes
    assert all(paths.get(main.lm[n], "").endswith(".gpubin") for n in kernel_nodes)
    session.finish()
    streams = sorted(tmp_path.glob(STREAM_PROFILES))
    assert streams, "one profile and trace per GPU stream"
    records = 0
    for path in streams:  # (the driver's own activities are traced too, on their streams)
        profile = hpcrun.read(path)
        trace = hpctrace.read(path.with_suffix(".hpctrace"))
        assert hpcrun.verify(profile) == [] and hpctrace.verify_trace(trace, profile) == []
        assert trace.flags == hpctrace.TRACE_FLAG_CALL_TRACE
        records += len(trace.records)
    assert records == 2 * stats.activities  # every activity's start and end, on its stream
    for path in tmp_path.glob("*-000-*.hpcrun"):
        assert hpcrun.verify(hpcrun.read(path)) == []


def thread_loop(x: object, count: int) -> object:
    for _ in range(count):
        x = x + 1.0  # type: ignore[operator]
    return x


def thread_work(cp: object, count: int, done: list[int]) -> None:
    x = cp.ones(1024, dtype=cp.float32)  # type: ignore[attr-defined]
    thread_loop(x, count)
    cp.cuda.get_current_stream().synchronize()  # type: ignore[attr-defined]
    done.append(count)


def test_threads_launching_at_once_are_attributed_to_their_own_thread(tmp_path: Path) -> None:
    import cupy as cp

    session = _session(tmp_path, trace=False)
    monitor = install(session, "gpu=nvidia")
    counts = [300, 400, 500, 600]
    done: list[int] = []
    barrier = threading.Barrier(len(counts))
    idents: dict[int, int] = {}

    def body(count: int) -> None:
        session.register_thread(threading.current_thread())
        idents[count] = threading.get_ident()
        with cp.cuda.Stream(non_blocking=True):
            cp.ones(8, dtype=cp.float32) + 0  # warm the kernel cache before the race
            barrier.wait()
            thread_work(cp, count, done)

    threads = [threading.Thread(target=body, args=(n,)) for n in counts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = shutdown(monitor)
    assert sorted(done) == counts
    for count in counts:
        cct = session.states[idents[count]].cct
        nodes = _under(session, cct, thread_loop.__code__)
        assert _metric(session, cct, nodes, gm.GKER_COUNT) == count
    assert stats.unmatched == 0


def torch_layer(torch: object, layer: object, x: object) -> object:
    # relu: a kernel of PyTorch's own, launched through the runtime (cudaLaunchKernel)
    return torch.relu(layer(x))  # type: ignore[attr-defined, operator]


def test_pytorch_launches_are_one_operation_each_and_sites_are_unwound_once(
    tmp_path: Path,
) -> None:
    """PyTorch launches through the runtime (cudaLaunchKernel, which makes cuLaunchKernel):
    each launch is one operation whose activity comes (issue #18: the inner driver call is
    not an operation of its own), and a model's call sites enter Python once, not per step."""
    import torch

    layers = [torch.nn.Linear(64, 64).cuda() for _ in range(120)]
    x = torch.randn(32, 64, device="cuda")

    def deeper(i: int, y: object) -> object:
        # Layer i is launched i frames deep: 120 distinct call chains, as a model's nested
        # modules make them (one line in a loop would be one chain).
        if i == len(layers):
            return y
        return deeper(i + 1, torch_layer(torch, layers[i], y))

    def step() -> None:
        deeper(0, x)
        torch.cuda.synchronize()

    step()  # cuBLAS and the kernels loaded before measuring
    session = _session(tmp_path, trace=False)
    monitor = install(session, "gpu=nvidia")
    native = monitor.backend.native  # type: ignore[attr-defined]
    assert native is not None, "the C hook is not built"
    before = after = native.stats()
    for index in range(6):  # one call site: the first step meets every chain, the others none
        step()
        if index == 0:
            before = native.stats()
    after = native.stats()
    stats = shutdown(monitor)
    assert stats.unmatched == 0 and stats.matched + stats.internal == stats.activities > 5 * 120
    assert after["inner"] > 0  # runtime calls made driver calls: not operations
    assert stats.unmatched_operations <= 0.05 * stats.operations, stats.as_dict()
    assert before["slow"] >= 120, before  # the first step met each chain once
    # No site through Python again (a 64-site cache unwound hundreds per step here).
    assert after["slow"] - before["slow"] <= 2, (before, after)
    main = session.states[threading.get_ident()].cct
    nodes = _under(session, main, torch_layer.__code__)
    assert _metric(session, main, nodes, gm.GKER_COUNT) >= 6 * 2 * 120  # every step's launches

"""Synchronizations timed by the C hook (``sync=api``) against CUPTI's own records, on a GPU.

Marked ``gpu``: CI deselects these; they run on the device machine
(``tests/data/gpu/device_pytorch.sh``, stage ``tests``). A small CuPy program makes each kind of
synchronization CUPTI reports (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
``cudaEventSynchronize``, ``cudaStreamWaitEvent``, and the queries ``cudaEventQuery`` and
``cudaStreamQuery``), each after a kernel long enough to wait for. With ``sync=both`` CUPTI's
SYNCHRONIZATION records go to the monitor and the hook's rows are kept aside: the same calls
must give the same rows (correlation id, type, context, stream) and about the same interval.
The expected values come from CUPTI's records, never from the hook.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import install, shutdown
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.cupti.backend import CuptiBackend
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session
from test_gpu_sync_api import _under  # the metric by line of a function, in a thread's CCT

pytestmark = pytest.mark.gpu

ROUNDS = 20
#: How far the hook's interval may lie from CUPTI's (ns): the hook's brackets the call from the
#: runtime's callback, CUPTI's the wait inside the driver.
SLACK_NS = 50_000
#: the GPU sync metrics the line test reads
SYNC_METRICS = (
    gm.GSYNC,
    gm.GSYNC_COUNT,
    gm.GSYNC_TIME + act.SYNC_STREAM,
    gm.GSYNC_TIME + act.SYNC_CONTEXT,
)


class Recorder:
    """Stands in for the GPU monitor: keeps the buffers; every call site goes to Python."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.batches: list[np.ndarray] = []

    def operation(self, kind: int, correlation: int, multi: bool = False) -> None:
        pass

    def operation_token(self, kind: int, correlation: int, multi: bool = False) -> int:
        return -1

    def buffer_completed(self, records: np.ndarray, functions: object, dropped: int) -> None:
        self.batches.append(records.copy())

    def attach_hook(self, hook: object) -> None:
        pass

    def exclude_current_thread(self) -> None:
        pass

    def set_limits(self, limits: object) -> None:
        pass

    def own_call(self, correlation: int) -> None:
        pass

    def module_loaded(self, cubin: bytes) -> None:
        pass


def synchronizations(cp: object, rounds: int) -> None:
    """Each kind of synchronization, each after a kernel that keeps the GPU busy a while."""
    x = cp.ones((2048, 2048), dtype=cp.float32)  # type: ignore[attr-defined]
    stream = cp.cuda.Stream(non_blocking=True)  # type: ignore[attr-defined]
    other = cp.cuda.Stream(non_blocking=True)  # type: ignore[attr-defined]
    event = cp.cuda.Event()  # type: ignore[attr-defined]
    for _ in range(rounds):
        x = x @ x / 2048.0
        cp.cuda.Device().synchronize()  # type: ignore[attr-defined]  # CONTEXT
        with stream:
            x = x @ x / 2048.0
        stream.synchronize()  # STREAM
        with stream:
            x = x @ x / 2048.0
        event.record(stream)
        other.wait_event(event)  # STREAM_WAIT_EVENT
        event.synchronize()  # EVENT
        with stream:
            x = x @ x / 2048.0
        event.record(stream)
        event.done  # cudaEventQuery: EVENT  # noqa: B018
        stream.done  # cudaStreamQuery: STREAM  # noqa: B018
        stream.synchronize()


def _sync_rows(batches: list[np.ndarray]) -> np.ndarray:
    rows = np.concatenate(batches) if batches else act.empty_activities()
    return np.sort(rows[rows["kind"] == act.SYNC], order="correlation")


def test_the_hooks_rows_are_cuptis_records() -> None:
    cp = pytest.importorskip("cupy")
    synchronizations(cp, 1)  # CUDA initialised, kernels loaded: outside the measurement
    recorder = Recorder()
    backend = CuptiBackend(hook="c", sync="both")
    backend.start(recorder)  # type: ignore[arg-type]
    try:
        synchronizations(cp, ROUNDS)
        backend.flush()
    finally:
        backend.stop()
    assert backend.api_syncs is not None
    cupti = _sync_rows(recorder.batches)
    hook = _sync_rows(backend.api_syncs.kept)
    by_type = {
        name: (int((cupti["sync_kind"] == kind).sum()), int((hook["sync_kind"] == kind).sum()))
        for kind, (name, _) in enumerate(gm.SYNC_KINDS)
    }
    print(f"sync rows by type (CUPTI, hook): {by_type}")
    assert len(cupti) >= 4 * ROUNDS, by_type  # the four blocking kinds, at least
    assert cupti["correlation"].tolist() == hook["correlation"].tolist(), by_type
    for field in ("sync_kind", "context", "stream"):
        assert cupti[field].tolist() == hook[field].tolist(), field
    start = hook["start"].astype(np.int64) - cupti["start"].astype(np.int64)
    end = hook["end"].astype(np.int64) - cupti["end"].astype(np.int64)
    waited = (cupti["end"] - cupti["start"]).astype(np.int64)
    timed = (hook["end"] - hook["start"]).astype(np.int64)
    print(
        f"hook - CUPTI (ns): start median {np.median(start):.0f} range {start.min()}..{start.max()}"
        f", end median {np.median(end):.0f} range {end.min()}..{end.max()}"
        f"; CUPTI's durations median {np.median(waited):.0f}, the hook's {np.median(timed):.0f}"
    )
    assert np.all(np.abs(start) <= SLACK_NS) and np.all(np.abs(end) <= SLACK_NS)
    assert np.all(np.abs(timed - waited) <= np.maximum(SLACK_NS, waited // 10))


def synchronized_lines(cp: object, rounds: int) -> None:
    x = cp.ones((2048, 2048), dtype=cp.float32)  # type: ignore[attr-defined]
    stream = cp.cuda.Stream(non_blocking=True)  # type: ignore[attr-defined]
    for _ in range(rounds):
        with stream:
            x = x @ x / 2048.0
        stream.synchronize()  # STREAM LINE
        x = x @ x / 2048.0
        cp.cuda.Device().synchronize()  # type: ignore[attr-defined]  # CONTEXT LINE


def test_synchronizations_timed_by_the_hook_land_on_their_lines(tmp_path: Path) -> None:
    """The default gpu=nvidia (sync=api): no SYNCHRONIZATION record from CUPTI, and each
    synchronizing line gets its calls, of its type, with the time CUPTI-free timing gave."""
    cp = pytest.importorskip("cupy")
    synchronized_lines(cp, 1)
    session = Session(MeasureOptions(str(tmp_path), trace=False, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    monitor = install(session, "gpu=nvidia")
    backend = monitor.backend
    assert isinstance(backend, CuptiBackend) and backend.api_syncs is not None
    synchronized_lines(cp, ROUNDS)
    stats = shutdown(monitor, report=False)
    assert (
        act.SYNC not in backend.buffers._kinds.values()
    )  # CUPTI's SYNCHRONIZATION kind stayed off
    assert backend.buffers.record_counts.get("sync", 0) == 0
    assert backend.api_syncs.rows >= 2 * ROUNDS and stats.unmatched == 0
    source = Path(__file__).read_text().splitlines()
    lines = {
        name: next(i for i, text in enumerate(source, 1) if f"# {name} LINE" in text)
        for name in ("STREAM", "CONTEXT")
    }

    def at(line: str, metric: int) -> float:
        return _under(session, synchronized_lines.__code__, metric).get(lines[line], 0.0)

    stream = {m: at("STREAM", m) for m in SYNC_METRICS}
    context = {m: at("CONTEXT", m) for m in SYNC_METRICS}
    assert stream[gm.GSYNC_COUNT] == ROUNDS and context[gm.GSYNC_COUNT] == ROUNDS
    assert stream[gm.GSYNC_TIME + act.SYNC_STREAM] > 0 and stream[gm.GSYNC] > 0
    assert context[gm.GSYNC_TIME + act.SYNC_CONTEXT] > 0
    assert stream[gm.GSYNC_TIME + act.SYNC_CONTEXT] == 0
    assert context[gm.GSYNC_TIME + act.SYNC_STREAM] == 0

"""Synchronizations timed by the C hook at the API (``sync=api``), without a GPU.

The C callback is run as CUPTI would run it (``invoke()``, or libcupti's stand-in
``tests/data/gpu/fake_cupti.c`` through ctypes) and its rows are read back; the monitor side
runs through the simulated backend, whose ``sync=api`` issues each synchronization through the
hook for as long as it lasted on the H200 it was recorded on. Expected values come from the
calls the tests make, the clocks around them and the recordings, never from the hook.
The device test comparing the rows with CUPTI's own records is ``test_gpu_sync_device.py``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import install, shutdown, syncapi
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.backend import Backend
from pyhpctk.measure.gpu.cupti.backend import CuptiBackend, classify_api, load_hook
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.gpu.simulated import DEFAULT_RECORDING
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend
from pyhpctk.measure.gpu.spec import DEFAULT_SYNC, GpuSpec, parse_gpu_event
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

DRIVER, RUNTIME = 1, 2  # CUpti_CallbackDomain
# CUPTI's callback ids (cupti_runtime_cbid.h, cupti_driver_cbid.h)
RT_DEVICE_SYNC, RT_STREAM_SYNC, RT_EVENT_SYNC, RT_WAIT_EVENT = 165, 131, 137, 147
RT_EVENT_RECORD, DRV_CTX_SYNC = 135, 17
NAMES = {
    (RUNTIME, RT_DEVICE_SYNC): "cudaDeviceSynchronize_v3020",
    (RUNTIME, RT_STREAM_SYNC): "cudaStreamSynchronize_v3020",
    (RUNTIME, RT_EVENT_SYNC): "cudaEventSynchronize_v3020",
    (RUNTIME, RT_WAIT_EVENT): "cudaStreamWaitEvent_v3020",
    (RUNTIME, RT_EVENT_RECORD): "cudaEventRecord_v3020",
    (DRIVER, DRV_CTX_SYNC): "cuCtxSynchronize",
}
GPU_DIR = Path(__file__).parent / "data" / "gpu"


@pytest.fixture
def hook() -> Iterator[object]:
    native = load_hook()
    assert native is not None, "the C hook is not built: make env builds it (setup.py)"
    native.reset()
    yield native
    native.reset()


def _configure(native: object, slow: object = None) -> list[int]:
    """Every name of NAMES as an operation of kind SYNC, and the rows syncapi says they give."""
    calls: list[int] = []

    def record(kind: int, correlation: int, multi: bool) -> int:
        calls.append(correlation)
        return 3

    native.configure(  # type: ignore[attr-defined]
        [(*key, act.SYNC, 0, 0) for key in NAMES], slow or record, None, 0xFFFFFFFF, 0xFFFFFFFF
    )
    kinds = {key: act.SYNC for key in NAMES}
    native.sync_apis(syncapi.sync_entries(NAMES, kinds))  # type: ignore[attr-defined]
    return calls


def _rows(native: object) -> np.ndarray:
    return syncapi.activity_rows(native.take_syncs())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cudaDeviceSynchronize_v3020", (act.SYNC_CONTEXT, False, False)),
        ("cudaThreadSynchronize_v3020", (act.SYNC_CONTEXT, False, False)),
        ("cuCtxSynchronize", (act.SYNC_CONTEXT, False, False)),
        ("cuCtxSynchronize_v2", (act.SYNC_CONTEXT, False, False)),
        ("cudaStreamSynchronize_v3020", (act.SYNC_STREAM, True, False)),
        ("cudaStreamSynchronize_ptsz_v7000", (act.SYNC_STREAM, True, True)),
        ("cuStreamSynchronize_ptsz", (act.SYNC_STREAM, True, True)),
        ("cudaStreamQuery_v3020", (act.SYNC_STREAM, True, False)),
        ("cuStreamQuery", (act.SYNC_STREAM, True, False)),
        ("cudaEventSynchronize_v3020", (act.SYNC_EVENT, False, False)),
        ("cuEventQuery", (act.SYNC_EVENT, False, False)),
        ("cudaStreamWaitEvent_v3020", (act.SYNC_STREAM_WAIT, True, False)),
        ("cuStreamWaitEvent_ptsz", (act.SYNC_STREAM_WAIT, True, True)),
        ("cuCtxWaitEvent", (act.SYNC_STREAM_WAIT, False, False)),
        ("cudaEventRecord_v3020", None),
        ("cuEventRecordWithFlags_ptsz", None),
        ("cudaGraphEventRecordNodeGetEvent_v11010", None),
    ],
)
def test_each_synchronization_api_gives_the_row_cupti_gave(
    name: str, expected: tuple[int, bool, bool] | None
) -> None:
    assert classify_api(name) == act.SYNC  # what the backend calls a synchronization
    assert syncapi.sync_row_type(name) == expected


def test_only_synchronizations_get_entries() -> None:
    names = {**NAMES, (RUNTIME, 211): "cudaLaunchKernel_v7000"}
    kinds = {key: classify_api(name) or 0 for key, name in names.items()}
    entries = syncapi.sync_entries(names, kinds)
    assert sorted(entries) == sorted(
        [
            (RUNTIME, RT_DEVICE_SYNC, act.SYNC_CONTEXT, 0, 0),
            (RUNTIME, RT_STREAM_SYNC, act.SYNC_STREAM, 1, 0),
            (RUNTIME, RT_EVENT_SYNC, act.SYNC_EVENT, 0, 0),
            (RUNTIME, RT_WAIT_EVENT, act.SYNC_STREAM_WAIT, 1, 0),
            (DRIVER, DRV_CTX_SYNC, act.SYNC_CONTEXT, 0, 0),
        ]
    )


def test_the_row_layout_is_the_hooks(hook: object) -> None:
    assert syncapi.SYNC_ROW_DTYPE.itemsize == hook.SYNC_ROW_SIZE  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("key", "sync_kind", "stream"),
    [
        ((RUNTIME, RT_DEVICE_SYNC), act.SYNC_CONTEXT, act.NO_STREAM),
        ((RUNTIME, RT_STREAM_SYNC), act.SYNC_STREAM, 42),
        ((RUNTIME, RT_EVENT_SYNC), act.SYNC_EVENT, act.NO_STREAM),
        ((RUNTIME, RT_WAIT_EVENT), act.SYNC_STREAM_WAIT, 42),
        ((DRIVER, DRV_CTX_SYNC), act.SYNC_CONTEXT, act.NO_STREAM),
    ],
)
def test_a_synchronization_is_timed_from_its_entry_to_its_exit(
    hook: object, key: tuple[int, int], sync_kind: int, stream: int
) -> None:
    calls = _configure(hook)
    before = time.time_ns()
    hook.invoke(*key, 0, 901, 5, b"", 42)  # type: ignore[attr-defined]
    time.sleep(0.003)  # the GPU work it waits for
    hook.invoke(*key, 1, 901, 5, b"", 42)  # type: ignore[attr-defined]
    after = time.time_ns()
    rows = _rows(hook)
    assert calls == [901]  # the operation itself, as for any GPU call
    assert len(rows) == 1
    row = rows[0]
    assert row["kind"] == act.SYNC and row["sync_kind"] == sync_kind
    assert row["correlation"] == 901 and row["context"] == 5 and row["stream"] == stream
    assert before <= row["start"] <= row["end"] <= after
    assert row["end"] - row["start"] >= 3_000_000
    assert row["function"] == -1 and row["bytes"] == 0
    assert len(_rows(hook)) == 0  # taken once


def test_an_event_record_is_an_operation_but_gives_no_row(hook: object) -> None:
    calls = _configure(hook)
    hook.invoke(RUNTIME, RT_EVENT_RECORD, 0, 7)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, RT_EVENT_RECORD, 1, 7)  # type: ignore[attr-defined]
    assert calls == [7] and len(_rows(hook)) == 0


def test_configure_forgets_which_apis_give_rows(hook: object) -> None:
    _configure(hook)
    hook.configure(  # type: ignore[attr-defined]
        [(RUNTIME, RT_DEVICE_SYNC, act.SYNC, 0, 0)], lambda *a: 3, None, 0xFFFFFFFF, 0xFFFFFFFF
    )
    hook.invoke(RUNTIME, RT_DEVICE_SYNC, 0, 8)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, RT_DEVICE_SYNC, 1, 8)  # type: ignore[attr-defined]
    assert len(_rows(hook)) == 0


def test_a_driver_call_inside_a_runtime_synchronization_is_part_of_it(hook: object) -> None:
    """cudaDeviceSynchronize calls cuCtxSynchronize: one row, the runtime call's, around both."""
    _configure(hook)
    before = time.time_ns()
    hook.invoke(RUNTIME, RT_DEVICE_SYNC, 0, 20)  # type: ignore[attr-defined]
    hook.invoke(DRIVER, DRV_CTX_SYNC, 0, 21)  # type: ignore[attr-defined]
    time.sleep(0.002)
    hook.invoke(DRIVER, DRV_CTX_SYNC, 1, 21)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, RT_DEVICE_SYNC, 1, 20)  # type: ignore[attr-defined]
    rows = _rows(hook)
    assert rows["correlation"].tolist() == [20]
    assert before <= rows["start"][0] and rows["end"][0] - rows["start"][0] >= 2_000_000


def test_an_exit_whose_entry_was_not_seen_gives_no_row(hook: object) -> None:
    _configure(hook)
    hook.invoke(RUNTIME, RT_STREAM_SYNC, 1, 30)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, RT_STREAM_SYNC, 0, 31)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, RT_STREAM_SYNC, 1, 32)  # type: ignore[attr-defined]  # not 31's exit
    hook.invoke(RUNTIME, RT_STREAM_SYNC, 1, 31)  # type: ignore[attr-defined]
    assert _rows(hook)["correlation"].tolist() == [31]


def test_rows_of_threads_that_come_and_go_are_all_taken(hook: object) -> None:
    _configure(hook)
    taken: list[np.ndarray] = []
    stop = threading.Event()

    def consumer() -> None:
        while not stop.is_set():
            taken.append(_rows(hook))

    def producer(first: int) -> None:
        for correlation in range(first, first + 600):
            hook.invoke(RUNTIME, RT_DEVICE_SYNC, 0, correlation)  # type: ignore[attr-defined]
            hook.invoke(RUNTIME, RT_DEVICE_SYNC, 1, correlation)  # type: ignore[attr-defined]

    reader = threading.Thread(target=consumer)
    reader.start()
    for wave in range(3):  # threads end and their rings are freed while others still push
        threads = [
            threading.Thread(target=producer, args=(1 + 10_000 * (4 * wave + i),)) for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    stop.set()
    reader.join()
    taken.append(_rows(hook))
    correlations = np.concatenate(taken)["correlation"]
    expected = [1 + 10_000 * n + i for n in range(12) for i in range(600)]
    assert sorted(correlations.tolist()) == expected
    assert hook.sync_stats() == (len(expected), 0)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def fake_cupti(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpu_helpers import build_fake_cupti

    return build_fake_cupti(tmp_path_factory.mktemp("fake"))


def test_libcupti_gives_the_timestamps_and_the_stream_ids(hook: object, fake_cupti: Path) -> None:
    """Subscribed, the hook reads CUPTI's clock (the stand-in's moves 1000 ns per call) and
    asks CUPTI for the stream's id: the NULL stream of a _ptsz call, and the special handles
    CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2), as the NULL stream."""
    fake = ctypes.CDLL(str(fake_cupti))
    fake.fake_api_stream.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32]
    fake.fake_api_stream.argtypes += [ctypes.c_size_t, ctypes.c_size_t]
    names = {(RUNTIME, RT_STREAM_SYNC): NAMES[(RUNTIME, RT_STREAM_SYNC)]}
    names[(RUNTIME, 239)] = "cudaStreamSynchronize_ptsz_v7000"
    hook.configure(  # type: ignore[attr-defined]
        [(*key, act.SYNC, 0, 0) for key in names], lambda *a: 3, None, 0xFFFFFFFF, 0xFFFFFFFF
    )
    hook.sync_apis(syncapi.sync_entries(names, dict.fromkeys(names, act.SYNC)))  # type: ignore[attr-defined]
    hook.subscribe(str(fake_cupti))  # type: ignore[attr-defined]
    try:
        for correlation, (cbid, stream) in enumerate(
            [
                (RT_STREAM_SYNC, 7),
                (RT_STREAM_SYNC, 0),
                (239, 0),
                (RT_STREAM_SYNC, 1),
                (RT_STREAM_SYNC, 2),
                (239, 7),
                (RT_STREAM_SYNC, 0xBAD),
            ],
            start=1,
        ):
            fake.fake_api_stream(RUNTIME, cbid, correlation, 3, stream)
    finally:
        hook.unsubscribe()  # type: ignore[attr-defined]
    rows = _rows(hook)
    assert rows["correlation"].tolist() == list(range(1, 8))
    assert rows["stream"].tolist() == [70, 0, 1, 0, 1, 71, act.NO_STREAM]
    assert (rows["end"] - rows["start"]).tolist() == [1000] * 7  # one tick of CUPTI's clock
    assert np.all(rows["start"][1:] > rows["end"][:-1]) and rows["start"][0] > 1_000_000
    assert set(rows["context"].tolist()) == {3}


# -- the monitor's side: the simulated backend -------------------------------------------------


def _session(directory: Path) -> Session:
    session = Session(MeasureOptions(str(directory), checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    return session


def _under(session: Session, code: object, metric: int) -> dict[int, float]:
    """``metric`` by line of the frame of ``code`` it is under, in the calling thread's CCT."""
    cct = session.states[threading.get_ident()].cct
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = cct.kinds[kind.name]
    fid = session.functions.fid(code)
    found: dict[int, float] = {}
    for node in store.slot_of:
        walk = node
        while walk >= 0 and not (cct.lm[walk] == session.python_lm and cct.ip[walk] >> 32 == fid):
            walk = cct.parent[walk]
        if walk >= 0:
            line = int(cct.ip[walk]) & 0xFFFFFFFF
            found[line] = found.get(line, 0.0) + store.get(node, metric)
    return {line: value for line, value in found.items() if value}


def _synchronizations(gpu: SimulatedBackend) -> None:
    gpu.synchronize()  # the context's
    gpu.synchronize(stream=9)  # a stream's


def test_the_rows_are_attributed_to_the_lines_that_synchronized(tmp_path: Path) -> None:
    recording = Path(DEFAULT_RECORDING)
    session = _session(tmp_path)
    monitor = install(session, f"gpu=simulated,recording={recording},hook=c,sync=api")
    backend = monitor.backend
    assert isinstance(backend, SimulatedBackend) and backend.api_syncs is not None
    code = _synchronizations.__code__
    first_line = code.co_firstlineno + 1
    began = time.time_ns()
    for _ in range(3):
        _synchronizations(backend)
    spent = (time.time_ns() - began) / 1e9
    stats = shutdown(monitor, report=False)
    assert stats.matched == 6 and stats.unmatched == 0 and backend.api_syncs.rows == 6
    assert _under(session, code, gm.GSYNC_COUNT) == {first_line: 3.0, first_line + 1: 3.0}
    context = _under(session, code, gm.GSYNC_TIME + act.SYNC_CONTEXT)
    stream = _under(session, code, gm.GSYNC_TIME + act.SYNC_STREAM)
    assert list(context) == [first_line] and list(stream) == [first_line + 1]
    recorded = rec.load(str(recording)).activities
    syncs = recorded[recorded["kind"] == act.SYNC]
    shortest = int(np.min(syncs["end"] - syncs["start"]))
    assert context[first_line] >= 3 * shortest / 1e9  # each lasted a recorded one at least
    assert context[first_line] + stream[first_line + 1] <= spent


#: Call sites of their own for the recorded sites (site_0 ... site_7, each on its own line).
_SITES_SOURCE = "".join(f"def site_{n}(issue):\n    issue()\n" for n in range(8))
_SITES: dict[str, Callable[[Callable[[], None]], None]] = {}
exec(compile(_SITES_SOURCE, "<replayed sites>", "exec"), _SITES)
SITES = [_SITES[f"site_{n}"] for n in range(8)]


def _by_context(session: Session) -> dict[tuple[tuple[str, int], ...], np.ndarray]:
    """Every GPU metric by calling context (function names and lines, placeholders by ip)."""
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    out: dict[tuple[tuple[str, int], ...], np.ndarray] = {}
    for state in session.states.values():
        cct = state.cct
        store = cct.kinds.get(kind.name)
        for node in store.slot_of if store is not None else ():
            path = []
            walk = node
            while walk >= 0:
                ip = int(cct.ip[walk])
                if cct.lm[walk] == session.python_lm:
                    stanza = session.functions.stanzas[(ip >> 32) - 1]
                    path.append((stanza.funcname, ip & 0xFFFFFFFF))
                else:
                    path.append((str(cct.lm[walk]), ip))
                walk = cct.parent[walk]
            values = np.array([store.get(node, m) for m in range(kind.width)])
            key = tuple(path)
            out[key] = out[key] + values if key in out else values
    return out


@pytest.mark.parametrize("fixture", ["nccl_ws1_h200.json", "graphs_h200.json", DEFAULT_RECORDING])
def test_a_replay_timed_at_the_api_attributes_what_cuptis_records_did(
    tmp_path: Path, fixture: str
) -> None:
    """A recording replayed through the C hook, once with CUPTI's recorded records and once with
    the hook's rows: each calling context gets the same synchronizations of each type, and at
    least as much time (the hook's calls last their recorded time, and a little more)."""
    recording = rec.load(str(GPU_DIR / fixture))  # (an absolute path stays itself)
    seen = {}
    for sync in ("activity", "api"):
        session = _session(tmp_path / sync)
        backend = SimulatedBackend(recording, hook="c", sync=sync, buffer_records=64)
        kind = session.add_metric_kind(gm.gpu_metric_kind())
        monitor = GpuMonitor(session, kind, recording.device, backend=backend)
        backend.start(monitor)
        for thread in recording.threads():  # on this thread, one after the other
            backend.replay(thread, SITES)
        stats = shutdown(monitor, report=False)
        if sync == "api":  # every synchronization CUPTI answered, answered by the hook
            assert backend.api_syncs is not None
            assert backend.api_syncs.rows == len(backend._sync_answers) > 0
        else:
            assert backend.api_syncs is None
        seen[sync] = (_by_context(session), stats.unmatched, stats.matched)
    (activity, unmatched, matched), (api, api_unmatched, api_matched) = (
        seen["activity"],
        seen["api"],
    )
    assert (api_unmatched, api_matched) == (unmatched, matched)
    assert api.keys() == activity.keys()
    times = [gm.GSYNC_TIME + kind for kind in range(5)]
    synchronized = [key for key, values in activity.items() if values[gm.GSYNC_COUNT]]
    assert synchronized, "the recording has synchronizations"
    for key, values in activity.items():
        assert api[key][gm.GSYNC_COUNT] == values[gm.GSYNC_COUNT], key
        assert np.array_equal(api[key][times] > 0, values[times] > 0), key
        assert np.all(api[key][times] >= values[times] - 1e-9), key
        others = [m for m in range(len(values)) if m not in times and m != gm.GSYNC]
        others = [m for m in others if m not in (gm.GPUOP,)]
        assert np.allclose(api[key][others], values[others]), key


# -- options ----------------------------------------------------------------------------------


def test_sync_is_an_option_of_nvidia_and_simulated_with_api_the_default() -> None:
    from pyhpctk.measure.gpu import backend_module, check

    def _backend(spec: GpuSpec) -> Backend:
        return backend_module(spec).make(spec)

    assert DEFAULT_SYNC == syncapi.SYNC_API
    assert _backend(parse_gpu_event("gpu=nvidia")).sync == DEFAULT_SYNC  # type: ignore[attr-defined]
    assert _backend(parse_gpu_event("gpu=nvidia,sync=activity")).sync == "activity"  # type: ignore[attr-defined]
    backend = _backend(parse_gpu_event("gpu=simulated,sync=api"))
    assert isinstance(backend, SimulatedBackend) and backend.sync == "api"
    with pytest.raises(UsageError, match="sync='sometimes'"):
        check(parse_gpu_event("gpu=nvidia,sync=sometimes"))
    with pytest.raises(UsageError, match="unknown option 'sync'"):
        parse_gpu_event("gpu=amd,sync=api")


def test_the_nvidia_backend_joins_the_rows_to_its_next_buffer(hook: object) -> None:
    """CuptiBackend with the hook's rows: they reach the monitor with CUPTI's next buffer, or
    alone at a flush; with sync=both they are kept aside and CUPTI's go."""

    class Recorder:
        def __init__(self) -> None:
            self.batches: list[np.ndarray] = []
            self.errors: list[str] = []

        def buffer_completed(self, records: np.ndarray, functions: object, dropped: int) -> None:
            self.batches.append(records)

        def set_limits(self, limits: object) -> None:
            """Where a GPU is there, the backend tells the monitor the device's limits."""

    _configure(hook)
    for mode in ("api", "both"):
        backend = CuptiBackend(sync=mode).buffers
        backend.api_syncs = syncapi.ApiSyncs(hook, mode)  # type: ignore[arg-type]
        recorder = Recorder()
        backend.monitor = recorder  # type: ignore[assignment]
        for correlation in (50, 51):
            hook.invoke(RUNTIME, RT_DEVICE_SYNC, 0, correlation)  # type: ignore[attr-defined]
            hook.invoke(RUNTIME, RT_DEVICE_SYNC, 1, correlation)  # type: ignore[attr-defined]
        kernels = act.empty_activities(2)
        kernels["kind"] = act.KERNEL
        kernels["correlation"] = [48, 49]
        backend._deliver(kernels)
        hook.invoke(RUNTIME, RT_STREAM_SYNC, 0, 52)  # type: ignore[attr-defined]
        hook.invoke(RUNTIME, RT_STREAM_SYNC, 1, 52)  # type: ignore[attr-defined]
        backend.deliver_syncs()
        backend.deliver_syncs()  # nothing new: no empty buffer
        delivered = [batch["correlation"].tolist() for batch in recorder.batches]
        if mode == "api":
            assert delivered == [[48, 49, 50, 51], [52]]
            assert recorder.batches[0]["kind"].tolist() == [act.KERNEL] * 2 + [act.SYNC] * 2
        else:
            assert delivered == [[48, 49]]
            kept = np.concatenate(backend.api_syncs.kept)
            assert kept["correlation"].tolist() == [50, 51, 52]

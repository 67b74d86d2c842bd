"""The GPU monitor on the simulated backend: attribution, threads, overflow, streams, traces.

Everything here runs the same channels, monitor thread, attribution and tracing code as a real
GPU run; the simulated backend replays ``cupy_streams.json`` (``DEFAULT_RECORDING``) (recorded on an
H200 by ``tests/data/gpu/record_cupy.py``) or recordings hypothesis makes up. Expected values
come from the recordings with numpy, never from the monitor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formats_helpers import STREAM_PROFILES
from pyhpctk.formats import hpcrun, hpctrace
from pyhpctk.measure.cct import ThreadCCT
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import install, shutdown
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.gpu.simulated import DEFAULT_RECORDING
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

FIXTURE = Path(DEFAULT_RECORDING)


#: Both ways of seeing operations: monitor.enter() (cupti-python's path) and the C hook.
def _session(directory: Path, trace: bool = False) -> Session:
    session = Session(MeasureOptions(str(directory), trace=trace, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    return session


def _start(
    session: Session, recording: rec.Recording, hook: str = "python", **options: int
) -> GpuMonitor:
    backend = SimulatedBackend(recording, hook=hook, **options)  # type: ignore[arg-type]
    kind = session.add_metric_kind(gm.gpu_metric_kind())
    monitor = GpuMonitor(session, kind, recording.device, backend=backend)
    backend.start(monitor)
    return monitor


def site_a(issue: Callable[[], None]) -> None:
    issue()


def site_b(issue: Callable[[], None]) -> None:
    issue()


def _replay(
    session: Session,
    monitor: GpuMonitor,
    pause: Callable[[int, int], None] | None = None,
) -> dict[int, ThreadCCT]:
    """Replay every recorded thread on its own Python thread; recorded thread → its CCT.

    (Not its ident: a thread that ends early can hand its ident to one that starts later.)
    """
    backend: SimulatedBackend = monitor.backend  # type: ignore[assignment]
    idents: dict[int, ThreadCCT] = {}
    errors: list[BaseException] = []

    def body(thread: int) -> None:
        try:
            idents[thread] = session.register_thread(threading.current_thread()).cct
            hook = (lambda i: pause(thread, i)) if pause is not None else None
            backend.replay_thread(thread, (site_a, site_b), hook)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(t,)) for t in backend.recording.threads()]
    for thread in threads:
        thread.start()
    backend.deliver_recorded()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return idents


def _totals(session: Session, cct: ThreadCCT) -> np.ndarray:
    """Every GPU metric summed over a CCT."""
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = cct.kinds.get(kind.name)
    if store is None:
        return np.zeros(kind.width)
    return np.asarray(store.values, dtype=np.float64).reshape(-1, kind.width).sum(axis=0)


def _expected(recording: rec.Recording, rows: np.ndarray) -> dict[str, float]:
    kinds = rows["kind"]
    duration = (rows["end"].astype(np.int64) - rows["start"].astype(np.int64)).clip(0) / 1e9
    copies = rows[kinds == act.COPY]
    return {
        "kernels": float((kinds == act.KERNEL).sum()),
        "kernel_seconds": float(duration[kinds == act.KERNEL].sum()),
        "h2d": float(copies["bytes"][copies["copy_kind"] == 1].sum()),
        "d2h": float(copies["bytes"][copies["copy_kind"] == 2].sum()),
        "memset_count": float((kinds == act.MEMSET).sum()),
        "syncs": float((kinds == act.SYNC).sum()),
        "alloc_count": float(np.isin(kinds, [act.ALLOC, act.FREE]).sum()),
        "gpuop": float(duration.sum()),
    }


def _observed(totals: np.ndarray) -> dict[str, float]:
    return {
        "kernels": totals[gm.GKER_COUNT],
        "kernel_seconds": totals[gm.GKER],
        "h2d": totals[gm.GXCOPY_BYTES + 1],
        "d2h": totals[gm.GXCOPY_BYTES + 2],
        "memset_count": totals[gm.GMSET_COUNT],
        "syncs": totals[gm.GSYNC_COUNT],
        "alloc_count": totals[gm.GMEM_COUNT],
        "gpuop": totals[gm.GPUOP],
    }


def _assert_close(observed: dict[str, float], expected: dict[str, float]) -> None:
    for key, value in expected.items():
        assert abs(observed[key] - value) <= 1e-9 * max(1.0, abs(value)), (key, observed, expected)


def test_replayed_h200_activity_lands_on_the_thread_that_issued_it(
    tmp_path: Path, gpu_hook: str
) -> None:
    recording = rec.load(FIXTURE)
    session = _session(tmp_path)
    monitor = _start(session, recording, gpu_hook)
    idents = _replay(session, monitor)
    stats = shutdown(monitor, report=False)
    ops = recording.operations
    activities = recording.activities
    known = np.isin(activities["correlation"], ops["correlation"])
    assert stats.activities == len(activities)
    internal = activities["correlation"] == 0  # the driver's own (static memory of modules)
    assert stats.matched == int(known.sum())
    assert stats.internal == int((~known & internal).sum()) > 0
    assert stats.unmatched == int((~known & ~internal).sum())
    assert stats.operations == len(ops) and stats.dropped == 0
    thread_of = dict(zip(ops["correlation"].tolist(), ops["thread"].tolist(), strict=True))
    owner = np.array([thread_of.get(c, -1) for c in activities["correlation"].tolist()])
    for thread, cct in idents.items():
        _assert_close(
            _observed(_totals(session, cct)), _expected(recording, activities[owner == thread])
        )
    unknown = monitor.unknown_cct()
    if (~known).any():
        assert unknown is not None
        _assert_close(
            _observed(_totals(session, unknown)), _expected(recording, activities[~known])
        )
    main = session.states[threading.get_ident()].cct
    assert not _totals(session, main).any()  # the replaying threads did all the work


def test_each_call_site_gets_its_own_placeholder(tmp_path: Path, gpu_hook: str) -> None:
    recording = rec.load(FIXTURE)
    session = _session(tmp_path)
    monitor = _start(session, recording, gpu_hook)
    idents = _replay(session, monitor)
    shutdown(monitor, report=False)
    ops = recording.operations
    for thread, cct in idents.items():
        mine = ops[ops["thread"] == thread]
        used = {site_a.__code__ if s % 2 == 0 else site_b.__code__ for s in mine["site"].tolist()}
        fids = {session.functions.fid(code) for code in used}
        parents_of_placeholders = {
            cct.parent[node]
            for node in range(len(cct))
            if cct.lm[node] == 0 and cct.parent[node] > cct.fence
        }
        frames = {cct.ip[node] >> 32 for node in parents_of_placeholders}
        assert frames == fids  # placeholders hang only under the site functions that issued


def _synthetic(draw: st.DrawFn, threads: int, operations: int) -> rec.Recording:
    kinds = draw(
        st.lists(
            st.sampled_from([act.KERNEL, act.COPY, act.MEMSET, act.SYNC, act.ALLOC]),
            min_size=operations,
            max_size=operations,
        )
    )
    owner = draw(st.lists(st.integers(0, threads - 1), min_size=operations, max_size=operations))
    ops = np.zeros(operations, dtype=rec.OPERATION_DTYPE)
    ops["thread"] = owner
    ops["correlation"] = np.arange(operations) * 3 + 7
    ops["kind"] = kinds
    ops["site"] = np.arange(operations) % 3
    rows = act.empty_activities(operations)
    order = np.array(draw(st.permutations(list(range(operations)))), dtype=np.int64)
    rows["kind"] = ops["kind"][order]
    rows["correlation"] = ops["correlation"][order]
    rows["start"] = 10**18 + np.arange(operations) * 1000
    rows["end"] = rows["start"] + 100 + order
    rows["bytes"] = np.where(rows["kind"] == act.KERNEL, 0, 64 + order)
    rows["copy_kind"] = np.where(rows["kind"] == act.COPY, 1 + order % 2, 0)
    rows["stream"] = order % 3
    rows["block_threads"] = 128
    rows["grid_blocks"] = 4
    rows["function"] = np.where(rows["kind"] == act.KERNEL, 0, -1)
    cuts = sorted(set(draw(st.lists(st.integers(1, operations - 1), max_size=6))))
    sizes = np.diff([0, *cuts, operations]).tolist()
    return rec.Recording(act.DeviceLimits(), ["k"], ops, rows, sizes)


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[rec.Recording, list[tuple[int, int]]]:
    threads = draw(st.integers(1, 4))
    operations = draw(st.integers(2, 60))
    recording = _synthetic(draw, threads, operations)
    pauses = draw(st.lists(st.tuples(st.integers(0, threads - 1), st.integers(0, 20)), max_size=8))
    return recording, pauses


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scenario=_scenarios())
def test_interleaved_producers_are_each_attributed_exactly(
    tmp_path: Path, gpu_hook: str, scenario: tuple[rec.Recording, list[tuple[int, int]]]
) -> None:
    recording, pauses = scenario
    session = _session(tmp_path)
    monitor = _start(session, recording, gpu_hook)
    waits = {(thread, index) for thread, index in pauses}

    def pause(thread: int, index: int) -> None:
        if (thread, index) in waits:
            threading.Event().wait(0.001)  # let other producers and the monitor run here

    idents = _replay(session, monitor, pause)
    stats = shutdown(monitor, report=False)
    assert stats.unmatched == 0 and stats.matched == len(recording.activities)
    ops = recording.operations
    thread_of = dict(zip(ops["correlation"].tolist(), ops["thread"].tolist(), strict=True))
    owner = np.array([thread_of[c] for c in recording.activities["correlation"].tolist()])
    for thread, cct in idents.items():
        expected = _expected(recording, recording.activities[owner == thread])
        _assert_close(_observed(_totals(session, cct)), expected)


def test_overflowing_buffers_drop_records_visibly(tmp_path: Path, capsys: object) -> None:
    recording = rec.load(FIXTURE)
    session = _session(tmp_path)
    backend = SimulatedBackend(recording, buffer_records=4, max_pending=10)
    kind = session.add_metric_kind(gm.gpu_metric_kind())
    monitor = GpuMonitor(session, kind, recording.device, backend=backend)
    backend.start(monitor, paused=True)  # the buffer thread is stuck: buffers pile up
    launches = 25
    for _ in range(launches):
        backend.launch()
    backend.resume()
    stats = shutdown(monitor)
    assert stats.dropped == launches - 10
    assert stats.matched == 10 and stats.unmatched_operations == launches - 10
    assert "15 activity records dropped" in capsys.readouterr().err  # type: ignore[attr-defined]


def launching_function(backend: SimulatedBackend, count: int) -> None:
    for _ in range(count):
        backend.launch()
        backend.copy()


def test_install_and_shutdown_run_the_simulated_runtime(tmp_path: Path) -> None:
    session = _session(tmp_path, trace=True)
    monitor = install(session, f"gpu=simulated,recording={FIXTURE},buffer=16")
    backend: SimulatedBackend = monitor.backend  # type: ignore[assignment]
    launching_function(backend, 40)
    stats = shutdown(monitor, report=False)
    assert stats.operations == 80 and stats.matched == 80 and stats.unmatched == 0
    main = session.states[threading.get_ident()].cct
    totals = _totals(session, main)
    assert totals[gm.GKER_COUNT] == 40 and totals[gm.GXCOPY_COUNT] == 40
    assert monitor._monitor_done.is_set() and monitor._tracer_done.is_set()  # no thread left
    assert backend.completion._worker is None


def test_stream_profiles_and_traces_are_valid_hpcrun_files(tmp_path: Path) -> None:
    recording = rec.load(FIXTURE)
    session = _session(tmp_path, trace=True)
    monitor = _start(session, recording)
    _replay(session, monitor)
    shutdown(monitor, report=False)
    session.finish()
    activities = recording.activities
    streams = {
        tuple(k) for k in np.stack([activities["context"], activities["stream"]], 1).tolist()
    }
    profiles = sorted(tmp_path.glob(STREAM_PROFILES))
    assert len(profiles) == len(streams)
    seen: set[tuple[int, int]] = set()
    records = 0
    for path in profiles:
        profile = hpcrun.read(path)
        trace = hpctrace.read(path.with_suffix(".hpctrace"))
        assert hpcrun.verify(profile) == [] and hpctrace.verify_trace(trace, profile) == []
        assert int(dict(profile.nvpairs)["thread-id"]) >= 500
        assert trace.flags == hpctrace.TRACE_FLAG_CALL_TRACE
        kinds = [hpcrun.id_kind(int(k)) for k in profile.id_tuple["kind"].tolist()]
        assert kinds[-2:] == [5, 6]  # GPUCONTEXT, GPUSTREAM
        seen.add((int(profile.id_tuple["physical"][-2]), int(profile.id_tuple["physical"][-1])))
        records += len(trace.records)
        assert not profile.values.size  # stream files carry the trace, not values
    assert seen == streams
    assert records == 2 * len(activities)  # each operation: its start and NoActvty at its end
    for path in tmp_path.glob("*-[0-9][0-9][0-9][0-9][0-9][0-9]-00[0-9]-*.hpcrun"):
        assert hpcrun.verify(hpcrun.read(path)) == []


def test_out_of_order_records_are_flagged_for_pyprof(tmp_path: Path) -> None:
    ops = np.zeros(3, dtype=rec.OPERATION_DTYPE)
    ops["correlation"] = [1, 2, 3]
    ops["kind"] = act.KERNEL
    rows = act.empty_activities(3)
    rows["kind"] = act.KERNEL
    rows["correlation"] = [1, 2, 3]
    rows["start"] = [3000, 1000, 2000]  # buffers from one stream completing out of order
    rows["end"] = rows["start"] + 500
    recording = rec.Recording(act.DeviceLimits(), [], ops, rows, [1, 1, 1])
    session = _session(tmp_path, trace=True)
    monitor = _start(session, recording)
    _replay(session, monitor)
    shutdown(monitor, report=False)
    path = next(tmp_path.glob("*-500-*.hpcrun"))
    assert int(dict(hpcrun.read(path).nvpairs)["trace-disorder"]) > 0


def retiring_site(issue: Callable[[], None]) -> None:
    issue()


def test_activities_of_a_retired_cct_move_to_the_threads_live_cct(tmp_path: Path) -> None:
    ops = np.zeros(2, dtype=rec.OPERATION_DTYPE)
    ops["correlation"] = [1, 2]
    ops["kind"] = act.KERNEL
    rows = act.empty_activities(2)
    rows["kind"] = act.KERNEL
    rows["correlation"] = [1, 2]
    rows["start"] = [1000, 2000]
    rows["end"] = rows["start"] + 10
    recording = rec.Recording(act.DeviceLimits(), [], ops, rows, [2])
    session = _session(tmp_path)
    monitor = _start(session, recording)
    backend: SimulatedBackend = monitor.backend  # type: ignore[assignment]
    backend.replay_thread(0, (retiring_site,))
    ident = threading.get_ident()
    old = session.states.pop(ident).cct  # the session wrote this thread out and forgot it
    session.register_thread(threading.current_thread(), main=True)
    backend.deliver_recorded()
    shutdown(monitor, report=False)
    live = session.states[ident].cct
    assert live is not old
    assert _totals(session, live)[gm.GKER_COUNT] == 2
    fid = session.functions.fid(retiring_site.__code__)
    kernel_nodes = [n for n in range(len(live)) if live.lm[n] == 0 and live.parent[n] >= 0]
    assert any(live.ip[live.parent[n]] >> 32 == fid for n in kernel_nodes)


def test_a_thread_without_python_frames_gets_a_profile_of_its_own(tmp_path: Path) -> None:
    # A runtime's C++ worker (PyTorch's autograd thread) launches kernels with no Python frame
    # above the GPU layer: it must not be registered with the session (whose sampler would
    # retire it whenever it is seen without frames) but still be attributed and written.
    import _thread
    import operator

    session = _session(tmp_path)
    monitor = install(session, f"gpu=simulated,recording={FIXTURE},buffer=8")
    backend: SimulatedBackend = monitor.backend  # type: ignore[assignment]
    done = threading.Event()
    calls = [backend.launch] * 12 + [done.set]
    # list(map(call, ...)) runs in C: the new thread has no Python frame of its own.
    _thread.start_new_thread(list, (map(operator.call, calls),))
    assert done.wait(10)
    stats = shutdown(monitor, report=False)
    assert stats.matched == stats.operations == 12
    own = [state for state in monitor.threads if state.own]
    assert len(own) == 1 and own[0].ident not in session.states
    assert _totals(session, own[0].cct)[gm.GKER_COUNT] == 12
    session.finish()
    by_thread = {
        int(dict(hpcrun.read(p).nvpairs)["thread-id"]): p for p in tmp_path.glob("*.hpcrun")
    }
    assert 400 in by_thread
    profile = hpcrun.read(by_thread[400])
    _, metrics, values = hpcrun.decoded_values(profile)
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    assert values[metrics == kind.base + gm.GKER_COUNT].sum() == 12


def test_a_thread_ending_gets_its_gpu_work_attributed_first(tmp_path: Path) -> None:
    session = _session(tmp_path)
    monitor = install(session, f"gpu=simulated,recording={FIXTURE},buffer=1000")
    backend: SimulatedBackend = monitor.backend  # type: ignore[assignment]
    seen: list[float] = []

    def body() -> None:
        cct = session.register_thread(threading.current_thread()).cct
        launching_function(backend, 5)  # a partly filled buffer: nothing delivered yet
        before = _totals(session, cct)[gm.GKER_COUNT]
        monitor.thread_ending()  # what the session calls before writing this thread
        seen.extend([before, _totals(session, cct)[gm.GKER_COUNT]])

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    shutdown(monitor, report=False)
    assert seen == [0.0, 5.0]


def test_gpu_amd_and_missing_recordings_are_usage_errors(tmp_path: Path) -> None:

    from pyhpctk.errors import UsageError

    session = _session(tmp_path)
    with pytest.raises(UsageError, match="gpu=amd"):
        install(session, "gpu=amd")
    with pytest.raises(UsageError, match="cannot read the recording"):
        install(session, f"gpu=simulated,recording={tmp_path / 'none.json'}")


def launcher_generator(backend: SimulatedBackend) -> object:
    while True:
        backend.launch()
        yield


def caller_one(generator: object) -> None:
    next(generator)  # type: ignore[call-overload]


def caller_two(generator: object) -> None:
    next(generator)  # type: ignore[call-overload]


def test_the_unwinding_cache_never_confuses_sites_or_resumed_generators(tmp_path: Path) -> None:
    session = _session(tmp_path)
    monitor = install(session, f"gpu=simulated,recording={FIXTURE},buffer=4")
    backend: SimulatedBackend = monitor.backend  # type: ignore[assignment]
    generator = launcher_generator(backend)
    for index in range(30):  # one frame, two instructions, alternating
        backend.launch() if index % 3 else backend.copy()
    for index in range(30):  # one generator frame, one instruction, resumed by two callers
        (caller_one if index % 2 else caller_two)(generator)
    shutdown(monitor, report=False)
    cct = session.states[threading.get_ident()].cct

    def kernels_under(code: object) -> float:
        fid = session.functions.fid(code)
        kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
        store = cct.kinds[kind.name]
        total = 0.0
        for node, _ in store.slot_of.items():
            walk = node
            while walk >= 0 and not (cct.lm[walk] == 1 and cct.ip[walk] >> 32 == fid):
                walk = cct.parent[walk]
            if walk >= 0:
                total += store.get(node, gm.GKER_COUNT)
        return total

    assert kernels_under(caller_one.__code__) == 15
    assert kernels_under(caller_two.__code__) == 15
    totals = _totals(session, cct)
    assert totals[gm.GKER_COUNT] == 30 + 20 and totals[gm.GXCOPY_COUNT] == 10


def test_activities_of_the_backends_own_calls_are_left_out(tmp_path: Path) -> None:
    """A counter's cuCtxSynchronize (own_call) brings a SYNCHRONIZATION record with an id
    no program operation has: left out of the profile, not put under <GPU?????>."""
    ops = np.zeros(1, dtype=rec.OPERATION_DTYPE)
    ops["correlation"] = [1]
    ops["kind"] = act.KERNEL
    rows = act.empty_activities(3)
    rows["kind"] = [act.KERNEL, act.SYNC, act.SYNC]
    rows["correlation"] = [1, 7, 8]  # 7: the backend's own call; 8: unknown to everyone
    rows["start"] = [1000, 2000, 3000]
    rows["end"] = rows["start"] + 10
    recording = rec.Recording(act.DeviceLimits(), [], ops, rows, [3])
    session = _session(tmp_path)
    monitor = _start(session, recording)
    monitor.own_call(7)
    _replay(session, monitor)
    stats = shutdown(monitor, report=False)
    assert (stats.matched, stats.own, stats.unmatched) == (1, 1, 1)
    assert stats.activities == 3
    assert not monitor.matcher.own_calls  # forgotten once its record came

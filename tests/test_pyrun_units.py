"""pyrun's parts in isolation: events, naming, the CCT, the encoder against the format writers,
and the sampler driven by fake clocks (no sampler thread, no timing dependence).
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pyhpctk.errors import UsageError
from pyhpctk.formats import hpcrun, hpctrace, logical
from pyhpctk.formats.hpcrun_model import placeholder_text
from pyhpctk.measure import naming
from pyhpctk.measure.cct import (
    FunctionTable,
    MetricKind,
    MetricSpec,
    NodeIdAllocator,
    ThreadCCT,
    python_frame_ips,
)
from pyhpctk.measure.encode import (
    ProfileIdentity,
    encode_logical,
    encode_profile,
    encode_trace,
    profile_model,
    trace_model,
)
from pyhpctk.measure.events import (
    CLOCK_THREAD_CPU,
    CLOCK_WALL,
    EVENTS,
    READ_GIL_WAIT,
    EventSpec,
    event_listing,
    parse_event,
    parse_events,
)
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.sampling import engine
from pyhpctk.measure.session import Clocks, Session, thread_cpu_clock
from pyhpctk.measure.settings import ENV_OPTIONS, RunSettings

if TYPE_CHECKING:
    from pyhpctk.measure.session.writing import Encoded
    from pyhpctk.measure.thread_state import ThreadState

# -- events ------------------------------------------------------------------------------------


def test_events_use_hpcruns_syntax() -> None:
    assert parse_events([]) == (EventSpec("CPUTIME", 5000),)
    assert parse_event("REALTIME@1000") == EventSpec("REALTIME", 1000)
    assert parse_event("cputime@f100") == EventSpec("CPUTIME", 10000)
    assert parse_event("CPUTIME").metric_name == "CPUTIME (sec)"
    assert str(parse_event("REALTIME@250")) == "REALTIME@250"
    assert "REALTIME" in event_listing()


def test_pyrun_lists_the_native_frames_default_and_their_cost() -> None:
    listing = " ".join(event_listing().split())
    assert "Native frames: on by default (--no-native turns them off)" in listing
    assert "us per sample" in listing and "at 200 samples per second" in listing


def test_pyrun_lists_the_route_of_cpu_samples_and_how_to_change_it() -> None:
    listing = " ".join(event_listing().split())
    assert "a perf_events counter per thread, through pyrun's realtime signal." in listing
    assert "PYHPCTK_PYRUN_CPU_TIMER=sigtrap raises SIGTRAP instead" in listing
    assert "=posix uses CPU-clock timers" in listing


@pytest.mark.parametrize("text", ["CYCLES", "CPUTIME@abc", "CPUTIME@10", "CPUTIME@f0"])
def test_bad_events_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_event(text)


def test_the_registry_is_what_pyrun_lists_and_accepts() -> None:
    listing = event_listing()
    for event in EVENTS.values():
        assert f"  {event.name:<10} " in listing
        assert f"metric: {event.metric};" in listing
        assert parse_event(f"{event.name}@1000").metric_name == event.metric
    assert {e.clock for e in EVENTS.values()} == {CLOCK_THREAD_CPU, CLOCK_WALL}
    assert parse_event("gilwait").event.reads == READ_GIL_WAIT


def test_the_fallback_says_why_once_and_names_events_it_cannot_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(engine.ENV_FALLBACK_SAID, raising=False)
    for _ in range(2):  # each time with the settings a process (a child) reads now
        said_before = RunSettings(os.environ).fallback_said
        engine.say_fallback_once(
            "the sampling engine is not built for this interpreter", said_before
        )
    said = capsys.readouterr().err
    assert said.count("GIL switch points") == 1
    monkeypatch.setenv(engine.ENV_SAMPLER, "thread")
    assert engine.load_engine(RunSettings(os.environ).sampler) == (None, "")
    Session(MeasureOptions(str(tmp_path), events=parse_events(["CPUTIME", "GILWAIT"])))
    assert "GILWAIT needs the sampling engine; it is not measured" in capsys.readouterr().err


def test_an_event_may_be_given_once() -> None:
    with pytest.raises(UsageError, match="more than once"):
        parse_events(["CPUTIME", "CPUTIME@100"])


def test_options_travel_through_the_environment() -> None:
    """pyrun's options travel whole in one variable; the settings a user may set are read with
    them, once, where they arrive."""
    options = MeasureOptions(
        "/tmp/x;trace=1%3B=",  # the separators in a value
        parse_events(["REALTIME@2000"]),
        True,
        2.5,
        native=False,
        gpu="gpu=simulated,buffer=4",
        report="pyhpctk-pyrun-1-ab",
        paused=True,  # implies control
        mark="warm up",
        async_aware=True,
    )
    env: dict[str, str] = {"PYTHONPATH": "/elsewhere", engine.ENV_SAMPLER: "Thread"}
    options.export(env)
    arrived = MeasureOptions.from_env(env)
    assert arrived == options
    assert arrived is not None and arrived.settings.sampler == "thread"
    assert (arrived.control, arrived.paused, arrived.mark, arrived.async_aware) == (
        True,
        True,
        "warm up",
        True,
    )
    assert sorted(name for name in env if name.startswith("PYHPCTK_")) == [
        "PYHPCTK_PYRUN_BOOTSTRAP",
        "PYHPCTK_PYRUN_MARK",  # the window's state (pyrun ctl), beside the options
        ENV_OPTIONS,
        "PYHPCTK_PYRUN_PACKAGE_ROOT",
        "PYHPCTK_PYRUN_PAUSED",
        engine.ENV_SAMPLER,
    ]
    assert env["PYTHONPATH"].endswith("/elsewhere")
    assert env["PYTHONPATH"].split(":")[0].endswith("bootstrap")
    assert MeasureOptions.from_env({}) is None
    assert MeasureOptions.from_env({ENV_OPTIONS: "output_dir=/tmp/y"}) == MeasureOptions("/tmp/y")
    with pytest.raises(UsageError, match="PYHPCTK_PYRUN_OPTIONS is not pyrun's options"):
        MeasureOptions.from_env({ENV_OPTIONS: "/tmp/y"})


# -- naming ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, None),
        ({"SLURM_PROCID": "7"}, 7),
        ({"PMI_RANK": "3"}, 3),
        ({"PMIX_RANK": "4"}, 4),
        ({"OMPI_COMM_WORLD_RANK": "2", "SLURM_PROCID": "0"}, 2),
        ({"MV2_COMM_WORLD_RANK": "9"}, 9),
        ({"PMI_RANK": "not-a-number"}, None),
    ],
)
def test_rank_comes_from_the_launcher(env: dict[str, str], rank: int | None) -> None:
    assert naming.rank_from_env(env) == rank


def test_launch_keys_and_job_ids() -> None:
    assert naming.launch_key({}) == ""
    assert naming.launch_key({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "1"}) == "5.1"
    assert naming.launch_key({"PMIX_NAMESPACE": "ns/1"}) == "ns_1"
    assert naming.job_id_from_env({"PBS_JOBID": "12.server"}) == "12.server"
    assert naming.job_id_from_env({}) == ""


def test_file_names_and_directory_names() -> None:
    assert naming.file_stem("python3", 3, 12, 0x11AC0300, 4974, 0) == (
        "python3-000003-012-11ac0300-4974-0"
    )
    assert naming.program_name(["python", "-u", "app.py", "x"]) == "app"
    assert naming.program_name(["python3.11", "-m", "pkg.tool"]) == "pkg.tool"
    assert naming.program_name(["./run.sh"]) == "run.sh"
    assert naming.default_output_dir(["python", "a.py"], {}) == "hpctoolkit-a-measurements"
    assert naming.default_output_dir(["python", "a.py"], {"SLURM_JOB_ID": "9"}) == (
        "hpctoolkit-a-measurements-9"
    )


def test_fresh_directories_never_collide(tmp_path: Path) -> None:
    base = str(tmp_path / "run")
    assert naming.fresh_directory(base) == base
    assert naming.fresh_directory(base) == base + "-2"
    assert naming.fresh_directory(base) == base + "-3"


# -- CCT ---------------------------------------------------------------------------------------


def test_cct_shape_ids_and_sparse_kinds() -> None:
    cct = ThreadCCT(NodeIdAllocator(), main=True, with_no_activity=True)
    assert [placeholder_text(ip) for ip in cct.ip] == ["^Primary", "NoActvty", "| Main  "]
    assert list(cct.node_id) == [12, 14, 16]
    leaf = cct.path(1, [(2 << 32) | 7, (1 << 32) | 3])  # innermost first
    assert cct.path(1, [(2 << 32) | 7, (1 << 32) | 3]) == leaf  # found again, not duplicated
    assert len(cct) == 5
    assert cct.parent[leaf] == 3 and cct.parent[3] == cct.fence
    kind = MetricKind("k", (MetricSpec("A"), MetricSpec("B")), base=0)
    cct.add(kind, leaf, 1, 2.5)
    cct.add(kind, leaf, 1, 0.5)
    store = cct.values_of(kind)
    assert store.get(leaf, 1) == 3.0 and store.get(leaf, 0) == 0.0
    assert list(store.slot_of) == [leaf]  # only nodes with values are stored
    cct.retain(leaf)
    assert cct.written_id(leaf) == cct.node_id[leaf] + 1


def func_lo(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait()


def func_mid(ready: threading.Event, release: threading.Event) -> None:
    func_lo(ready, release)


def func_hi(ready: threading.Event, release: threading.Event) -> None:
    func_mid(ready, release)


@pytest.fixture
def parked_thread() -> Iterator[threading.Thread]:
    """A thread parked inside func_hi -> func_mid -> func_lo until the test ends."""
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=func_hi, args=(ready, release))
    thread.start()
    ready.wait()
    yield thread
    release.set()
    thread.join()


def test_python_frames_become_fid_and_line(parked_thread: threading.Thread) -> None:
    assert parked_thread.ident is not None
    frame = sys._current_frames()[parked_thread.ident]
    table = FunctionTable()
    ips = python_frame_ips(frame, table, table.fid_of)
    names = [table.stanzas[(ip >> 32) - 1].funcname for ip in ips]
    lo = names.index("func_lo")  # below it: threading's Event.wait frames
    assert names[lo : lo + 3] == ["func_lo", "func_mid", "func_hi"]
    assert ips[lo] & 0xFFFFFFFF == func_lo.__code__.co_firstlineno + 2  # release.wait()
    assert table.stanzas[(ips[lo] >> 32) - 1].lineno == func_lo.__code__.co_firstlineno
    assert python_frame_ips(frame, table, table.fid_of) == ips  # fids are stable


def _load_copy(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"copy_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_function_in_two_files_gets_two_fids(tmp_path: Path) -> None:
    # Two copies of a module: code objects equal by value (CPython's code equality ignores
    # co_filename), so a table keyed by code object gave the second copy the first one's fid.
    source = "import sys\n\ndef work():\n    return sys._getframe()\n"
    copies = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mod.py").write_text(source)
        copies.append(_load_copy(tmp_path / name / "mod.py"))
    first, second = (module.work for module in copies)
    assert first.__code__ == second.__code__  # what made them merge
    assert first.__code__.co_filename != second.__code__.co_filename
    table = FunctionTable()
    leaves = [python_frame_ips(work(), table, table.fid_of)[0] for work in (first, second)]
    files = [table.stanzas[(ip >> 32) - 1].filename for ip in leaves]
    assert files == [first.__code__.co_filename, second.__code__.co_filename]
    assert [table.fid(work.__code__) for work in (first, second)] == [ip >> 32 for ip in leaves]
    assert python_frame_ips(second(), table, table.fid_of)[0] == leaves[1]  # from the cache
    # The engine's path: register() per code object it pinned.
    engine_table = FunctionTable()
    fids = [engine_table.register(work.__code__) for work in (first, second)]
    assert fids[0] != fids[1]
    assert [engine_table.fid(work.__code__) for work in (first, second)] == fids


# -- encoder: the same bytes as the format writers ----------------------------------------------


def _sample_cct() -> tuple[ThreadCCT, list[MetricKind]]:
    sampling = MetricKind("sampling", (MetricSpec("CPUTIME (sec)"),), base=0)
    gpu = MetricKind(
        "gpu",
        (MetricSpec("GKER (sec)", move_to_proc=True), MetricSpec("GKER:COUNT", is_real=False)),
        base=1,
    )
    cct = ThreadCCT(NodeIdAllocator(), main=False, with_no_activity=True)
    leaf = cct.path(1, [(3 << 32) | 30, (2 << 32) | 20, (1 << 32) | 10])
    other = cct.path(1, [(4 << 32) | 40, (1 << 32) | 10])
    kernel = cct.placeholder(leaf, "GPUKernl")
    cct.add(sampling, leaf, 0, 0.25)
    cct.add(sampling, other, 0, 0.125)
    cct.add(gpu, kernel, 0, 1.5e-3)
    cct.add(gpu, kernel, 1, 12)
    cct.retain(leaf)
    cct.retain(cct.no_activity)
    return cct, [sampling, gpu]


IDENTITY = ProfileIdentity("python3", "/usr/bin/python3", "/bin", "77", 2, 1, 0x11AC0300, 4974)


def test_profile_bytes_equal_the_format_writers() -> None:
    cct, kinds = _sample_cct()
    modules = [(1, "logical/python.0000abcd", 1)]
    span = (1_700_000_000_000_000_000, 1_700_000_000_500_000_000)
    ours = encode_profile(cct, IDENTITY, modules, kinds, span)
    model = profile_model(cct, IDENTITY, modules, kinds, span)
    assert ours == hpcrun.to_bytes(model)
    profile = hpcrun.read(ours)
    assert hpcrun.verify(profile) == []
    assert profile.header("mpi-rank") == "2" and profile.header("job-id") == "77"
    assert [m.name for m in profile.metrics] == ["CPUTIME (sec)", "GKER (sec)", "GKER:COUNT"]
    assert profile.metrics[1].move_to_proc and not profile.metrics[2].is_real
    node_ids, metrics, values = profile.decoded_values()
    by_metric = {int(m): float(v) for m, v in zip(metrics, values, strict=True)}
    assert by_metric[1] == 1.5e-3 and by_metric[2] == 12.0
    assert sorted(v for m, v in zip(metrics, values, strict=True) if m == 0) == [0.125, 0.25]
    assert {int(n) % 2 for n in node_ids if int(n) == cct.written_id(2)} <= {1}


def test_a_count_the_file_cannot_hold_is_named_or_clamped() -> None:
    """A negative integer metric (an accounting slip) must not lose the whole profile."""
    cct, kinds = _sample_cct()
    kernel = next(i for i in range(len(cct)) if cct.values_of(kinds[1]).get(i, 1))
    cct.add(kinds[1], kernel, 1, -20)  # GKER:COUNT 12 - 20 = -8
    modules = [(1, "logical/python.0000abcd", 1)]
    with pytest.raises(ValueError, match="integer metric 2 has the value -8"):
        encode_profile(cct, IDENTITY, modules, kinds)
    profile = hpcrun.read(encode_profile(cct, IDENTITY, modules, kinds, clamp_counts=True))
    assert hpcrun.verify(profile) == []
    _, metrics, values = profile.decoded_values()
    by_metric = {int(m): float(v) for m, v in zip(metrics, values, strict=True)}
    assert 2 not in by_metric and by_metric[1] == 1.5e-3  # the count: 0, not stored; the rest kept
    assert sorted(v for m, v in zip(metrics, values, strict=True) if m == 0) == [0.125, 0.25]


def test_trace_and_logical_bytes_equal_the_format_writers() -> None:
    cct, _ = _sample_cct()
    leaf = next(i for i in range(len(cct)) if cct.retained[i] and cct.lm[i] == 1)
    times, nodes = [10, 20, 30], [leaf, cct.no_activity, leaf]
    ours = encode_trace(cct, times, nodes)
    assert ours == hpctrace.to_bytes(trace_model(cct, times, nodes))
    trace = hpctrace.read(ours)
    assert [int(n) for n in trace.records["node_id"]] == [
        cct.node_id[leaf] + 1,
        cct.node_id[cct.no_activity] + 1,
        cct.node_id[leaf] + 1,
    ]
    table = FunctionTable()
    table.register(func_hi.__code__)
    table.register(compile("x = 1", "/tmp/script.py", "exec"))
    data = encode_logical(table.stanzas)
    metadata = logical.read(data)
    assert logical.to_bytes(metadata) == data
    assert logical.verify(metadata) == []
    assert [(s.fid, s.funcname, s.lineno) for s in metadata.stanzas] == [
        (1, "func_hi", func_hi.__code__.co_firstlineno),
        (2, "", 0),
    ]


# -- the sampler, on fake clocks ----------------------------------------------------------------


class FakeCpuClocks:
    """Thread CPU clocks that advance by ``step`` seconds on each read of a busy thread."""

    def __init__(self, busy: set[int], step: float) -> None:
        self.busy, self.step = busy, step
        self.now: dict[int, float] = {}

    def read(self, clock_id: int) -> float:
        if clock_id in self.busy:
            self.now[clock_id] = self.now.get(clock_id, 0.0) + self.step
        return self.now.get(clock_id, 1.0)


def test_sampler_attributes_cpu_deltas_to_each_threads_stack(
    tmp_path: Path, parked_thread: threading.Thread
) -> None:
    assert parked_thread.ident is not None and parked_thread.native_id is not None
    idle = threading.current_thread()
    busy_clock = thread_cpu_clock(parked_thread.native_id)
    cpu = FakeCpuClocks({busy_clock}, 0.005)
    wall = iter(float(t) for t in range(100))
    stamps = iter(range(1000, 2000, 10))

    def frames() -> dict[int, object]:
        current = sys._current_frames()
        return {i: current[i] for i in (parked_thread.ident, idle.ident) if i is not None}

    clocks = Clocks(
        thread_cpu=cpu.read,
        wall=lambda: next(wall),
        epoch_ns=lambda: next(stamps),
        current_frames=frames,  # type: ignore[arg-type]
    )
    session = Session(MeasureOptions(str(tmp_path), trace=True, checkpoint_s=0), clocks)
    for _ in range(4):
        session.python.sample()
    session.finish()
    states = {
        state: hpcrun.read(path)
        for state in (0, 1)
        for path in tmp_path.glob(f"*-{state:03d}-*.hpcrun")
    }
    assert set(states) == {0, 1}  # numbered in order of first sight
    busy = next(p for p in states.values() if len(p.values))
    node_ids, _, values = busy.decoded_values()
    # 1 baseline read + 4 samples + 1 final read: 5 deltas of 5 ms, all on the parked stack.
    assert float(values.sum()) == pytest.approx(0.025)
    metadata = logical.read(next((tmp_path / "logical").iterdir()))
    names = {s.fid: s.funcname for s in metadata.stanzas}
    records = {
        int(r["id"]): (int(r["parent_id"]), int(r["lm_id"]), int(r["lm_ip"])) for r in busy.cct
    }
    for node in {int(n) for n in node_ids}:
        path = []
        while node:
            parent, lm, ip = records[node]
            path.append(names[ip >> 32] if lm else placeholder_text(ip))
            node = parent
        lo = path.index("func_lo")  # innermost first; threading's wait frames below it
        assert path[lo : lo + 3] == ["func_lo", "func_mid", "func_hi"]
        assert path[-2:] == ["| Thread", "^Primary"]
    idle_profile = next(p for p in states.values() if not len(p.values))
    idle_trace = hpctrace.read(
        next(tmp_path.glob(f"*-{int(idle_profile.header('thread-id')):03d}-*.hpctrace"))
    )
    (only,) = idle_trace.records  # one NoActvty record, not one per sample
    no_activity = {int(r["id"]) for r in idle_profile.cct if r["lm_id"] == 0}
    assert int(only["node_id"]) in no_activity


def _session_on_set_clocks(tmp_path: Path) -> tuple[Session, dict[int, float], list[int]]:
    """A session whose thread CPU clocks read what the test sets (clock id -> seconds, 0 when
    unset) and whose samples see the frames of the threads the test lists (idents)."""
    cpu: dict[int, float] = {}
    frames_of: list[int] = []

    def frames() -> dict[int, types.FrameType]:
        current = sys._current_frames()
        return {ident: current[ident] for ident in frames_of}

    clocks = Clocks(thread_cpu=lambda clock: cpu.get(clock, 0.0), current_frames=frames)
    return Session(MeasureOptions(str(tmp_path), checkpoint_s=0), clocks), cpu, frames_of


def test_the_python_sampler_counts_a_thread_born_while_measured_from_its_birth(
    tmp_path: Path, parked_thread: threading.Thread
) -> None:
    """A thread born while measured: all its CPU time is the program's, whether the sampler
    finds it first or it registers itself through pyrun's thread hook (``program_ns``: its time
    before the hook; the hook's own is pyrun's). A thread alive before measuring began counts
    from when the sampler first sees it."""
    session, cpu, frames_of = _session_on_set_clocks(tmp_path)
    release, ready = threading.Event(), threading.Barrier(3)

    def found() -> None:  # the sampler finds it: it never registers itself
        ready.wait()
        release.wait()

    def hooked() -> None:  # at its hook: 0.5 s on its clock, 0.2 s of them before the hook
        cpu[thread_cpu_clock(threading.get_native_id())] = 0.5
        session.register_thread(threading.current_thread(), program_ns=200_000_000)
        ready.wait()
        release.wait()

    threads = [threading.Thread(target=found), threading.Thread(target=hooked)]
    for thread in threads:
        thread.start()
    ready.wait()
    try:
        everyone = {"old": parked_thread, "found": threads[0], "hooked": threads[1]}
        clock = {name: thread_cpu_clock(t.native_id or 0) for name, t in everyone.items()}
        frames_of.extend(t.ident or 0 for t in everyone.values())
        for old, born, hooked_at in ((2.0, 1.0, 0.9), (2.25, 1.25, 1.15)):
            cpu.update({clock["old"]: old, clock["found"]: born, clock["hooked"]: hooked_at})
            session.python.sample()
        session.finish()
    finally:
        release.set()
        for thread in threads:
            thread.join()
    totals = {}
    for path in tmp_path.glob("*.hpcrun"):
        profile = hpcrun.read(path)
        totals[int(profile.header("thread-id"))] = float(profile.decoded_values()[2].sum())
    # numbered in order of first sight: the hooked thread registered before the samples
    assert totals == pytest.approx({1: 1.15 - 0.3, 2: 0.25, 3: 1.25}), totals


def test_a_threads_end_keeps_its_last_samples_when_a_checkpoint_writes_after_it(
    tmp_path: Path,
) -> None:
    """The Python sampler's figures of a thread that ends while a checkpoint is writing: the
    checkpoint encoded the thread's 10 ms (under the session's lock), then wrote the files of
    the threads before it; meanwhile the thread used 20 ms more and wrote its final files
    (30 ms). The checkpoint's older encoding, written last, replaced them: on CI, under load,
    a thread of eight that each use 30 ms was written with 24.7 ms."""
    session, cpu, frames_of = _session_on_set_clocks(tmp_path)
    registered, end = threading.Event(), threading.Event()

    def worker() -> None:
        session.register_thread(threading.current_thread(), program_ns=0)
        registered.set()
        end.wait()
        session.thread_finished()

    thread = threading.Thread(target=worker)
    thread.start()
    registered.wait()
    assert thread.native_id is not None and thread.ident is not None
    clock = thread_cpu_clock(thread.native_id)
    frames_of.append(thread.ident)
    cpu[clock] = 0.010
    session.python.sample()
    write = session.writer.write

    def checkpoint_write(state: ThreadState, data: Encoded) -> None:
        if state.ident == thread.ident and not end.is_set():  # the thread ends meanwhile
            cpu[clock] = 0.030
            end.set()
            thread.join()
        write(state, data)

    session.writer.write = checkpoint_write  # type: ignore[method-assign]
    try:
        session.checkpoint()
    finally:
        end.set()
        thread.join()
    (path,) = tmp_path.glob("*-001-*.hpcrun")
    assert float(hpcrun.read(path).decoded_values()[2].sum()) == pytest.approx(0.030)


def test_the_frames_of_a_sample_are_taken_with_the_session_lock_held(tmp_path: Path) -> None:
    """Waiting for the lock lets the threads run on: frames taken before it would be walked
    stale, which on CPython 3.11 crashed a program's exit (python/cpython#111363)."""
    held: list[bool] = []

    def frames() -> dict[int, object]:
        held.append(session.lock._is_owned())  # type: ignore[attr-defined]
        return {}

    session = Session(
        MeasureOptions(str(tmp_path), checkpoint_s=0),
        Clocks(current_frames=frames),  # type: ignore[arg-type]
    )
    session.python.sample()
    session.python.sample()
    session.finish()
    assert held and all(held)


def test_a_gpu_layer_can_add_a_kind_placeholders_and_streams(tmp_path: Path) -> None:
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    kind = session.add_metric_kind(
        MetricKind("gpu-kernel", (MetricSpec("GKER (sec)", move_to_proc=True),))
    )
    assert kind.base == 1
    lm = session.add_load_module("gpubins/0123.gpubin")
    assert lm == 2 and session.add_load_module("gpubins/0123.gpubin") == 2
    cct, node = session.current_context(skip=0)
    kernel = cct.placeholder(node, "GPUKernl")
    cct.add(kind, cct.child(kernel, lm, 0x1000, unwound=False), 0, 0.5)
    stream = session.open_stream(500)
    stream.add(kind, stream.placeholder(stream.fence, "GPUTrace"), 0, 0.25)
    session.finish()
    profiles = {int(p.header("thread-id")): p for p in map(hpcrun.read, tmp_path.glob("*.hpcrun"))}
    assert set(profiles) == {1, 500}  # the test's thread was registered on first use
    for profile in profiles.values():
        assert hpcrun.verify(profile) == []
        assert [m.name for m in profile.metrics] == ["CPUTIME (sec)", "GKER (sec)"]
    _, metrics, values = profiles[1].decoded_values()
    assert values[metrics == 1].tolist() == [0.5]
    _, metrics, values = profiles[500].decoded_values()
    assert list(zip(metrics.tolist(), values.tolist(), strict=True)) == [(1, 0.25)]
    text = io.StringIO()
    hpcrun.dump(profiles[1], text)
    assert "GPUKernl" in text.getvalue()


def test_a_bad_count_or_a_failing_gpu_layer_still_leaves_the_profiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing lost: a negative count is written as 0 with a message, and a GPU layer whose
    shutdown fails leaves every thread's profile written."""
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    kind = session.add_metric_kind(
        MetricKind("gpu-count", (MetricSpec("GINS", is_real=False), MetricSpec("GKER (sec)")))
    )
    cct, node = session.current_context(skip=0)
    kernel = cct.placeholder(node, "GPUKernl")
    cct.add(kind, kernel, 0, -8)
    cct.add(kind, kernel, 1, 0.5)

    class Broken:  # an Extension (pyhpctk.measure.extension) whose finish fails
        def thread_ending(self, timeout: float = 10.0) -> None:
            pass

        def finish(self, report: bool = True) -> object:
            raise RuntimeError("the monitor broke")

    session.gpu = Broken()
    session.finish()
    err = capsys.readouterr().err
    assert "finishing the GPU measurement failed (RuntimeError('the monitor broke'))" in err
    assert "integer metric 1 has the value -8" in err and "please report it" in err
    (path,) = tmp_path.glob("*.hpcrun")
    profile = hpcrun.read(path)
    assert hpcrun.verify(profile) == []
    _, metrics, values = profile.decoded_values()
    gpu = [(m, v) for m, v in zip(metrics.tolist(), values.tolist(), strict=True) if m]
    assert gpu == [(2, 0.5)]  # GINS 0 is not stored; the kernel time is kept


@pytest.mark.parametrize("alive", [True, False])
def test_a_thread_missing_from_the_frames_is_kept_while_its_clock_runs(
    tmp_path: Path, parked_thread: threading.Thread, alive: bool
) -> None:
    """A native thread between two calls into Python has no frames but must keep its CCT; a
    thread that ended without telling pyrun (its CPU clock is gone) is written out."""
    assert parked_thread.ident is not None and parked_thread.native_id is not None
    clock = thread_cpu_clock(parked_thread.native_id)

    def thread_cpu(clock_id: int) -> float:
        if clock_id == clock and not alive:
            raise OSError("no such thread")
        return 1.0

    clocks = Clocks(thread_cpu=thread_cpu, current_frames=dict)
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0), clocks)
    session.python.sampler_ident = -1  # as if the sampler thread were running
    state = session.register_thread(parked_thread, ident=parked_thread.ident)
    session.python.sample()
    assert (parked_thread.ident in session.states) is alive
    assert bool(list(tmp_path.glob(f"*-{state.number:03d}-*.hpcrun"))) is not alive


def test_the_event_listing_names_every_gpu_backend_and_option() -> None:
    from pyhpctk.measure.gpu.spec import OPTIONS

    text = event_listing()
    for backend, options in OPTIONS.items():
        assert f"gpu={backend}" in text
        for option in options:
            assert option in text, (backend, option)


def test_an_engine_record_drained_after_an_idle_mark_does_not_send_the_trace_back(
    tmp_path: Path,
) -> None:
    """A handler interrupted before it commits its record can reach the drain after the one that
    marked its thread idle (at a later time): the trace stays in order, as verify requires."""
    import threading as _threading

    from pyhpctk.measure.launch.config import MeasureOptions
    from pyhpctk.measure.sampling.engine import TIMER_CPU, EngineSampler
    from pyhpctk.measure.session import Session

    session = Session(MeasureOptions(str(tmp_path), trace=True, checkpoint_s=0))
    ident, tid = _threading.get_ident(), _threading.get_native_id()
    fid = session.functions.named("work")
    now = session.clocks.epoch_ns()

    class FakeEngine:
        def __init__(self) -> None:
            self.batches: list[list[object]] = []

        def drain(self, *_: object) -> list[object]:
            return self.batches.pop(0) if self.batches else []

    fake = FakeEngine()
    record = (0, [fid << 32 | 7], TIMER_CPU, 1, 5_000_000, 0)
    fake.batches = [
        [(ident, tid, 1, 0, [(*record, now - 50_000_000)])],  # sampled, drained at once
        [],  # the next drain sees nothing: the thread is marked idle at that drain's time
        [(ident, tid, 1, 0, [(*record, now - 1_000_000)])],  # taken before that mark
    ]
    sampler = EngineSampler(session, fake)  # type: ignore[arg-type]
    for _ in range(3):
        sampler.drain()
    times = list(session.states[ident].trace_times)
    assert len(times) == 3
    assert times == sorted(times), times
    assert times[0] == now - 50_000_000


def test_a_thread_the_engine_saw_end_is_written_and_forgotten_at_the_drain(tmp_path: Path) -> None:
    """An ended thread's entries walk its CCT (native frames and Python frames alike), then the
    drain writes its profile and drops its state: nothing is left to write it again at exit."""
    import threading as _threading

    from pyhpctk.measure.launch.config import MeasureOptions
    from pyhpctk.measure.sampling.engine import NATIVE_BIT, TIMER_CPU, EngineSampler
    from pyhpctk.measure.session import Session

    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    ident, tid = 0x7F00DEAD0000, _threading.get_native_id()  # a thread Python never started
    fid = session.functions.named("work")
    native = NATIVE_BIT | 5 << 48 | 0x1234

    class FakeEngine:
        def drain(self, *_: object) -> list[object]:
            entries = [(0, [fid << 32 | 7, native], TIMER_CPU, 1, 5_000_000, 0, 0)]
            return [(ident, tid, 0, 1, entries)]

    sampler = EngineSampler(session, FakeEngine())  # type: ignore[arg-type]
    sampler.drain()
    assert ident not in session.states
    (written,) = tmp_path.glob("*.hpcrun")
    assert written.stat().st_size > 0


@pytest.mark.parametrize(
    ("value", "period"),
    [("", 0.1), ("0.5", 0.5), ("2", 2.0), ("0.001", 0.1), ("5", 0.1), ("fast", 0.1)],
)
def test_drain_period_is_the_default_unless_a_benchmark_sets_a_sane_one(
    monkeypatch: pytest.MonkeyPatch, value: str, period: float
) -> None:
    monkeypatch.setenv(engine.ENV_DRAIN_PERIOD, value)
    assert engine.drain_period(RunSettings(os.environ).drain_s) == period


def _other_interpreter() -> str | None:
    """A CPython 3.12 or 3.13 beside this 3.11 (on PATH, or pyenv's as make test-engine
    finds them)."""
    import shutil
    import subprocess

    pyenv = Path.home() / ".pyenv" / "versions"
    for version in ("3.12", "3.13", "3.11"):
        if version == f"{sys.version_info[0]}.{sys.version_info[1]}":
            continue
        found = [shutil.which(f"python{version}")]
        found += [str(p) for p in sorted(pyenv.glob(f"{version}*/bin/python{version}"))]
        for candidate in filter(None, found):
            if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
                return candidate
    return None


def test_the_fallback_under_another_interpreter_names_the_interpreter_not_a_compiler(
    tmp_path: Path,
) -> None:
    """Issue #36, item 9: the engine built for this CPython is loaded by another version (pyrun
    measuring ``python3.12 app.py`` from a 3.11 installation): the reason is the version.

    The other interpreter reads a copy of the package holding this interpreter's build only (a
    checkout where ``make test-engine`` ran holds one for each version)."""
    import importlib.machinery
    import shutil
    import subprocess

    other = _other_interpreter()
    if other is None:
        pytest.skip("no other CPython version on PATH")
    package = Path(engine.__file__).resolve().parents[2]
    mine_built = [
        p.name
        for p in (package / "measure").glob("_engine.*.so")
        if p.name[len("_engine") :] in importlib.machinery.EXTENSION_SUFFIXES
    ]
    if not mine_built:
        pytest.skip("the sampling engine is not built here")
    others = [
        p.name for p in (package / "measure").glob("_engine.*.so") if p.name not in mine_built
    ]
    shutil.copytree(
        package, tmp_path / "pyhpctk", ignore=shutil.ignore_patterns("__pycache__", *others)
    )
    probe = "from pyhpctk.measure.sampling import engine; print(engine.load_engine()[1])"
    said = subprocess.run(
        [other, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    ).stdout.strip()
    mine = f"CPython {sys.version_info[0]}.{sys.version_info[1]}"
    assert "C compiler" not in said
    assert f"built for {mine} only ({mine_built[0]})" in said, said
    assert "-m pip install" in said and other.split("python")[-1] in said, said


def test_an_engine_built_for_no_interpreter_names_the_build(tmp_path: Path) -> None:
    reason = engine.not_loaded_reason(ImportError("No module named '_engine'"), str(tmp_path))
    assert reason.startswith("the sampling engine is not built") and "C compiler" in reason
    (tmp_path / "_engine.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "_engine.cpython-313-x86_64-linux-gnu.so").write_bytes(b"")
    reason = engine.not_loaded_reason(ImportError("No module named '_engine'"), str(tmp_path))
    if sys.version_info[:2] not in ((3, 11), (3, 13)):
        assert "built for CPython 3.11 and 3.13 only" in reason, reason


def test_an_installed_copy_whose_sources_are_newer_is_not_a_failed_rebuild(tmp_path: Path) -> None:
    """Issue #36, item 9: ``pip install .`` (not editable) writes the engine's C sources into
    site-packages after the built extension; their times say nothing about a rebuild there."""
    import os
    import shutil
    import subprocess

    package = Path(engine.__file__).resolve().parents[2]
    if not (package / "measure" / f"_engine{sysconfig.get_config_var('EXT_SUFFIX')}").exists():
        pytest.skip("the sampling engine is not built here for this interpreter")
    site = tmp_path / "lib" / "python3" / "site-packages"
    shutil.copytree(package, site / "pyhpctk", ignore=shutil.ignore_patterns("__pycache__"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")  # this interpreter's build, the one loaded
    built = site / "pyhpctk" / "measure" / f"_engine{suffix}"
    later = built.stat().st_mtime + 60
    for source in (site / "pyhpctk" / "measure" / "engine_c").iterdir():
        os.utime(source, (later, later))  # as pip writes them: after the extension
    probe = "from pyhpctk.measure.sampling import engine; print(repr(engine.build_problem()))"
    said = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    ).stdout.strip()
    assert said == "''", said
    # In a checkout (setup.py beside src/) the same times do mean a failed rebuild.
    checkout = tmp_path / "checkout"
    shutil.copytree(site, checkout / "src")
    (checkout / "setup.py").write_text("")
    for source in (checkout / "src" / "pyhpctk" / "measure" / "engine_c").iterdir():
        os.utime(source, (later, later))
    said = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(checkout / "src"), "PATH": "/usr/bin:/bin"},
    ).stdout.strip()
    assert "its rebuild failed" in said, said

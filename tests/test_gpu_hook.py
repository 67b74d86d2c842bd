"""The C CUPTI hook (``pyhpctk.measure.gpu.cupti._cuptihook``), called as CUPTI would call it.

No GPU: ``invoke()`` runs the C callback with a ``CUpti_CallbackData`` it fills in, on the
calling thread. ``make test`` builds the extension (setup.py), so a missing build fails here.
The monitor side of the same path (tokens, drains, attribution) runs in every simulated test
that goes through ``install()`` (``hook=auto`` picks the C hook); the end-to-end comparison of
both hooks is at the bottom.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from formats_helpers import STREAM_TRACES
from pyhpctk.measure.gpu import install, shutdown
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.cupti.backend import load_hook
from pyhpctk.measure.gpu.simulated import DEFAULT_RECORDING
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

DRIVER, RUNTIME, RESOURCE = 1, 2, 3  # CUpti_CallbackDomain (cupti_callbacks.h)
LAUNCH, COPY = 307, 279  # any callback ids: the table says what they are
MODULE_LOADED = 6
KERNEL_KIND, COPY_KIND = 1, 2
RECORD = np.dtype([("correlation", "<u8"), ("token", "<i8")])
FIXTURE = Path(DEFAULT_RECORDING)


@pytest.fixture
def hook() -> Iterator[object]:
    native = load_hook()
    assert native is not None, "the C hook is not built: make env builds it (setup.py)"
    native.reset()  # type: ignore[attr-defined]
    yield native
    native.reset()  # type: ignore[attr-defined]


class SlowPath:
    """A stand-in for GpuMonitor.operation_token: one token per (thread, caller line)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.tokens: dict[tuple[str, int, int], int] = {}
        self.token_site: dict[int, tuple[str, int, int]] = {}
        self.lock = threading.Lock()

    def __call__(self, kind: int, correlation: int, multi: int) -> int:
        import sys

        frame = sys._getframe(1)  # the hook calls from C: this is the program's frame
        key = (threading.current_thread().name, frame.f_lineno, kind)  # idents are reused
        with self.lock:
            self.calls.append((kind, correlation, multi))
            token = self.tokens.setdefault(key, len(self.tokens))
            self.token_site[token] = key
        return token


def configure(native: object, slow: Callable[..., int], prefix: str | None = None) -> None:
    native.configure(  # type: ignore[attr-defined]
        [(DRIVER, LAUNCH, KERNEL_KIND, 0, 0), (DRIVER, COPY, COPY_KIND, 0, 0)],
        slow,
        None,
        MODULE_LOADED,
        0xFFFFFFFF,
        prefix,
    )


def drained(native: object) -> np.ndarray:
    return np.frombuffer(native.drain(), dtype=RECORD)  # type: ignore[attr-defined]


def test_a_launch_loop_enters_python_once(hook: object) -> None:
    slow = SlowPath()
    configure(hook, slow)
    for correlation in range(1, 1001):
        hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
        hook.invoke(DRIVER, LAUNCH, 1, correlation)  # exit: ignored  # type: ignore[attr-defined]
    assert [c for _, c, _ in slow.calls] == [1]  # the first operation, recorded by Python
    records = drained(hook)
    assert records["correlation"].tolist() == list(range(2, 1001))
    assert set(records["token"].tolist()) == {0}
    assert hook.stats()["fast"] == 999 and hook.stats()["slow"] == 1  # type: ignore[attr-defined]
    assert len(drained(hook)) == 0  # drained once


def test_each_site_and_kind_gets_its_own_token(hook: object) -> None:
    slow = SlowPath()
    configure(hook, slow)
    for correlation in range(0, 600, 3):
        hook.invoke(DRIVER, LAUNCH, 0, correlation + 1)  # type: ignore[attr-defined]
        hook.invoke(DRIVER, COPY, 0, correlation + 2)  # type: ignore[attr-defined]
        hook.invoke(DRIVER, LAUNCH, 0, correlation + 3)  # type: ignore[attr-defined]
    # Three call sites in one frame: the instruction changes at every call, so every call
    # is a new site (a cache of one site per thread, as the Python path has).
    records = drained(hook)
    seen = {c for _, c, _ in slow.calls} | set(records["correlation"].tolist())
    assert seen == set(range(1, 601))
    kinds = {token: slow.token_site[token][2] for token in slow.token_site}
    lines = {slow.token_site[t][1] for t in slow.token_site}
    assert len(lines) == 3 and sorted(kinds.values()).count(COPY_KIND) == 1


def test_unknown_callbacks_and_exits_do_nothing(hook: object) -> None:
    slow = SlowPath()
    configure(hook, slow)
    hook.invoke(DRIVER, 999, 0, 5)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, LAUNCH, 0, 6)  # the runtime domain has no entry  # type: ignore[attr-defined]
    hook.invoke(DRIVER, LAUNCH, 1, 7)  # type: ignore[attr-defined]
    hook.invoke(RESOURCE, 1, 0, 0)  # type: ignore[attr-defined]
    assert slow.calls == [] and len(drained(hook)) == 0


def test_a_new_epoch_sends_the_next_operation_to_python(hook: object) -> None:
    slow = SlowPath()
    configure(hook, slow)
    for correlation in range(1, 31):
        if correlation in (11, 21):
            hook.bump()  # type: ignore[attr-defined]
        hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
    assert [c for _, c, _ in slow.calls] == [1, 11, 21]
    assert len(drained(hook)) == 27


def test_a_gpu_call_made_by_the_slow_path_is_not_re_entered(hook: object) -> None:
    slow = SlowPath()

    def nested(kind: int, correlation: int, multi: int) -> int:
        hook.invoke(DRIVER, LAUNCH, 0, correlation + 1000)  # type: ignore[attr-defined]
        return slow(kind, correlation, multi)

    configure(hook, nested)
    hook.invoke(DRIVER, LAUNCH, 0, 1)  # type: ignore[attr-defined]
    assert hook.stats()["nested"] == 1 and len(slow.calls) == 1  # type: ignore[attr-defined]


def test_frames_under_the_skip_prefix_are_looked_through(hook: object, tmp_path: Path) -> None:
    namespace: dict[str, object] = {}
    fake = str(tmp_path / "measure") + "/"
    source = "def one(f, *a):\n    f(*a)\n\ndef two(f, *a):\n    f(*a)\n"
    exec(compile(source, fake + "wrapper.py", "exec"), namespace)
    wrappers: list[Callable[..., None]] = [namespace["one"], namespace["two"]]  # type: ignore[list-item]
    for prefix, expected_slow in ((fake, 1), (None, 2)):
        hook.reset()  # type: ignore[attr-defined]
        slow = SlowPath()
        configure(hook, slow, prefix)
        # Two wrappers in turn: looked through, one program frame and line (one site); not
        # looked through, each wrapper's line is a site of its own.
        for correlation in range(1, 51):
            wrappers[correlation % 2](hook.invoke, DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
        assert len(slow.calls) == expected_slow, prefix


def library_launch(hook: object, correlation: int) -> None:
    """A library's Python wrapper: a new frame at every call, the same code and instruction."""
    hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]


def test_a_new_wrapper_frame_at_the_same_site_is_recognised_by_its_callers(hook: object) -> None:
    slow = SlowPath()
    configure(hook, slow)
    for correlation in range(1, 101):
        library_launch(hook, correlation)
    stats = hook.stats()  # type: ignore[attr-defined]
    assert len(slow.calls) == 1 and stats["chain"] == 99 and len(drained(hook)) == 99
    hook.reset()  # type: ignore[attr-defined]
    slow = SlowPath()
    configure(hook, slow)
    for correlation in range(1, 101, 2):  # the same wrapper called from two lines in turn
        library_launch(hook, correlation)
        library_launch(hook, correlation + 1)
    assert len(slow.calls) == 2  # two sites, each recognised thereafter
    for correlation in range(1000, 1060, 6):  # six callers of one wrapper, ten times over
        six_callers(hook, correlation)
    assert len(slow.calls) == 2 + 6  # each caller's site unwound once
    records = drained(hook)
    everything = sorted(records["correlation"].tolist() + [c for _, c, _ in slow.calls])
    assert everything == list(range(1, 101)) + list(range(1000, 1060))


def six_callers(hook: object, base: int) -> None:
    library_launch(hook, base)
    library_launch(hook, base + 1)
    library_launch(hook, base + 2)
    library_launch(hook, base + 3)
    library_launch(hook, base + 4)
    library_launch(hook, base + 5)


def test_threads_record_concurrently_while_the_monitor_drains(hook: object) -> None:
    slow = SlowPath()
    configure(hook, slow)
    per_thread = 9000  # more than two chunks of 4096 records each
    threads_n = 4
    taken: list[np.ndarray] = []
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            taken.append(drained(hook))

    def producer(base: int) -> None:
        for index in range(per_thread):
            hook.invoke(DRIVER, LAUNCH, 0, base + index)  # type: ignore[attr-defined]

    consumer = threading.Thread(target=monitor)
    consumer.start()
    producers = [threading.Thread(target=producer, args=(n * 100_000,)) for n in range(threads_n)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    stop.set()
    consumer.join()
    taken.append(drained(hook))
    records = np.concatenate(taken)
    in_python = [c for _, c, _ in slow.calls]
    everything = sorted(records["correlation"].tolist() + in_python)
    assert everything == sorted(
        n * 100_000 + i for n in range(threads_n) for i in range(per_thread)
    )
    # Each record carries its own thread's token, and a thread's records stay in order.
    for token in set(records["token"].tolist()):
        name = slow.token_site[token][0]
        mine = records["correlation"][records["token"] == token]
        assert (np.diff(mine.astype(np.int64)) > 0).all()
        assert len({int(c) // 100_000 for c in mine}) == 1, name
    assert hook.stats()["lost"] == 0  # type: ignore[attr-defined]


def test_loaded_modules_are_copied_for_the_monitor(hook: object) -> None:
    configure(hook, SlowPath())
    hook.invoke(RESOURCE, MODULE_LOADED, 0, 0, 0, b"\x7fELF-one")  # type: ignore[attr-defined]
    hook.invoke(RESOURCE, MODULE_LOADED, 0, 0, 0, b"\x7fELF-two")  # type: ignore[attr-defined]
    assert hook.take_modules() == [b"\x7fELF-one", b"\x7fELF-two"]  # type: ignore[attr-defined]
    assert hook.take_modules() == []  # type: ignore[attr-defined]


def test_reset_drops_what_an_earlier_configuration_recorded(hook: object) -> None:
    configure(hook, SlowPath())
    for correlation in range(1, 10):
        hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
    hook.reset()  # type: ignore[attr-defined]
    assert len(drained(hook)) == 0
    with pytest.raises(TypeError):
        hook.configure([], SlowPath(), None, 0, 0, 42)  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        hook.configure([(DRIVER, 99999, 1, 0, 0)], SlowPath(), None, 0, 0)  # type: ignore[attr-defined]


def _launch_loop(gpu: object, launches: int) -> None:
    for _ in range(launches):
        gpu.launch()  # type: ignore[attr-defined]
        gpu.copy()  # type: ignore[attr-defined]


@pytest.mark.parametrize("hook_name", ["c", "python"])
def test_both_hooks_attribute_the_same_metrics(hook_name: str, tmp_path: Path) -> None:
    """A launch loop through each hook: every activity matched, the same totals and nodes."""
    session = Session(MeasureOptions(str(tmp_path), trace=False, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    monitor = install(session, f"gpu=simulated,recording={FIXTURE},buffer=64,hook={hook_name}")
    backend = monitor.backend
    assert (getattr(backend, "native", None) is not None) == (hook_name == "c")
    _launch_loop(backend, 500)
    stats = shutdown(monitor, report=False)
    assert stats.operations == 1000 and stats.matched == 1000 and stats.unmatched == 0
    cct = session.states[threading.get_ident()].cct
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = cct.kinds[kind.name]
    counts = sorted(
        store.get(node, gm.GKER_COUNT) for node in store.slot_of if store.get(node, gm.GKER_COUNT)
    )
    copies = sorted(
        store.get(node, gm.GXCOPY_COUNT)
        for node in store.slot_of
        if store.get(node, gm.GXCOPY_COUNT)
    )
    assert sum(counts) == 500 and sum(copies) == 500
    assert len(counts) == 1  # one kernel node: every launch under the same line


# -- the monitor's side of the C hook: tokens matched and attributed as arrays --------------


def _hooked_monitor(tmp_path: Path, trace: bool = False) -> tuple[Session, object, object]:
    """A session and monitor whose operations come through the C hook, buffers by hand."""
    from pyhpctk.measure.gpu.monitor import GpuMonitor
    from pyhpctk.measure.gpu.simulated import recording as rec
    from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend

    session = Session(MeasureOptions(str(tmp_path), trace=trace, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    backend = SimulatedBackend(rec.load(str(FIXTURE)), hook="c")
    monitor = GpuMonitor(
        session, session.add_metric_kind(gm.gpu_metric_kind()), trace=trace, backend=backend
    )
    backend.start(monitor, paused=True)
    assert backend.native is not None
    native = backend.native
    native.configure(  # type: ignore[attr-defined]
        [(DRIVER, LAUNCH, KERNEL_KIND, 0, 0), (DRIVER, COPY, KERNEL_KIND, 1, 0)],
        monitor.operation_token,
        None,
        0xFFFFFFFF,
        0xFFFFFFFF,
        None,
    )
    return session, monitor, native


def _kernel_rows(correlations: list[int], start: int = 1000) -> np.ndarray:
    from pyhpctk.measure.gpu import activity as act

    rows = act.empty_activities(len(correlations))
    rows["kind"] = act.KERNEL
    rows["correlation"] = correlations
    rows["start"] = start + 100 * np.arange(len(correlations))
    rows["end"] = rows["start"] + 50
    rows["stream"] = 7
    return rows


def _kernel_counts(session: Session) -> dict[str, float]:
    """GKER:COUNT per CCT (by thread) and under the unknown placeholder, from the stores."""
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    out: dict[str, float] = {}
    for ident, state in session.states.items():
        store = state.cct.kinds.get(kind.name)
        if store is not None:
            out[str(ident)] = sum(store.get(n, gm.GKER_COUNT) for n in store.slot_of)
    return out


def launch_here(hook: object, correlation: int) -> None:
    hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]


def graph_here(hook: object, correlation: int) -> None:
    hook.invoke(DRIVER, COPY, 0, correlation)  # type: ignore[attr-defined]


def test_hooked_operations_known_unknown_and_from_threads_in_one_buffer(tmp_path: Path) -> None:
    from pyhpctk.formats import hpctrace
    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path, trace=True)
    for correlation in range(1, 101):  # one site: 1 through Python, 99 through the hook
        launch_here(native, correlation)
    idents: list[int] = []
    launched, finish = threading.Event(), threading.Event()

    def worker() -> None:  # alive until its activities are attributed, as under pyrun
        session.register_thread(threading.current_thread())
        idents.append(threading.get_ident())
        for correlation in range(1001, 1051):
            launch_here(native, correlation)
        launched.set()
        finish.wait(30)

    thread = threading.Thread(target=worker)
    thread.start()
    assert launched.wait(30)
    # One buffer: both threads' kernels, and 3 activities no operation announced.
    monitor.buffer_completed(_kernel_rows([*range(1, 101), *range(1001, 1051), 5001, 5002, 5003]))
    assert monitor.wait_processed()
    stats = shutdown(monitor, report=False)
    counts = _kernel_counts(session)
    finish.set()
    thread.join()
    assert stats.operations == 150 and stats.matched == 150 and stats.unmatched == 3
    assert counts[str(threading.get_ident())] == 100
    assert counts[str(idents[0])] == 50
    unknown = monitor.unknown_cct()  # type: ignore[attr-defined]
    assert unknown is not None
    session.finish()
    traced = 0
    for path in tmp_path.glob(STREAM_TRACES):
        traced += len(hpctrace.read(path).records)
    assert traced == 2 * 153  # every activity, the unknown ones too: a start and an end each


def test_a_hooked_operation_answered_by_several_activities_stays_pending(tmp_path: Path) -> None:
    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path)
    for correlation in (1, 2, 3):  # "graph launches": each answered by several kernels
        graph_here(native, correlation)
    monitor.buffer_completed(_kernel_rows([1, 2, 3, 1, 2]))
    monitor.buffer_completed(_kernel_rows([3, 1, 2, 3], start=9000))
    assert monitor.wait_processed()
    stats = shutdown(monitor, report=False)
    assert stats.matched == 9 and stats.unmatched == 0
    assert stats.unmatched_operations == 0  # a graph launch is never "unanswered"
    assert _kernel_counts(session)[str(threading.get_ident())] == 9


def test_a_forked_child_records_nothing(hook: object) -> None:
    import os

    slow = SlowPath()
    configure(hook, slow)
    hook.invoke(DRIVER, LAUNCH, 0, 1)  # type: ignore[attr-defined]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the hook forgot its configuration (no monitor survives a fork)
        try:
            for correlation in range(2, 50):
                hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
            os.write(write, b"%d %d" % (len(slow.calls), len(drained(hook))))
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    assert answer == "1 0", answer  # the parent's slow call was before the fork; none after
    for correlation in (50, 51):  # the parent goes on as before: a new site, then the hook
        hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
    assert len(slow.calls) == 2 and drained(hook)["correlation"].tolist() == [51]


def test_operations_no_activity_answers_leave_the_searched_array(tmp_path: Path) -> None:
    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path)
    for correlation in range(1, 101):
        launch_here(native, correlation)
    for buffer in range(6):  # buffers of other work: these 100 operations wait, then age
        monitor.buffer_completed(_kernel_rows([9000 + buffer]))
    assert monitor.wait_processed()
    waiting = monitor.matcher.native_pending  # type: ignore[attr-defined]
    matcher = monitor.matcher  # type: ignore[attr-defined]
    assert len(waiting) == 0 and len(matcher.pending) == 1 and len(matcher.aged) == 99
    monitor.buffer_completed(_kernel_rows(list(range(1, 101))))  # the late activities
    assert monitor.wait_processed()
    stats = shutdown(monitor, report=False)
    assert stats.matched == 100 and stats.unmatched == 6 and stats.unmatched_operations == 0
    assert _kernel_counts(session)[str(threading.get_ident())] == 100


def _generator_launches(hook: object) -> Iterator[None]:
    correlation = 0
    while True:
        correlation += 1
        hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
        yield


def resume_here(generator: Iterator[None]) -> None:
    next(generator)


def resume_there(generator: Iterator[None]) -> None:
    next(generator)


def test_a_generator_resumed_from_two_callers_is_two_sites(hook: object) -> None:
    slow = SlowPath()
    configure(hook, slow)
    generator = _generator_launches(hook)
    for index in range(20):  # one generator frame, one instruction, two callers in turn
        (resume_here if index % 2 else resume_there)(generator)
    # Each caller's path once; then the hook tells them apart. (Python 3.11 moves a call's
    # instruction offset when it specializes the call, after 8 runs: once more each there.)
    assert len(slow.calls) in (2, 4), slow.calls
    records = drained(hook)
    assert len(records) == 20 - len(slow.calls) and len(set(records["token"].tolist())) == 1
    # (the stand-in keys tokens on the generator's own line; the monitor test checks that
    # the monitor's tokens put each caller's kernels under that caller)


# -- issue #18: thousands of call sites, driver calls inside runtime calls, no GIL ------------

RT_LAUNCH = 211  # any runtime callback id
INNER_TAG = 1 << 61  # operations.INNER_TAG
UNTAGGED = INNER_TAG - 1


class ChainSlowPath(SlowPath):
    """A stand-in whose tokens tell call chains apart: keyed by the caller of the launching
    wrapper (``sys._getframe(2)``), so a token names the chain a record came from."""

    def __call__(self, kind: int, correlation: int, multi: int) -> int:
        import sys

        key = (threading.current_thread().name, sys._getframe(2).f_code.co_name, kind)
        with self.lock:
            self.calls.append((kind, correlation, multi))
            token = self.tokens.setdefault(key, len(self.tokens))  # type: ignore[arg-type]
            self.token_site[token] = key  # type: ignore[assignment]
        return token


def _callers(count: int, wrapper: Callable[..., None]) -> list[Callable[..., None]]:
    """``count`` functions, each a code object of its own, each calling ``wrapper``: as many
    call chains through one library wrapper (a model's layer instances)."""
    namespace: dict[str, object] = {"wrapper": wrapper}
    source = "".join(
        f"def caller_{index}(hook, correlation):\n    wrapper(hook, correlation)\n\n"
        for index in range(count)
    )
    exec(compile(source, "<callers>", "exec"), namespace)
    return [namespace[f"caller_{index}"] for index in range(count)]  # type: ignore[misc]


def test_a_thousand_call_chains_are_each_unwound_once(hook: object) -> None:
    slow = ChainSlowPath()
    configure(hook, slow)
    callers = _callers(1000, library_launch)
    made_by: dict[int, str] = {}
    correlation = 0
    for _ in range(3):  # three "steps" of a forward pass through 1000 layer instances
        for caller in callers:
            correlation += 1
            made_by[correlation] = caller.__name__
            caller(hook, correlation)
    # Each chain through Python once (a cache of 64 sites unwound nearly every call).
    assert len(slow.calls) == 1000
    assert {made_by[c] for _, c, _ in slow.calls} == set(made_by.values())
    records = drained(hook)
    assert len(records) == 2000
    for recorded, token in zip(
        records["correlation"].tolist(), records["token"].tolist(), strict=True
    ):
        assert slow.token_site[token][1] == made_by[recorded]  # its own chain's token
    stats = hook.stats()  # type: ignore[attr-defined]
    assert stats["fast"] == 2000 and stats["sites"] == 1000 and stats["resets"] == 0


def test_a_driver_call_inside_a_runtime_call_is_part_of_it(hook: object) -> None:
    """cudaLaunchKernel makes cuLaunchKernel: one operation, the runtime call's (its id is the
    one the kernel's activity carries), not two with one never answered."""
    slow = SlowPath()
    hook.configure(  # type: ignore[attr-defined]
        [(RUNTIME, RT_LAUNCH, KERNEL_KIND, 0, 0), (DRIVER, LAUNCH, KERNEL_KIND, 0, 0)],
        slow,
        None,
        MODULE_LOADED,
        0xFFFFFFFF,
    )
    hook.invoke(RUNTIME, RT_LAUNCH, 1, 999)  # an exit whose entry came before: no harm  # type: ignore[attr-defined]
    for correlation in range(1, 41, 2):
        hook.invoke(RUNTIME, RT_LAUNCH, 0, correlation)  # type: ignore[attr-defined]
        hook.invoke(DRIVER, LAUNCH, 0, correlation + 1)  # type: ignore[attr-defined]
        hook.invoke(DRIVER, LAUNCH, 1, correlation + 1)  # type: ignore[attr-defined]
        hook.invoke(RUNTIME, RT_LAUNCH, 1, correlation)  # type: ignore[attr-defined]
    hook.invoke(DRIVER, LAUNCH, 0, 1000)  # the program's own driver call: an operation  # type: ignore[attr-defined]
    records = drained(hook)
    inner = (records["correlation"] & INNER_TAG) != 0
    recorded = [c for _, c, _ in slow.calls] + records["correlation"][~inner].tolist()
    assert sorted(recorded) == [*range(1, 41, 2), 1000]
    assert hook.stats()["inner"] == 20  # type: ignore[attr-defined]
    # The inner calls' ids go along, tagged, with their runtime call's token (in case CUPTI
    # gave an activity the inner id): the monitor does not count them as operations.
    tagged = records[inner]
    assert (tagged["correlation"] & UNTAGGED).tolist() == list(range(2, 42, 2))
    assert slow.calls[0][1] == 1 and set(tagged["token"].tolist()) == {0}  # the first site's


def test_a_stack_deeper_than_the_cache_holds_is_unwound_every_time(hook: object) -> None:
    import sys

    slow = SlowPath()
    configure(hook, slow)

    def down(depth: int, correlation: int) -> None:
        if depth:
            down(depth - 1, correlation)
        else:
            hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 3000))
    try:
        for correlation in (1, 2, 3):
            down(1100, correlation)  # more frames than a site holds (1024)
    finally:
        sys.setrecursionlimit(limit)
    assert [c for _, c, _ in slow.calls] == [1, 2, 3] and len(drained(hook)) == 0
    assert hook.stats()["deep"] == 3  # type: ignore[attr-defined]


def test_a_full_site_table_is_emptied_and_refilled(hook: object) -> None:
    """Past 8192 sites a thread's table starts again: memory stays bounded, nothing is lost."""
    sites = 9000
    source = "def many(hook, first):\n" + "".join(
        f"    hook.invoke({DRIVER}, {LAUNCH}, 0, first + {line})\n" for line in range(sites)
    )
    namespace: dict[str, object] = {}
    exec(compile(source, "<many sites>", "exec"), namespace)
    many: Callable[[object, int], None] = namespace["many"]  # type: ignore[assignment]
    slow: list[int] = []  # (no line numbers: finding one in a 9000-line function is slow)
    configure(hook, lambda kind, correlation, multi: slow.append(correlation) or 0)
    # A thread of its own: the test's thread may hold sites of earlier tests.
    thread = threading.Thread(target=lambda: (many(hook, 1), many(hook, 100_001)))
    thread.start()
    thread.join()
    stats = hook.stats()  # type: ignore[attr-defined]
    assert stats["resets"] >= 2 and stats["sites"] == len(slow) >= sites
    recorded = sorted(slow + drained(hook)["correlation"].tolist())
    assert recorded == [*range(1, 1 + sites), *range(100_001, 100_001 + sites)]


@pytest.fixture(scope="module")
def fake_cupti(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpu_helpers import build_fake_cupti

    return build_fake_cupti(tmp_path_factory.mktemp("fake"))


def test_a_thread_without_the_gil_records_without_taking_it(hook: object, fake_cupti: Path) -> None:
    """PyTorch's autograd workers launch with a thread state but without the GIL: a known site
    is recorded without waiting for the GIL, which the program's thread may hold for long."""
    import ctypes
    import sys
    import time

    fake = ctypes.CDLL(str(fake_cupti))
    done = ctypes.PyDLL(str(fake_cupti)).fake_worker_done  # PyDLL: asked with the GIL held
    tokens: list[int] = []
    hook.configure(  # type: ignore[attr-defined]
        [(RUNTIME, RT_LAUNCH, KERNEL_KIND, 0, 0), (DRIVER, LAUNCH, KERNEL_KIND, 0, 0)],
        lambda kind, correlation, multi: tokens.append(correlation) or 7,
        None,
        MODULE_LOADED,
        0xFFFFFFFF,
    )
    # Without the interpreter's internal headers (FRAME_WALK "public") frames are read with
    # the GIL: every call takes it, and then the program's thread must not keep it.
    interpreter = hook.FRAME_WALK == "interpreter"  # type: ignore[attr-defined]
    hook.subscribe(str(fake_cupti))  # type: ignore[attr-defined]
    try:
        fake.fake_worker_start(1, RT_LAUNCH, LAUNCH, 1)  # the worker's site: through Python
        while not done():
            time.sleep(0.001)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(5.0 if interpreter else interval)  # a waiter: 5 s per call
        try:
            fake.fake_worker_start(2000, RT_LAUNCH, LAUNCH, 101)
            deadline = time.monotonic() + 2.0
            while interpreter and not done() and time.monotonic() < deadline:
                pass  # Python bytecode: this thread keeps the GIL all along
            finished = bool(done()) or not interpreter
        finally:
            sys.setswitchinterval(interval)
        deadline = time.monotonic() + 120
        while not done() and time.monotonic() < deadline:  # (a hook that needs the GIL)
            time.sleep(0.01)
    finally:
        hook.unsubscribe()  # type: ignore[attr-defined]
    assert finished, "the worker waited for the GIL"
    assert tokens == [1]
    records = drained(hook)
    inner = (records["correlation"] & INNER_TAG) != 0
    assert records["correlation"][~inner].tolist() == list(range(101, 4101, 2))
    assert (records["correlation"][inner] & UNTAGGED).tolist() == [2, *range(102, 4102, 2)]
    assert set(records["token"].tolist()) == {7}
    stats = hook.stats()  # type: ignore[attr-defined]
    assert stats["unlocked"] == (2000 if interpreter else 0) and stats["inner"] == 2001


def calls_here(fake: object, first: int, count: int) -> None:
    for correlation in range(first, first + count):
        fake.fake_api(DRIVER, LAUNCH, correlation)  # type: ignore[attr-defined]


def calls_there(fake: object, first: int, count: int) -> None:
    for correlation in range(first, first + count):
        fake.fake_api(DRIVER, LAUNCH, correlation)  # type: ignore[attr-defined]


def _kernels_under(session: Session, code: object) -> float:
    """GKER:COUNT below the frames of ``code`` in the calling thread's CCT."""
    cct = session.states[threading.get_ident()].cct
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = cct.kinds[kind.name]
    fid = session.functions.fid(code)
    total = 0.0
    for node in store.slot_of:
        walk = node
        while walk >= 0 and not (cct.lm[walk] == session.python_lm and cct.ip[walk] >> 32 == fid):
            walk = cct.parent[walk]
        if walk >= 0:
            total += store.get(node, gm.GKER_COUNT)
    return total


def test_operations_made_with_the_gil_released_land_on_their_lines(
    tmp_path: Path, fake_cupti: Path
) -> None:
    """Calls through ctypes release the GIL, as libraries do around CUDA calls: the hook reads
    the calling thread's frames without it, and each line gets exactly its kernels."""
    import ctypes

    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path)
    fake = ctypes.CDLL(str(fake_cupti))
    native.subscribe(str(fake_cupti))  # type: ignore[attr-defined]
    try:
        for first in range(1, 301, 30):
            calls_here(fake, first, 10)
            calls_there(fake, first + 10, 20)
    finally:
        native.unsubscribe()  # type: ignore[attr-defined]
    stats_hook = native.stats()  # type: ignore[attr-defined]
    monitor.buffer_completed(_kernel_rows(list(range(1, 301))))
    assert monitor.wait_processed()
    stats = shutdown(monitor, report=False)
    assert stats.matched == 300 and stats.unmatched == 0
    assert _kernels_under(session, calls_here.__code__) == 100
    assert _kernels_under(session, calls_there.__code__) == 200
    unlocked = 298 if native.FRAME_WALK == "interpreter" else 0  # type: ignore[attr-defined]
    assert stats_hook["slow"] == 2 and stats_hook["unlocked"] == unlocked


def test_the_monitor_attributes_and_known_sites_stay_out_of_python(tmp_path: Path) -> None:
    """Activities are attributed by the monitor, with no later operation of the thread (the
    paper's safe point), and a buffer does not send known sites back through Python; a thread
    whose CCT the session replaced has its sites unwound once more, into the new CCT."""
    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path)
    ident = threading.get_ident()
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    slow: list[int] = []
    old = session.states[ident].cct
    for phase, correlations in enumerate((range(1, 11), range(11, 12), range(12, 16))):
        slow.append(native.stats()["slow"])  # type: ignore[attr-defined]
        for correlation in correlations:  # one line: one call site
            launch_here(native, correlation)
        if phase == 0:
            monitor.buffer_completed(_kernel_rows(list(correlations)))
            assert monitor.wait_processed()
            assert _kernel_counts(session)[str(ident)] == 10  # attributed already
        elif phase == 1:
            old = session.states.pop(ident).cct  # the session wrote the thread out, forgot it
            session.register_thread(threading.current_thread(), main=True)
            monitor.buffer_completed(_kernel_rows(list(correlations)))
            assert monitor.wait_processed()
    slow.append(native.stats()["slow"])  # type: ignore[attr-defined]
    assert slow == [0, 1, 1, 2]  # the site: unwound first, known after a buffer, unwound anew
    monitor.buffer_completed(_kernel_rows(list(range(12, 16))))
    stats = shutdown(monitor, report=False)
    assert stats.matched == 15
    assert _kernel_counts(session)[str(ident)] == 5  # 11 moved over, 12-15 unwound into it
    assert sum(old.kinds[kind.name].get(n, gm.GKER_COUNT) for n in range(len(old))) == 10


def test_a_thousand_layers_through_the_simulated_runtime_are_attributed_exactly(
    tmp_path: Path,
) -> None:
    from pyhpctk.measure.gpu import shutdown

    session = Session(MeasureOptions(str(tmp_path), trace=False, checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    monitor = install(session, f"gpu=simulated,recording={FIXTURE},buffer=512,hook=c")
    backend = monitor.backend
    native = backend.native  # type: ignore[attr-defined]
    callers = _callers(1000, lambda gpu, count: [gpu.launch() for _ in range(count)])
    for _ in range(3):
        for index, caller in enumerate(callers):
            caller(backend, 1 + index % 2)  # 1 or 2 launches per layer and step
    hook_stats = native.stats()
    stats = shutdown(monitor, report=False)
    assert stats.matched == stats.operations == 3 * 1500 and stats.unmatched == 0
    # Each layer's site once (CPython 3.11 moves the instruction of a call it specializes, so
    # the first layers' shared wrapper can count as another site once more: a few at most).
    assert 1000 <= hook_stats["slow"] <= 1010
    cct = session.states[threading.get_ident()].cct
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = cct.kinds[kind.name]
    caller_of = {session.functions.fid(c.__code__): i for i, c in enumerate(callers)}
    counts = [0.0] * len(callers)
    for node in store.slot_of:
        walk = node
        while walk >= 0 and not (
            cct.lm[walk] == session.python_lm and cct.ip[walk] >> 32 in caller_of
        ):
            walk = cct.parent[walk]
        if walk >= 0:
            counts[caller_of[cct.ip[walk] >> 32]] += store.get(node, gm.GKER_COUNT)
    assert counts == [3.0 * (1 + index % 2) for index in range(len(callers))]


def test_a_kernel_whose_gpubin_comes_later_goes_under_its_entry_from_then_on(
    tmp_path: Path,
) -> None:
    """Attribution remembers each group's node, but not a kernel's while its gpubin is unknown."""
    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path)
    for correlation in range(1, 9):
        launch_here(native, correlation)
    first, second = _kernel_rows([1, 2, 3, 4]), _kernel_rows([5, 6, 7, 8], start=9000)
    first["function"] = second["function"] = 0
    monitor.buffer_completed(first, ["kernel_a"])
    assert monitor.wait_processed()
    lm = session.add_load_module("/tmp/kernel_a.gpubin")
    monitor.kernels.add(lm, {"kernel_a": 0x100})  # type: ignore[attr-defined]
    monitor.buffer_completed(second, ["kernel_a"])
    shutdown(monitor, report=False)
    cct = session.states[threading.get_ident()].cct
    kind = next(k for k in session.kinds if k.name == gm.GPU_KIND_NAME)
    store = cct.kinds[kind.name]
    by_module: dict[int, float] = {}
    for node in store.slot_of:
        by_module[cct.lm[node]] = by_module.get(cct.lm[node], 0) + store.get(node, gm.GKER_COUNT)
    assert by_module == {0: 4, lm: 4}  # the placeholder first, then kernel_a's entry


def test_an_activity_with_an_inner_driver_calls_id_goes_to_its_runtime_call(
    tmp_path: Path,
) -> None:
    """Should CUPTI give a kernel the id of the driver call inside the runtime call, the
    kernel still goes under the runtime call's line, counted in ``inner_matched``."""
    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path)
    native.configure(  # type: ignore[attr-defined]
        [(RUNTIME, RT_LAUNCH, KERNEL_KIND, 0, 0), (DRIVER, LAUNCH, KERNEL_KIND, 0, 0)],
        monitor.operation_token,
        None,
        0xFFFFFFFF,
        0xFFFFFFFF,
        None,
    )
    for correlation in range(1, 21, 2):
        runtime_launch(native, correlation)
    # Half the kernels carry the runtime call's id, half the inner driver call's.
    monitor.buffer_completed(_kernel_rows([*range(1, 11, 2), *range(12, 22, 2)]))
    stats = shutdown(monitor, report=False)
    assert stats.matched == 10 and stats.unmatched == 0 and stats.inner_matched == 5
    assert stats.operations == 10  # the runtime calls only
    assert _kernels_under(session, runtime_launch.__code__) == 10


def runtime_launch(hook: object, correlation: int) -> None:
    hook.invoke(RUNTIME, RT_LAUNCH, 0, correlation)  # type: ignore[attr-defined]
    hook.invoke(DRIVER, LAUNCH, 0, correlation + 1)  # type: ignore[attr-defined]
    hook.invoke(DRIVER, LAUNCH, 1, correlation + 1)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, RT_LAUNCH, 1, correlation)  # type: ignore[attr-defined]


def runtime_launch_one_id(hook: object, correlation: int) -> None:
    hook.invoke(RUNTIME, RT_LAUNCH, 0, correlation)  # type: ignore[attr-defined]
    hook.invoke(DRIVER, LAUNCH, 0, correlation)  # type: ignore[attr-defined]
    hook.invoke(DRIVER, LAUNCH, 1, correlation)  # type: ignore[attr-defined]
    hook.invoke(RUNTIME, RT_LAUNCH, 1, correlation)  # type: ignore[attr-defined]


def test_an_inner_call_with_its_runtime_calls_id_leaves_no_operation_unanswered(
    tmp_path: Path,
) -> None:
    """Where the inner driver call has the runtime call's own id, each kernel answers its runtime
    call, the one recorded in Python (the site's first, slow path) too: on the H200 every slow
    path's runtime call was left unanswered, the kernel claimed through the inner call."""
    from pyhpctk.measure.gpu import shutdown

    session, monitor, native = _hooked_monitor(tmp_path)
    native.configure(  # type: ignore[attr-defined]
        [(RUNTIME, RT_LAUNCH, KERNEL_KIND, 0, 0), (DRIVER, LAUNCH, KERNEL_KIND, 0, 0)],
        monitor.operation_token,
        None,
        0xFFFFFFFF,
        0xFFFFFFFF,
        None,
    )
    for correlation in range(1, 11):
        runtime_launch_one_id(native, correlation)
    monitor.buffer_completed(_kernel_rows(list(range(1, 11))))
    stats = shutdown(monitor, report=False)
    assert stats.matched == 10 and stats.unmatched == 0
    assert stats.unmatched_operations == 0 and stats.inner_matched == 0
    assert _kernels_under(session, runtime_launch_one_id.__code__) == 10

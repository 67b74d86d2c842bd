"""pyrun's sampling engine seen from Python: choosing it, and turning its samples into CCTs.

The engine (the C extension ``pyhpctk.measure._engine``, sources in ``engine_c/``) samples every
thread of the process from a signal handler on the sampled thread itself: per-thread timers on
each thread's CPU clock (CPUTIME) and on the monotonic clock (REALTIME, GILWAIT), the thread's
Python frames read as they are at the tick, its GIL state, into a per-thread ring. Threads that
Python never started (BLAS and OpenMP pools) are found by the engine's monitor thread and
sampled the same way. See docs/pyrun.md, "Sampling".

:class:`EngineSampler` is the session's side of it, a :class:`~.sampler.Sampler` holding the
session's :class:`~pyhpctk.measure.session.table.ThreadTable`: the sampling thread
(:mod:`.thread`) becomes the *drain*, which every :data:`DRAIN_PERIOD_S` (and at a thread's
end, at checkpoints and at exit) takes the records out of the rings and has each thread's CCT
insert them (:meth:`~pyhpctk.measure.cct.ThreadCCT.insert_samples`), adding to each metric what
the event registry (:mod:`pyhpctk.measure.events`) says a sample of its clock adds.

Where the extension is missing (no C compiler at install), the interpreter is not supported
(free-threaded builds; versions other than 3.11 to 3.13) or ``PYHPCTK_PYRUN_SAMPLER=thread``
asks for it, the session falls back to its Python sampler thread, and says once why (self time
then lands at GIL switch points, and threads that never run Python are not measured).

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time

from pyhpctk.measure.cct import NATIVE_BIT as NATIVE_BIT
from pyhpctk.measure.events import CLOCK_THREAD_CPU, CLOCK_WALL, READ_GIL_WAIT
from pyhpctk.measure.gc_context import GC_FUNCTION, listen, stop_listening
from pyhpctk.measure.settings import ENV_CPU_TIMER as ENV_CPU_TIMER
from pyhpctk.measure.settings import ENV_DRAIN_PERIOD as ENV_DRAIN_PERIOD
from pyhpctk.measure.settings import ENV_FALLBACK_SAID
from pyhpctk.measure.settings import ENV_SAMPLER as ENV_SAMPLER
from pyhpctk.measure.thread_names import comm_name

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from types import ModuleType

    from pyhpctk.measure.sampling.tasks import TaskChains
    from pyhpctk.measure.session.table import ThreadTable
    from pyhpctk.measure.thread_state import ThreadState

    #: One drained sample: (common, ips, timer, gil, cpu_ns, wall_ns, time_ns)
    Entry = tuple[int, tuple[int, ...], int, int, int, int, int]

DRAIN_PERIOD_S = 0.1
UNKNOWN_CODE = "<unknown code>"  # a frame whose code object died before it could be named
TRUNCATED = "<truncated stack>"  # the outer frames of a stack deeper than the engine keeps

# Engine timers and GIL states (engine_c/engine.h).
TIMER_CPU, TIMER_WALL, TIMER_END = 0, 1, 2
GIL_NO_PYTHON, GIL_HELD, GIL_WAITING, GIL_RELEASED = 0, 1, 2, 3
FIELD_CPU, FIELD_WALL = 0, 1
# The process's CPU time in no profile is told when it is above both (EngineSampler.report).
UNSAMPLED_MIN_S = 0.05
UNSAMPLED_MIN_SHARE = 0.05


def cpu_timer_route(chosen: str = "") -> int:
    """How the engine takes CPU samples: 0 timers on the threads' CPU clocks, 1 perf_events
    counters that signal through O_ASYNC and the engine's realtime signal (the default), 2
    counters that raise SIGTRAP (asked for with ``sigtrap``: cheaper, but a C library that takes
    SIGTRAP behind Python's back, as LLVM's crash recovery under Triton does, gets samples until
    the monitor notices; the engine falls back to 1 on kernels before 5.13 and under a
    debugger, which stops at every SIGTRAP). ``chosen``: the setting
    (``PYHPCTK_PYRUN_CPU_TIMER``)."""
    if chosen == "posix":
        return 0
    if chosen == "sigtrap" and not _traced():
        return 2
    return 1


def _traced() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("TracerPid:"):
                    return line.split()[1:2] != ["0"]
    except OSError:
        pass
    return False


def drain_period(setting: str = "") -> float:
    """Seconds between two drains: :data:`DRAIN_PERIOD_S`, or what ``setting`` (the options'
    ``PYHPCTK_PYRUN_DRAIN_S``) says (benchmarks; a value that is not a number from 0.01 to 2
    is ignored)."""
    try:
        period = float(setting)
    except ValueError:
        return DRAIN_PERIOD_S
    return period if 0.01 <= period <= 2.0 else DRAIN_PERIOD_S


def load_engine(sampler: str = "") -> tuple[ModuleType | None, str]:
    """The engine's module, or None and why it cannot be used here; ``sampler``: the setting
    (``PYHPCTK_PYRUN_SAMPLER``)."""
    if sampler == "thread":
        return None, ""  # asked for: nothing to explain
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return (
            None,
            "this is a free-threaded interpreter, which the sampling engine does not support",
        )
    if sys.platform != "linux" or not (3, 11) <= sys.version_info[:2] <= (3, 13):
        version = sys.version.split()[0]
        return None, f"the sampling engine supports CPython 3.11 to 3.13 on Linux, not {version}"
    try:
        from pyhpctk.measure import _engine  # type: ignore[attr-defined]
    except ImportError as error:
        return None, not_loaded_reason(error, _measure_directory())
    return _engine, ""


def _measure_directory() -> str:
    """Where the extension and its C sources are: measure/, the package above this one
    (setup.py builds ``pyhpctk.measure._engine``)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def not_loaded_reason(error: ImportError, directory: str) -> str:
    """Why the engine's extension in ``directory`` did not import: built for other CPython
    versions only (pyrun of a 3.11 installation measuring ``python3.12 app.py``), not built at
    all (no compiler or headers at install), or refused by the loader (its message)."""
    import importlib.machinery
    import re

    try:
        built = sorted(n for n in os.listdir(directory) if re.match(r"_engine\..*\.so$", n))
    except OSError:
        built = []
    if any(name[len("_engine") :] in importlib.machinery.EXTENSION_SUFFIXES for name in built):
        return f"the sampling engine did not load: {error}"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not built:
        return (
            "the sampling engine is not built (no C compiler or Python headers when pyhpctk was"
            " installed: pip install -v shows why)"
        )
    tags = [re.match(r"_engine\.cpython-(\d)(\d+)", name) for name in built]
    versions = sorted({f"{m.group(1)}.{m.group(2)}" for m in tags if m}, key=_version_order)
    told = " and ".join(versions) if versions else "another interpreter"
    return (
        f"the sampling engine is built for CPython {told} only ({', '.join(built)}), not for this"
        f" CPython {version} ({sys.executable}): install pyhpctk for it"
        f" ({os.path.basename(sys.executable)} -m pip install pyhpctk, or -e . in a checkout)"
    )


def _version_order(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def fell_back_line(stats: dict[str, int]) -> str:
    """What pyrun gave up near the open-file limit (issue #32, item 4): the threads whose CPU
    time a POSIX timer sampled instead of a perf counter, which would have held a descriptor."""
    threads = stats["perf_refused"]
    limit = stats["file_limit"]
    return (
        f"pyrun: perf counters for {threads} thread{'s' if threads != 1 else ''} fell back to"
        f" timers: near the open-file limit ({limit}); pyrun holds at most"
        f" {stats['perf_max']} counters (1/16 of it) and takes none in its last eighth, so the"
        " program keeps its descriptors (a timer samples CPU time at the kernel's tick)"
    )


def build_problem() -> str:
    """Why the engine is not usable here although it should be ('' when it is, or when this
    interpreter is one the engine does not support). In a checkout (``setup.py`` beside
    ``src/``: ``make env``, ``pip install -e .``), a source newer than the built extension means
    a rebuild failed: ``pip install`` builds it as optional and keeps going. An installed copy
    is not compared: pip writes the sources after the extension, and nothing rebuilds there."""
    module, reason = load_engine()
    if module is None:
        supported = "free-threaded" not in reason and "supports" not in reason
        return reason if supported and reason else ""
    built = os.path.getmtime(module.__file__ or "")
    measure = _measure_directory()
    sources = os.path.join(measure, "engine_c")
    checkout = os.path.isfile(os.path.join(measure, os.pardir, os.pardir, os.pardir, "setup.py"))
    if checkout and os.path.isdir(sources):
        for name in os.listdir(sources):
            if os.path.getmtime(os.path.join(sources, name)) > built:
                return f"the sampling engine is older than {name}: its rebuild failed"
    return ""


def say_fallback_once(reason: str, said: bool) -> None:
    """Explain the fallback once per pyrun run, unless ``said`` (the setting a process that
    said it leaves to its children)."""
    if reason and not said:
        os.environ[ENV_FALLBACK_SAID] = "1"
        sys.stderr.write(
            f"pyrun: {reason}; sampling with a Python thread instead: self time is then"
            " attributed at GIL switch points, and threads that never run Python are not"
            " measured (docs/pyrun.md)\n"
        )


def unsampled_cpu_line(stats: dict[str, int]) -> str:
    """The line that tells the process's CPU time no profile holds ('' when it is small).

    ``stats`` are the engine's: its figures (``cpu_*_ns``, engine_c/account.c) are there once a
    window that sampled CPU time closed. With wall-clock events only there is no CPU profile to
    miss it, and an unseen thread's wall-clock time is not known (the kernel sums no such
    clock): nothing is said then.
    """
    process = stats.get("cpu_process_ns", 0) * 1e-9
    unsampled = stats.get("cpu_unsampled_ns", 0) * 1e-9
    if process <= 0 or unsampled < UNSAMPLED_MIN_S or unsampled < UNSAMPLED_MIN_SHARE * process:
        return ""
    return (
        f"pyrun: {unsampled:.2f} s of the {process:.2f} s of CPU time this process used while"
        f" measured ({100 * unsampled / process:.0f} %) is in no profile: it ran in threads"
        " that ended before pyrun's monitor found them (it looks every 20 to 100 ms) or after"
        " a thread's last sample. Threads that live longer (a pool that keeps its threads) are"
        " measured, and a higher sampling rate shortens the time after a last sample"
        ' (docs/pyrun.md, "Every thread of the process")'
    )


class EngineSampler:
    """The session's use of the engine (see the module docstring)."""

    def __init__(self, table: ThreadTable, module: ModuleType) -> None:
        self.table = table
        self.module = module
        cpu: list[int] = []
        wall: list[int] = []
        # rules[timer][gil]: the (metric, field) pairs a sample of that timer and state adds to
        rules: list[list[list[tuple[int, int]]]] = [[[] for _ in range(4)] for _ in range(3)]
        for metric, spec in enumerate(table.options.events):
            event = spec.event
            if event.clock == CLOCK_THREAD_CPU:
                cpu.append(spec.period_us)
                for gil in range(4):
                    rules[TIMER_CPU][gil].append((metric, FIELD_CPU))
                    rules[TIMER_END][gil].append((metric, FIELD_CPU))
            elif event.clock == CLOCK_WALL:
                wall.append(spec.period_us)
                states = (GIL_WAITING,) if event.reads == READ_GIL_WAIT else range(4)
                for gil in states:
                    rules[TIMER_WALL][gil].append((metric, FIELD_WALL))
                if event.reads != READ_GIL_WAIT:
                    for gil in range(4):
                        rules[TIMER_END][gil].append((metric, FIELD_WALL))
        self.cpu_period_ns = min(cpu) * 1000 if cpu else 0
        self.wall_period_ns = min(wall) * 1000 if wall else 0
        self.rules = tuple(tuple(tuple(by_gil) for by_gil in by_timer) for by_timer in rules)
        self.started = False
        self.started_process_cpu = 0.0  # the process's CPU time when sampling began (tests)
        self.drain_cpu_s = 0.0  # CPU time spent draining (reported with PYHPCTK_PYRUN_DEBUG)
        self.entries = 0
        # pyrun --async-aware: the chains of asyncio tasks, and each thread's last raw path
        self.tasks: TaskChains | None = None
        if table.options.async_aware:
            from pyhpctk.measure.sampling import tasks

            self.tasks = tasks.TaskChains(table)
        self._raw_paths: dict[int, list[int]] = {}
        self._range_paths: dict[int, list[int]] = {}  # pyrun --ranges: each thread's last path

    def start(self) -> None:
        options = self.table.options
        perf = cpu_timer_route(options.settings.cpu_timer)
        # Threads are measured from here on (their CPU clocks read now are their baselines).
        self.started_process_cpu = time.process_time()
        self.module.start(
            self.cpu_period_ns,
            self.wall_period_ns,
            options.trace or self.table.ranges is not None,  # ranges: each sample's time
            perf,
            options.native,
            self.tasks is not None,
        )
        self.started = True
        listen(self.module.gc_callback)  # a sample inside a collection: <gc> (gc_context)

    def sigtrap_taken(self) -> bool:
        """Whether the engine's handler is on SIGTRAP (it passes the program's SIGTRAPs on)."""
        return bool(self.module.sigtrap_taken())

    def take_sigtrap(self, default: bool = False) -> None:
        """The engine's SIGTRAP handler first again, after the program set a disposition of its
        own, to which it passes every SIGTRAP that is not a sample (``default``: SIGTRAP's
        default action, whatever the kernel holds now)."""
        self.module.take_sigtrap(default)

    def register_current_thread(self, program_ns: int = -1) -> None:
        """Measure the calling thread; ``program_ns``: see ThreadTable.register_thread."""
        if self.started:
            self.module.register_thread(program_ns)

    def exclude_current_thread(self) -> None:
        self.module.exclude_thread(threading.get_native_id())

    def exclude(self, native_id: int) -> None:
        self.module.exclude_thread(native_id)

    def thread_end(self) -> None:
        if self.started:
            self.module.thread_end()

    def stop(self) -> None:
        if self.started:
            self.started = False
            stop_listening(self.module.gc_callback)
            self.module.stop()

    def restart_paths(self) -> None:
        """Each thread's next drained entry names its whole path (the session moved the node
        paths start from: a mark)."""
        self.module.restart_paths()

    def own_cpu(self, ns: int) -> None:
        """The calling program thread spent ``ns`` of CPU time on pyrun's work after its
        :meth:`thread_end` (its files): pyrun's time, not the program's lost time."""
        self.module.own_cpu(ns)

    def own_thread_end(self) -> None:
        """The calling thread, one of pyrun's own (excluded), ends: its CPU time is pyrun's."""
        self.module.own_thread_end()

    def after_fork_in_child(self) -> None:
        self.started = False
        self.module.after_fork_child()

    # -- the sampling thread's wake-ups (the Sampler interface) --------------------------------

    def thread_began(self) -> None:
        self.exclude_current_thread()

    def first_wait(self) -> float:
        return drain_period(self.table.options.settings.drain_s)

    def wake(self) -> None:
        with self.table.lock:
            if not self.table.finished:
                self.drain()

    def next_wait(self) -> float:
        return drain_period(self.table.options.settings.drain_s)

    def thread_ended(self) -> None:
        self.own_thread_end()  # pyrun's CPU time, not the program's lost time

    def stats(self) -> dict[str, int]:
        return dict(self.module.stats())

    def report(self) -> None:
        """Say what went wrong while sampling (always), and the counts (PYHPCTK_PYRUN_DEBUG)."""
        stats = self.stats()
        if stats["dropped"]:
            sys.stderr.write(
                f"pyrun: {stats['dropped']} samples did not fit their thread's buffer; their"
                " time went to the next sample\n"
            )
        unsampled = unsampled_cpu_line(stats)
        if unsampled:
            sys.stderr.write(unsampled + "\n")
        if stats.get("perf_refused"):
            sys.stderr.write(fell_back_line(stats) + "\n")
        if self.table.options.settings.debug:
            stats["drain_entries"] = self.entries
            stats["drain_cpu_us"] = round(self.drain_cpu_s * 1e6)
            counts = ", ".join(f"{name} {value}" for name, value in sorted(stats.items()))
            sys.stderr.write(f"pyrun: sampling engine in pid {os.getpid()}: {counts}\n")

    # -- drain -----------------------------------------------------------------------------

    def drain(self, retire: bool = True) -> None:
        """Move every thread's records into its CCT (call with the session lock held).

        A thread that ended is written and forgotten, unless ``retire`` is false (the engine
        stopped for an ``exec``, and the threads go on if it fails).
        """
        table = self.table
        functions = table.functions
        started = time.thread_time()
        batches = self.module.drain(
            functions.register,
            functions.named(UNKNOWN_CODE),
            functions.named(TRUNCATED),
            table.add_native_module,
            functions.named(GC_FUNCTION),
        )
        table.identify_native_modules()
        tracing = table.options.trace
        lm = table.python_lm
        kind = table.sampling_kind
        rules = self.rules
        seen: set[int] = set()
        tasks = self.tasks
        if tasks is not None:
            tasks.refresh()
        ranges = table.ranges
        for ident, tid, _python, ended, entries in batches:
            key = ident or -tid
            state = self._state_of(key, tid)
            seen.add(key)
            self.entries += len(entries)
            if ranges is not None and ident:
                full = self._range_paths.setdefault(key, [])
                entries = ranges.engine_entries(ident, entries, full)
                if ended:
                    del self._range_paths[key]
            if tasks is not None:
                entries = self._under_tasks(tasks, key, entries, ended)
            trace = (state.trace_times, state.trace_nodes) if tracing else None
            if state.cct.insert_samples(
                entries, lm, kind, rules, state.path_nodes, trace, TIMER_END
            ):
                state.idle = False
            if ended and retire:
                table.retire(key)
        if tracing:
            self._mark_idle(seen)
        self.drain_cpu_s += time.thread_time() - started

    def _under_tasks(
        self, tasks: TaskChains, key: int, entries: list[Entry], ended: bool
    ) -> list[Entry]:
        """``entries`` with each path put under its chain of asyncio tasks, each a whole path
        (``common`` 0): the chain replaces a varying number of the loop's frames."""
        path = self._raw_paths.pop(key, []) if ended else self._raw_paths.setdefault(key, [])
        rewritten = []
        for common, ips, timer, gil, cpu, wall, when in entries:
            del path[common:]
            path.extend(ips)
            rewritten.append((0, tuple(tasks.engine_path(path)), timer, gil, cpu, wall, when))
        return rewritten

    def _state_of(self, key: int, tid: int) -> ThreadState:
        """The session's state of a sampled thread, made on first sight (numbered then)."""
        table = self.table
        state = table.states.get(key)
        if state is not None and state.native_id not in (None, tid):
            table.retire(key)  # the ident was reused: the thread we knew has ended
            state = None
        if state is None:
            thread = threading._active.get(key)  # type: ignore[attr-defined]
            state = table.register_thread(
                thread, main=thread is threading.main_thread(), ident=key, native_id=tid
            )
        state.native_id = tid
        if state.thread is None and not state.comm:  # a thread Python never started: its
            state.comm = comm_name(tid)  # kernel name, read while it surely lives
        return state

    def _mark_idle(self, seen: set[int]) -> None:
        """A thread that took no sample since the previous drain is idle: one NoActvty record."""
        now_ns = self.table.clocks.epoch_ns()
        for key, state in self.table.states.items():
            if key not in seen:
                state.go_idle(now_ns)


if __name__ == "__main__":  # make env / make test-engine: python -m pyhpctk.measure.sampling.engine
    problem = build_problem()
    if problem:
        sys.exit(f"{problem} (pip install -v -e . shows the compiler's messages)")

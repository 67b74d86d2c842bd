"""One process's measurement: the sampler thread, per-thread CCTs, and writing the files.

Samples come from the sampling engine (:mod:`pyhpctk.measure.engine`: a signal handler on each
thread, per-thread timers, every thread of the process) whenever it is available; the session's
sampler thread is then the engine's *drain*, which moves the samples into the threads' CCTs.
Otherwise (the fallback) the sampler thread samples itself: it wakes every period, reads
``sys._current_frames()`` and each thread's own CPU clock, and attributes each thread's CPU-time
delta (``CPUTIME``) or wall-time delta (``REALTIME``) since the previous sample to that thread's
current Python stack; only threads that used CPU since the last sample are unwound under
``CPUTIME``, which keeps the per-sample work proportional to the busy threads. Both live in
:mod:`pyhpctk.measure.sampler` (:class:`~pyhpctk.measure.sampler.SamplerThread`, a part of
:class:`Session`); what the session keeps per thread is in :mod:`pyhpctk.measure.thread_state`.

Files are written per thread when the thread ends, for every thread at exit, and periodically as
checkpoints (atomically: write a temporary file, then rename; :mod:`pyhpctk.measure.profile_files`),
so a hard crash still leaves the last checkpoint. :mod:`pyhpctk.measure.hooks` connects a session
to the process (exit, signals, fork, ``os._exit``, thread start and end).

Extension points for other monitors (a GPU layer), declared as the protocol
:class:`pyhpctk.measure.extension.Host`: :meth:`Session.add_metric_kind`,
:meth:`Session.add_load_module`, :meth:`Session.current_context` (this thread's CCT and the node
of its current call path, to hang placeholders under), :meth:`Session.open_stream` (a
CCT written as its own "thread", e.g. a GPU stream numbered from 500), :meth:`Session.live_thread`
and :meth:`Session.stream_identity`. Take :attr:`Session.lock` while changing a CCT from outside
the sampler. The extension itself is held as an
:class:`~pyhpctk.measure.extension.Extension` in :attr:`Session.gpu`; the session never imports
it.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time

from pyhpctk.formats.hpcrun_constants import LM_FLAG_ANALYZE  # formats.md §1.4
from pyhpctk.measure import engine, losses, naming
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
)
from pyhpctk.measure.events import CLOCK_THREAD_CPU, CLOCK_WALL, READ_DELTA
from pyhpctk.measure.profile_files import (
    atomic_write,
    give_up_reserve,
    hold_reserve,
    reserve_stem,
    unlink_quietly,
)
from pyhpctk.measure.sampler import SamplerThread
from pyhpctk.measure.source_files import SourceRecorder
from pyhpctk.measure.thread_names import ThreadNames, thread_name
from pyhpctk.measure.thread_state import Clocks, ThreadState, thread_cpu_clock

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from types import FrameType

    from pyhpctk.measure.config import MeasureOptions
    from pyhpctk.measure.extension import Extension

    # A thread's encoded files: base stem, profile, trace, logical file, its name (None: a
    # stream, not a thread).
    _Encoded = tuple[str, bytes, bytes | None, bytes, str | None]

__all__ = ["SAMPLER_KIND", "Clocks", "Session", "ThreadState", "thread_cpu_clock"]

_FINISH_WAIT_S = 10.0  # how long a second finish() waits for the first to write the files
SAMPLER_KIND = "sampling"
# The interpreter's own functions: hooks.py wraps the sys attributes for the program.
_get_switch_interval = sys.getswitchinterval
_MEASURE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class Session(SamplerThread):
    """Measurement of one process (see the module docstring)."""

    def __init__(self, options: MeasureOptions, clocks: Clocks | None = None) -> None:
        self.options = options
        self.clocks = clocks or Clocks()
        self.lock = threading.RLock()
        self._events = options.events
        # The Python sampler thread (the fallback) reads the registry's deltas of both clocks.
        self._cpu_metric = next(
            (
                i
                for i, spec in enumerate(self._events)
                if spec.event.clock == CLOCK_THREAD_CPU and spec.event.reads == READ_DELTA
            ),
            -1,
        )
        self._real_metric = next(
            (
                i
                for i, spec in enumerate(self._events)
                if spec.event.clock == CLOCK_WALL and spec.event.reads == READ_DELTA
            ),
            -1,
        )
        self.sampling_kind = MetricKind(
            SAMPLER_KIND, tuple(MetricSpec(event.metric_name) for event in self._events)
        )
        # The GIL switch interval the program asked for (sys.getswitchinterval reports it), and
        # the shorter one pyrun uses while the program has one Python thread (see
        # _tune_switch_interval).
        self.program_switch_interval = _get_switch_interval()
        self._fast_interval = max(50e-6, options.period_s / 8)
        self._fast_switch = False
        # The GPU layer (pyhpctk.measure.gpu), when -e gpu=... asked for one.
        self.gpu: Extension | None = None
        # The native sampling engine, or None: the Python sampler thread (measure/engine.py),
        # which is also what a test that injects clocks drives.
        module, reason = engine.load_engine() if clocks is None else (None, "")
        self.engine = engine.EngineSampler(self, module) if module is not None else None
        if module is None:
            engine.say_fallback_once(reason)
            for spec in self._events:
                if spec.event.needs_engine:
                    sys.stderr.write(
                        f"pyrun: {spec.name} needs the sampling engine; it is not measured\n"
                    )
        self._reset_process_state()
        hold_reserve(options.output_dir)  # a descriptor for writing near the open-file limit

    # -- process state (everything a forked child starts afresh) ----------------------------

    def _reset_process_state(self) -> None:
        self.pid = os.getpid()
        # Serialises file writes (checkpoints, thread ends, exit) so a thread's name is claimed
        # once; never held while sampling.
        self._write_lock = threading.Lock()
        # Held while finish() writes: a second caller (a fatal signal in the main thread while
        # another thread ends the process with os._exit) waits for the files before it returns.
        self._finish_lock = threading.RLock()
        self.ids = NodeIdAllocator()
        self.functions = FunctionTable(skip_prefixes=(_MEASURE_DIR,))
        self.kinds: list[MetricKind] = []
        self.sampling_kind.base = -1
        self.add_metric_kind(self.sampling_kind)
        tag = f"{int.from_bytes(os.urandom(4), 'big'):08x}"
        self.logical_path = os.path.join("logical", f"python.{tag}")
        self.thread_names = ThreadNames(tag, self.pid)
        self.loaded_sources = SourceRecorder(tag, self.pid)
        self.load_modules: list[tuple[int, str, int]] = [(1, self.logical_path, LM_FLAG_ANALYZE)]
        self.python_lm = 1
        self.states: dict[int, ThreadState] = {}
        # Threads that wrote their profile but are still winding down: ident -> Thread.
        self._finished: dict[int, threading.Thread | None] = {}
        self.streams: list[ThreadState] = []
        self._main_numbered = False
        self._last_thread = 0
        self._sampler_ident: int | None = None
        # Threads that are the toolchain's own (GPU monitor, tracing, CUPTI buffer threads):
        # never measured as application threads (issue #6, item 2).
        self._excluded: set[int] = set()
        # Threads alive when measuring began: any other the Python sampler finds was born since.
        self._before_sampler: set[int] = set(sys._current_frames())
        self._stop_lock: _thread.LockType | None = None
        self._stopped_lock: _thread.LockType | None = None
        self.finished = False
        self.samples = 0
        self._mpi_rank: int | None = None
        self._host_id: int | None = None
        # Checkpoints back off from early ones (SamplerThread._checkpoint_if_due).
        self._measuring_since = self._last_checkpoint = time.monotonic()
        self._measuring_since_cpu = self._last_checkpoint_cpu = time.process_time()
        self._checkpoint_cost = 0.0
        self.write_errors: list[str] = []
        self._lost: set[str] = set()  # profiles whose last write failed (told to pyrun)

    def after_fork_in_child(self) -> None:
        """Start afresh in a forked child: new pid, fresh CCTs and files, a new sampler."""
        self.gpu = None  # the GPU runtime's threads and CUPTI do not survive a fork
        if self.engine is not None:
            self.engine.after_fork_in_child()  # no timer and no other thread survived
        self.lock = threading.RLock()
        self._reset_process_state()
        self._fast_switch = True
        self._tune_switch_interval(2)
        self.register_thread(threading.current_thread(), main=True)
        self.start_sampler()

    # -- extension points ---------------------------------------------------------------------

    def add_metric_kind(self, kind: MetricKind) -> MetricKind:
        """Give ``kind`` its place in the metric table of every profile written from now on."""
        with self.lock:
            if kind.base < 0:
                kind.base = sum(k.width for k in self.kinds)
                self.kinds.append(kind)
        return kind

    def add_load_module(self, path: str, flags: int = LM_FLAG_ANALYZE) -> int:
        """The load-map id of ``path`` (formats.md §1.4), adding it on first use."""
        with self.lock:
            for lm_id, known, _ in self.load_modules:
                if known == path:
                    return lm_id
            lm_id = len(self.load_modules) + 1
            self.load_modules.append((lm_id, path, flags))
            return lm_id

    def current_context(self, skip: int = 1) -> tuple[ThreadCCT, int]:
        """This thread's CCT and the node of its current Python call path.

        ``skip`` frames of the caller are left out (1: the caller of this method is not part of
        the context). A GPU layer inserts its placeholders under the returned node.
        """
        frame: FrameType | None = sys._getframe(1 + skip)
        with self.lock:
            state = self.states.get(threading.get_ident())
            if state is None:
                state = self.register_thread(threading.current_thread())
            ips = python_frame_ips(frame, self.functions, self.functions.fid_of)
            return state.cct, state.cct.path(self.python_lm, ips)

    def open_stream(self, number: int) -> ThreadCCT:
        """A CCT written as its own profile with thread id ``number`` (GPU streams: 500...)."""
        with self.lock:
            state = ThreadState(
                number=number,
                ident=-1,
                thread=None,
                cct=ThreadCCT(self.ids, main=False, with_no_activity=self.options.trace),
                clock_id=None,
                last_cpu=0.0,
                last_wall=0.0,
                is_stream=True,
            )
            self.streams.append(state)
            return state.cct

    def live_thread(self, ident: int) -> tuple[ThreadCCT, threading.Thread | None] | None:
        """The CCT measured now for thread ``ident``, and its thread object (None: none)."""
        state = self.states.get(ident)
        return None if state is None else (state.cct, state.thread)

    def stream_identity(self, number: int) -> ProfileIdentity:
        """The identity of a profile written as thread ``number`` (a GPU stream)."""
        return self._identity_of(number)

    # -- threads --------------------------------------------------------------------------------

    def exclude_thread(self, ident: int) -> None:
        """Never measure thread ``ident`` (one of the toolchain's own threads); forget its CCT."""
        if self.engine is not None:
            if ident == threading.get_ident():
                self.engine.exclude_current_thread()
            else:
                thread = threading._active.get(ident)  # type: ignore[attr-defined]
                if thread is not None and thread.native_id is not None:
                    self.engine.exclude(thread.native_id)
        with self.lock:
            self._excluded.add(ident)
            self.states.pop(ident, None)

    def register_thread(
        self,
        thread: threading.Thread | None,
        main: bool = False,
        ident: int | None = None,
        native_id: int | None = None,
        program_ns: int = -1,
        from_birth: bool = False,
    ) -> ThreadState:
        """Start measuring a thread (normally called from that thread itself).

        ``native_id``: the kernel thread id, where the caller knows it (the engine does).
        ``program_ns``: the calling thread's CPU clock when pyrun's thread hook began (the
        thread's start in the interpreter, the program's time): the first record of the
        thread (the engine's, or the Python sampler's first sample) carries it, and what
        registering costs since is pyrun's own time. ``from_birth``: the thread was born while
        measured (the Python sampler found it before its hook ran), so all its CPU time is the
        program's and its first sample carries what it used so far.
        """
        own = ident is None
        if ident is None:
            ident = threading.get_ident()
        clock_id: int | None = None
        native = getattr(thread, "native_id", None) if thread is not None else native_id
        if own:
            native = threading.get_native_id()
        if native is not None:
            clock_id = thread_cpu_clock(native)
        elif ident is not None and self.engine is None:
            try:
                clock_id = time.pthread_getcpuclockid(ident)
            except OSError:
                clock_id = None
        if own and not main:
            self._tune_switch_interval(2)  # a second Python thread: the program's interval
        with self.lock:
            if own:
                self._finished.pop(ident, None)
                self._excluded.discard(ident)  # a new thread that reuses an excluded ident
            previous = self.states.pop(ident, None)
            if previous is not None:
                if previous.thread is None or previous.thread is thread:
                    # The sampler saw this thread a moment before it registered itself.
                    previous.thread = thread
                    if clock_id is not None and previous.clock_id is None:
                        previous.clock_id = clock_id
                        previous.last_cpu = self._read_cpu(clock_id)
                    self.states[ident] = previous
                    return previous
                self._retire(previous, final_delta=False)
            # Thread 0 is the main thread (hpcrun's "| Main" fence); the others are numbered
            # 1, 2, ... in the order pyrun first sees them.
            if main and not self._main_numbered:
                number = 0
                self._main_numbered = True
            else:
                self._last_thread += 1
                number = self._last_thread
            last_cpu = 0.0 if from_birth else self._read_cpu(clock_id)
            if own and self.engine is None and program_ns >= 0 and clock_id is not None:
                # the Python sampler's first sample of the thread carries its start too
                last_cpu = max(last_cpu - program_ns * 1e-9, 0.0)
            state = ThreadState(
                number=number,
                ident=ident,
                thread=thread,
                cct=ThreadCCT(self.ids, main=number == 0, with_no_activity=self.options.trace),
                clock_id=clock_id,
                last_cpu=last_cpu,
                last_wall=self.clocks.wall(),
            )
            self.states[ident] = state
        if own and self.engine is not None:
            self.engine.register_current_thread(program_ns)
        return state

    def thread_finished(self) -> None:
        """The calling thread is about to end: attribute its last moments and write its files."""
        ident = threading.get_ident()
        if self.gpu is not None:
            self.gpu.thread_ending()  # attribute this thread's GPU activities before writing
        if self.engine is not None:
            # The engine records the thread's last moments; the drain writes its files.
            self.engine.thread_end()
            began = time.thread_time_ns()  # from here on the thread works for pyrun
            try:
                with self.lock:
                    if self.finished:
                        return
                    self.engine.drain()
                    state = self.states.pop(ident, None)
                    if state is None:
                        return
                    data = self._encode(state)
                self._write_thread(state, data)
            finally:
                self.engine.own_cpu(time.thread_time_ns() - began)
            return
        with self.lock:
            state = self.states.pop(ident, None)
            if state is None or self.finished:
                return
            self._finished[ident] = state.thread
            self._final_delta(state)
            data = self._encode(state)
        self._write_thread(state, data)

    def _read_cpu(self, clock_id: int | None) -> float:
        if clock_id is None:
            return 0.0
        try:
            return self.clocks.thread_cpu(clock_id)
        except OSError:
            return 0.0

    def _final_delta(self, state: ThreadState) -> None:
        """Attribute what a thread used since its last sample to the last place it was seen."""
        cct = state.cct
        values = cct.values_of(self.sampling_kind)
        if self._cpu_metric >= 0 and state.clock_id is not None:
            try:
                cpu = self.clocks.thread_cpu(state.clock_id)
            except OSError:
                cpu = state.last_cpu
            if cpu > state.last_cpu:
                values.add(cct.last_leaf, self._cpu_metric, cpu - state.last_cpu)
            state.last_cpu = cpu
        if self._real_metric >= 0:
            now = self.clocks.wall()
            if now > state.last_wall:
                values.add(cct.last_leaf, self._real_metric, now - state.last_wall)
            state.last_wall = now

    def _retire(self, state: ThreadState, final_delta: bool) -> None:
        """A thread gone without :meth:`thread_finished` (a C thread, a reused ident)."""
        if final_delta:
            self._final_delta(state)
        data = self._encode(state)
        self._write_thread(state, data)

    # -- writing ---------------------------------------------------------------------------------

    def identity(self, state: ThreadState) -> ProfileIdentity:
        return self._identity_of(state.number)

    def _identity_of(self, number: int) -> ProfileIdentity:
        env = os.environ
        rank = naming.rank_from_mpi4py()
        if rank is None:
            rank = naming.rank_from_env(env)
        if rank is not None:
            self._mpi_rank = rank
        if self._host_id is None:
            self._host_id = naming.host_id()
        return ProfileIdentity(
            program_name=os.path.basename(sys.executable) or "python",
            program_path=sys.executable,
            env_path=env.get("PATH", ""),
            job_id=naming.job_id_from_env(env),
            mpi_rank=self._mpi_rank,
            thread=number,
            host_id=self._host_id,
            pid=self.pid,
        )

    def _encode(self, state: ThreadState) -> _Encoded:
        """Encode a thread's files (call with the lock held); returns (base stem, ...)."""
        identity = self.identity(state)
        times = state.trace_times
        span = (min(times), max(times)) if times else (0, 0)
        try:
            profile = encode_profile(state.cct, identity, self.load_modules, self.kinds, span)
        except ValueError as error:  # a count the file cannot hold: write the rest, say so
            sys.stderr.write(
                f"pyrun: thread {state.number}: {error}; it is written as the nearest value the"
                " file holds (an accounting error in pyrun: please report it)\n"
            )
            profile = encode_profile(
                state.cct, identity, self.load_modules, self.kinds, span, clamp_counts=True
            )
        trace = (
            encode_trace(state.cct, state.trace_times, state.trace_nodes)
            if self.options.trace
            else None
        )
        logical = encode_logical(list(self.functions.stanzas))
        base = naming.file_stem(
            identity.program_name,
            identity.mpi_rank or 0,
            identity.thread,
            identity.host_id,
            identity.pid,
            0,
        )
        name = None if state.is_stream else thread_name(state)
        return base, profile, trace, logical, name

    def _write_thread(self, state: ThreadState, data: _Encoded) -> None:
        with self._write_lock:
            self._write_files(state, data)

    def _write_files(self, state: ThreadState, data: _Encoded) -> None:
        base, profile, trace, logical, called = data
        old = state.stem
        directory = self.options.output_dir
        # The logical file goes first: a profile is never written without the functions it
        # names. A failure leaves the previous complete files (or none), never a partial one.
        try:
            atomic_write(os.path.join(directory, self.logical_path), logical)
            if not state.stem or not state.stem.startswith(base[: base.rfind("-")]):
                state.stem = reserve_stem(directory, base, profile)
                if old:
                    for suffix in (".hpcrun", ".hpctrace"):
                        unlink_quietly(os.path.join(directory, old + suffix))
            else:
                atomic_write(os.path.join(directory, state.stem + ".hpcrun"), profile)
            if trace is not None:
                atomic_write(os.path.join(directory, state.stem + ".hpctrace"), trace)
        except OSError as error:
            name = (state.stem or base) + ".hpcrun"
            self._lost.add(name)
            losses.tell_pyrun(losses.LOST, name, error.strerror or str(error))
            self.tell_once(f"pyrun: cannot write measurement files to {directory}: {error}")
            return
        if self._lost:
            name = state.stem + ".hpcrun"
            for lost in (name, base + ".hpcrun"):  # a checkpoint that failed, written now
                if lost in self._lost:
                    self._lost.discard(lost)
                    losses.tell_pyrun(losses.WRITTEN, lost)
        if called is not None:
            names = self.thread_names
            self._write_side_file(names, names.record(state.stem, called, old), "thread names")
        table = self.loaded_sources.record(self.functions.stanzas)
        self._write_side_file(self.loaded_sources, table, "sources")

    def _write_side_file(
        self, side: ThreadNames | SourceRecorder, data: bytes | None, what: str
    ) -> None:
        """Rewrite ``threads/`` or ``sources/`` with ``data`` (None: unchanged)."""
        if data is None:
            return
        directory = self.options.output_dir
        try:
            atomic_write(os.path.join(directory, side.path), data)
        except OSError as error:  # the profiles are written: only this side file is missing
            self.tell_once(f"pyrun: cannot write the {what} to {directory}: {error}")
            return
        side.written(data)

    def tell_once(self, message: str) -> None:
        """Say ``message`` (a line of pyrun's) on stderr, once per process: what went wrong in
        pyrun's own work is a line, never a traceback in the program's stderr."""
        if message not in self.write_errors:
            self.write_errors.append(message)
            try:  # noqa: SIM105  # contextlib is one more import in every measured process
                sys.stderr.write(message + "\n")
            except Exception:  # a closed or broken stderr: the program's business
                pass

    def checkpoint(self) -> None:
        """Write every live thread's files now (atomic replace), keeping measurement going."""
        with self.lock:
            if self.finished:
                return
            if self.engine is not None:
                self.engine.drain()
            encoded = [(state, self._encode(state)) for state in self._all_states()]
        for state, data in encoded:
            self._write_thread(state, data)

    def before_exec(self) -> None:
        """The process is about to ``exec``: stop sampling (a signal pending at the exec would
        kill the new program) and take in what was sampled; the caller then writes every
        thread's files (hooks: a checkpoint that a fatal signal cannot cut short)."""
        if self.engine is not None and self.engine.started:
            self.engine.stop()
            with self.lock:
                if not self.finished:
                    self.engine.drain(retire=False)

    def after_failed_exec(self) -> None:
        """The ``exec`` failed: the program goes on, so does its measurement."""
        if self.engine is not None and not self.engine.started and not self.finished:
            try:
                self.engine.start()
            except OSError as error:
                sys.stderr.write(f"pyrun: cannot restart the sampling engine: {error}\n")

    def _all_states(self) -> list[ThreadState]:
        return list(self.states.values()) + self.streams

    def finish(self) -> None:
        """Stop measuring and write every thread's files (exit, a fatal signal, ``os._exit``).

        Returns once the files are written, also when another thread is writing them.
        """
        if self.pid != os.getpid():
            return
        if not self._finish_lock.acquire(True, _FINISH_WAIT_S):
            return  # the other writer is stuck: the caller goes on (and the process ends)
        try:
            if not self.finished:
                self._finish()
        finally:
            self._finish_lock.release()

    def _finish(self) -> None:
        monitor, self.gpu = self.gpu, None
        if monitor is not None:
            try:
                monitor.finish()  # flush, attribute every activity, write the stream files
            except Exception as error:  # the threads' profiles are still written below
                sys.stderr.write(
                    f"pyrun: gpu: finishing the GPU measurement failed ({error!r}); the threads'"
                    " profiles are written without what was left\n"
                )
        self.stop_sampler()
        if self.engine is not None:
            self.engine.stop()  # every thread's last moments are recorded
            with self.lock:
                if not self.finished:
                    self.engine.drain()  # writes each sampled thread's files
            self.engine.report()
        with self.lock:
            if self.finished:
                return
            states = self._all_states()
            for state in states:
                if not state.is_stream and self.engine is None:
                    self._final_delta(state)
            encoded = [(state, self._encode(state)) for state in states]
            self.finished = True
        for state, data in encoded:
            self._write_thread(state, data)
        give_up_reserve()

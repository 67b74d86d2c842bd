"""One process's measurement: the sampler thread, per-thread CCTs, and writing the files.

Samples come from the sampling engine (:mod:`pyhpctk.measure.sampling.engine`: a signal handler
on each thread, per-thread timers, every thread of the process) whenever it is available; the
sampler thread is then the engine's *drain*, which moves the samples into the threads' CCTs.
Otherwise (the fallback) the sampler thread samples itself: it wakes every period, reads
``sys._current_frames()`` and each thread's own CPU clock, and attributes each thread's CPU-time
delta (``CPUTIME``) or wall-time delta (``REALTIME``) since the previous sample to that thread's
current Python stack; only threads that used CPU since the last sample are unwound under
``CPUTIME``, which keeps the per-sample work proportional to the busy threads. Both live in
:mod:`pyhpctk.measure.sampling` (:class:`~pyhpctk.measure.sampling.engine.EngineSampler`,
:class:`~pyhpctk.measure.sampling.python.PythonSampler`, driven by a
:class:`~pyhpctk.measure.sampling.thread.SamplingThread`); each holds this session as a
:class:`~pyhpctk.measure.session.table.ThreadTable`, which it implements, and reaches nothing
else of it. What the session keeps per thread is in :mod:`pyhpctk.measure.thread_state`; the
writing of the files in :mod:`.writing`.

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

import os
import sys
import threading
import time

from pyhpctk.formats.hpcrun_constants import (
    LM_FLAG_ANALYZE,  # formats.md §1.4
    LOGICAL_FID_SHIFT,  # formats.md §1.10
)
from pyhpctk.measure.cct import (
    FunctionTable,
    MetricKind,
    MetricSpec,
    NodeIdAllocator,
    ThreadCCT,
    python_frame_ips,
)
from pyhpctk.measure.profile_files import give_up_reserve, hold_reserve
from pyhpctk.measure.sampling import engine
from pyhpctk.measure.sampling.python import PythonSampler
from pyhpctk.measure.sampling.thread import SamplingThread
from pyhpctk.measure.session.windows import MARK_FORMAT, Windows
from pyhpctk.measure.session.writing import ProfileWriter
from pyhpctk.measure.thread_state import Clocks, ThreadState, thread_cpu_clock

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType

    from pyhpctk.measure.encode import ProfileIdentity
    from pyhpctk.measure.extension import Extension
    from pyhpctk.measure.launch.config import MeasureOptions
    from pyhpctk.measure.ranges import Ranges

__all__ = ["SAMPLER_KIND", "Clocks", "Session", "ThreadState", "thread_cpu_clock"]

_FINISH_WAIT_S = 10.0  # how long a second finish() waits for the first to write the files
SAMPLER_KIND = "sampling"
_MEASURE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Session:
    """Measurement of one process (see the module docstring); a
    :class:`~pyhpctk.measure.session.table.ThreadTable` to its samplers."""

    def __init__(self, options: MeasureOptions, clocks: Clocks | None = None) -> None:
        self.options = options
        self.clocks = clocks or Clocks()
        self.lock = threading.RLock()
        self.sampling_kind = MetricKind(
            SAMPLER_KIND, tuple(MetricSpec(event.metric_name) for event in options.events)
        )
        # The GPU layer (pyhpctk.measure.gpu), when -e gpu=... asked for one.
        self.gpu: Extension | None = None
        # The native sampling engine, or None: the Python sampler thread (sampling/engine.py),
        # which is also what a test that injects clocks drives.
        settings = options.settings
        module, reason = engine.load_engine(settings.sampler) if clocks is None else (None, "")
        self.engine = engine.EngineSampler(self, module) if module is not None else None
        # The Python sampler samples where the engine does not, and keeps the program's GIL
        # switch interval either way.
        self.python = PythonSampler(self, samples_itself=self.engine is None)
        # Paused or measuring, the current mark, the control socket (pyrun ctl).
        self.windows = Windows(self)
        if module is None:
            engine.say_fallback_once(reason, settings.fallback_said)
            for spec in options.events:
                if spec.event.needs_engine:
                    sys.stderr.write(
                        f"pyrun: {spec.name} needs the sampling engine; it is not measured\n"
                    )
        # The threads' open ranges (pyrun --ranges: measure/ranges.py), or None.
        self.ranges: Ranges | None = None
        self._reset_process_state()
        hold_reserve(options.output_dir)  # a descriptor for writing near the open-file limit

    # -- process state (everything a forked child starts afresh) ----------------------------

    def _reset_process_state(self) -> None:
        self.pid = os.getpid()
        # Held while finish() writes: a second caller (a fatal signal in the main thread while
        # another thread ends the process with os._exit) waits for the files before it returns.
        self._finish_lock = threading.RLock()
        self.ids = NodeIdAllocator()
        self.functions = FunctionTable(skip_prefixes=(_MEASURE_DIR,))
        if self.options.ranges:
            if self.ranges is None:
                from pyhpctk.measure.ranges import Ranges

                engine = self.engine is not None
                self.ranges = Ranges(self.functions, timed=engine, cpu_timed=not engine)
            else:
                self.ranges.reset(self.functions)
        self.kinds: list[MetricKind] = []
        self.sampling_kind.base = -1
        self.add_metric_kind(self.sampling_kind)
        self.load_modules: list[tuple[int, str, int]] = []
        self.writer = ProfileWriter(self.options, self.functions, self.load_modules, self.kinds)
        self.load_modules.append((1, self.writer.logical_path, LM_FLAG_ANALYZE))
        self.python_lm = 1
        self._states: dict[int, ThreadState] = {}
        # Threads that wrote their profile but are still winding down: ident -> Thread.
        self._finished: dict[int, threading.Thread | None] = {}
        self.streams: list[ThreadState] = []
        self._main_numbered = False
        self._last_thread = 0
        # Threads that are the toolchain's own (GPU monitor, tracing, CUPTI buffer threads):
        # never measured as application threads (issue #6, item 2).
        self._excluded: set[int] = set()
        self.python.reset()
        sampler = self.engine or self.python
        name = "pyrun-drain" if self.engine is not None else "pyrun-sampler"
        step = "drain" if self.engine is not None else "sample"
        control = self.windows if self.options.control else None
        self.sampling = SamplingThread(self, sampler, name, step, control)
        self.finished = False

    @property
    def states(self) -> Mapping[int, ThreadState]:
        """The threads measured now, by ident (ThreadTable)."""
        return self._states

    def after_fork_in_child(self) -> None:
        """Start afresh in a forked child: new pid, fresh CCTs and files, a new sampler."""
        self.gpu = None  # the GPU runtime's threads and CUPTI do not survive a fork
        self.windows.close()  # the parent's socket: the child opens its own
        if self.engine is not None:
            self.engine.after_fork_in_child()  # no timer and no other thread survived
        self.lock = threading.RLock()
        self._reset_process_state()
        self.python.forked()
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

    def add_native_module(self, path: str) -> int:
        """The load-map id of a native module first sampled (ThreadTable); its identity is
        recorded at :meth:`identify_native_modules` (docs/formats.md, "Loaded modules")."""
        lm_id = self.add_load_module(path)
        self.writer.native_modules.note(path)
        return lm_id

    def identify_native_modules(self) -> None:
        """Record which build each native module noted since the last call is."""
        with self.lock:
            self.writer.native_modules.identify()

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
            if self.ranges is not None:  # under the ranges open on this thread
                ips = self.ranges.under(ips)
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
        return self.writer.identity_of(number)

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
            self._states.pop(ident, None)

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
            self.python.tune_switch_interval(2)  # a second Python thread: the program's interval
        with self.lock:
            if own:
                self._finished.pop(ident, None)
                self._excluded.discard(ident)  # a new thread that reuses an excluded ident
            previous = self._states.pop(ident, None)
            if previous is not None:
                if previous.thread is None or previous.thread is thread:
                    # The sampler saw this thread a moment before it registered itself.
                    previous.thread = thread
                    if clock_id is not None and previous.clock_id is None:
                        previous.clock_id = clock_id
                        previous.last_cpu = self._read_cpu(clock_id)
                    self._states[ident] = previous
                    return previous
                self._write_thread(previous)
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
            self._states[ident] = state
            self._enter_phase(state)
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
                    self._forget_ranges(ident)
                    state = self._states.pop(ident, None)
                    if state is None:
                        return
                    data = self.writer.encode(state)
                self.writer.write(state, data)
            finally:
                self.engine.own_cpu(time.thread_time_ns() - began)
            return
        with self.lock:
            state = self._states.pop(ident, None)
            if state is not None and not self.finished:
                self.python.final_delta(state)  # split at its ranges' changes: before forgetting
            self._forget_ranges(ident)
            if state is None or self.finished:
                return
            self._finished[ident] = state.thread
            data = self.writer.encode(state)
        self.writer.write(state, data)

    def _read_cpu(self, clock_id: int | None) -> float:
        if clock_id is None:
            return 0.0
        try:
            return self.clocks.thread_cpu(clock_id)
        except OSError:
            return 0.0

    def _write_thread(self, state: ThreadState) -> None:
        """Write a thread's files now (the lock held: encoded under it, written after)."""
        self.writer.write(state, self.writer.encode(state))

    def retire(self, ident: int) -> None:
        """Thread ``ident`` ended without :meth:`thread_finished` (a C thread, a reused ident,
        a thread the engine saw end): write its files and forget it (ThreadTable)."""
        self._forget_ranges(ident)
        state = self._states.pop(ident, None)
        if state is not None:
            self._write_thread(state)

    def _forget_ranges(self, ident: int) -> None:
        """A thread's open ranges end with it (its ident may be reused)."""
        if self.ranges is not None:
            self.ranges.forget(ident)

    def skipped(self, ident: int, thread: threading.Thread | None) -> bool:
        """Whether the Python sampler leaves thread ``ident`` alone: one of pyrun's own, or one
        that wrote its profile and is winding down (ThreadTable)."""
        if ident in self._excluded:
            return True
        finished = self._finished
        if ident not in finished:
            return False
        if thread is None or thread is finished[ident]:
            return True
        del finished[ident]  # a new thread with the ident of one that ended
        return False

    def forget_wound_down(self, alive: Mapping[int, object]) -> None:
        """Threads that wrote their profile and are gone from ``alive`` (ThreadTable)."""
        finished = self._finished
        if finished:
            for ident in [i for i in finished if i not in alive]:
                del finished[ident]

    # -- the sampling thread and the program's switch interval ---------------------------------

    def start_sampler(self) -> None:
        """Start the sampling thread (and the engine once the thread left itself out, unless
        the process starts paused: ``pyrun --start-paused``)."""
        self.python.started(paused=self.windows.paused)
        self.windows.open()
        self.sampling.start()
        if self.engine is not None and not self.windows.paused:
            try:
                self.engine.start()  # after the drain thread left itself out
            except OSError as error:
                sys.stderr.write(f"pyrun: cannot start the sampling engine: {error}\n")
                return
            self.engine.register_current_thread()

    def stop_sampler(self, timeout: float = 2.0) -> None:
        """Stop the sampling thread and wait (bounded) for it to finish its wake-up."""
        if self.sampling.running:
            self.python.stopped()
        self.sampling.stop(timeout)

    @property
    def program_switch_interval(self) -> float:
        """The GIL switch interval the program asked for (``sys.getswitchinterval`` says it)."""
        return self.python.program_switch_interval

    def set_program_switch_interval(self, interval: float) -> None:
        """The program called ``sys.setswitchinterval(interval)``."""
        self.python.set_program_switch_interval(interval)

    # -- windows (pyrun ctl: docs/pyrun.md, "Windows of long jobs") ----------------------------

    def pause(self) -> bool:
        """Stop sampling until :meth:`resume`: every thread's time up to now is attributed where
        it was last seen, a traced thread goes idle, and the files are written. False when
        already paused."""
        with self.lock:
            if self.finished or self.windows.paused:
                return False
            self.windows.paused = True
            if self.engine is not None:
                self.engine.stop()  # each thread's time since its last sample is recorded
                self.engine.drain(retire=False)  # the threads go on: they keep their CCTs
            else:
                self.python.pause()
            now_ns = self.clocks.epoch_ns()
            for state in self._states.values():
                state.go_idle(now_ns)
        if self.gpu is not None:
            self.gpu.window(paused=True)
        self.windows.publish()
        self.checkpoint()
        return True

    def resume(self) -> bool:
        """Sample again after :meth:`pause` (or a paused start); False when not paused."""
        with self.lock:
            if self.finished or not self.windows.paused:
                return False
            self.windows.paused = False
            if self.engine is None:
                self.python.resume()
        if self.gpu is not None:
            self.gpu.window(paused=False)
        self._restart_engine()
        self.sampling.window_began()
        self.windows.publish()
        return True

    def enter_phase(self, name: str) -> None:
        """Put every thread's samples from now on under the context node ``<mark NAME>``,
        directly under its fence (``pyrun ctl PID mark NAME``), until the next mark."""
        with self.lock:
            if self.finished:
                return
            # Each thread's time up to now stays in the phase it had: the engine stops (each
            # thread's time since its last sample is recorded) and starts again; the Python
            # sampler attributes it and counts afresh.
            restart = self.engine is not None and self.engine.started
            if self.engine is not None and restart:
                self.engine.stop()
                self.engine.drain(retire=False)
            elif self.engine is None and not self.windows.paused:
                self.python.pause()
                self.python.resume()
            self.windows.mark = name
            for state in self._states.values():
                self._enter_phase(state)
            if self.engine is not None:
                self.engine.restart_paths()  # the threads' paths start from the new node
        if restart:
            self._restart_engine()
        self.windows.publish()

    def _restart_engine(self) -> None:
        """Start the engine again after a pause or a mark (threads measured from now on)."""
        if self.engine is not None:
            try:
                self.engine.start()
            except OSError as error:
                self.tell_once(f"pyrun: cannot restart the sampling engine: {error}")

    def _enter_phase(self, state: ThreadState) -> None:
        """Start ``state``'s paths from the node of the current mark (the fence: none)."""
        cct = state.cct
        mark = self.windows.mark
        if mark:
            fid = self.functions.named(MARK_FORMAT.format(mark))
            cct.phase = cct.child(cct.fence, self.python_lm, fid << LOGICAL_FID_SHIFT)
        else:
            cct.phase = cct.fence
        state.path_nodes.clear()
        state.last_ips = []
        state.last_path_leaf = cct.phase

    # -- writing ---------------------------------------------------------------------------------

    def identity(self, state: ThreadState) -> ProfileIdentity:
        return self.writer.identity_of(state.number)

    def tell_once(self, message: str) -> None:
        """Say ``message`` (a line of pyrun's) on stderr, once per process."""
        self.writer.tell_once(message)

    def checkpoint(self) -> None:
        """Write every live thread's files now (atomic replace), keeping measurement going."""
        with self.lock:
            if self.finished:
                return
            if self.engine is not None:
                self.engine.drain()
            encoded = [(state, self.writer.encode(state)) for state in self._all_states()]
        self.python.writing(True)
        try:
            for state, data in encoded:
                self.writer.write(state, data)
        finally:
            self.python.writing(False)

    def before_exec(self) -> None:
        """The process is about to ``exec``: stop sampling (a signal pending at the exec would
        kill the new program) and take in what was sampled; the caller then writes every
        thread's files (hooks: a checkpoint that a fatal signal cannot cut short)."""
        self.windows.close()  # the new program (same pid and start time) opens its own
        if self.engine is not None and self.engine.started:
            self.engine.stop()
            with self.lock:
                if not self.finished:
                    self.engine.drain(retire=False)

    def after_failed_exec(self) -> None:
        """The ``exec`` failed: the program goes on, so does its measurement."""
        self.windows.open()
        if self.windows.paused:
            return
        if self.engine is not None and not self.engine.started and not self.finished:
            try:
                self.engine.start()
            except OSError as error:
                sys.stderr.write(f"pyrun: cannot restart the sampling engine: {error}\n")

    def _all_states(self) -> list[ThreadState]:
        return list(self._states.values()) + self.streams

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
        self.windows.close()
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
                    self.python.final_delta(state)
            encoded = [(state, self.writer.encode(state)) for state in states]
            self.finished = True
        for state, data in encoded:
            self.writer.write(state, data)
        give_up_reserve()

"""The session's sampler thread: the Python sampler (the fallback), or the engine's drain.

Under the sampling engine (:mod:`pyhpctk.measure.engine`) the thread *drains*: it moves the
engine's samples into the threads' CCTs. Without it the thread samples itself
(:meth:`SamplerThread.sample`): it wakes once per period, at a random point inside it, reads
``sys._current_frames()`` and each thread's CPU clock, and attributes each thread's CPU-time or
wall-time delta to its current Python stack. Either way it writes the checkpoints (early ones
first, backing off to ``--checkpoint`` seconds: :meth:`SamplerThread._checkpoint_if_due`), and
while the program has one Python thread it shortens the GIL's switch interval so that the
sampler gets the GIL within a fraction of a period.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import _thread
import opcode
import os
import sys
import threading
import time

from pyhpctk.measure import engine
from pyhpctk.measure.cct import python_frame_ips

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from pyhpctk.measure.cct import FunctionTable, MetricKind
    from pyhpctk.measure.config import MeasureOptions
    from pyhpctk.measure.engine import EngineSampler
    from pyhpctk.measure.thread_state import Clocks, ThreadState

# The interpreter's own functions: hooks.py wraps the sys attributes for the program.
_set_switch_interval = sys.setswitchinterval

# A leaf frame whose last instruction returned or yielded has finished since
# sys._current_frames() was taken (the GIL can change hands while a sample is walked): its
# parents now show where the thread went on, so that stack is not used.
_FINISHED_OPCODES = frozenset(
    opcode.opmap[name]
    for name in ("RETURN_VALUE", "RETURN_CONST", "YIELD_VALUE")
    if name in opcode.opmap
)


# Checkpoints (SamplerThread._checkpoint_if_due): the first this soon after measuring began,
# the next ones after a share of the time measured so far and a multiple of their own cost.
FIRST_CHECKPOINT_S = 0.25
CHECKPOINT_SHARE = 4
CHECKPOINT_COST_SHARE = 100


class SamplerThread:
    """The sampler thread and the Python sampler (a part of the session's class)."""

    # The session's state these methods use (set in Session.__init__ and its process state).
    options: MeasureOptions
    clocks: Clocks
    lock: _thread.RLock
    engine: EngineSampler | None
    functions: FunctionTable
    python_lm: int
    sampling_kind: MetricKind
    states: dict[int, ThreadState]
    finished: bool
    samples: int
    program_switch_interval: float
    _cpu_metric: int
    _real_metric: int
    _fast_interval: float
    _fast_switch: bool
    _finished: dict[int, threading.Thread | None]
    _excluded: set[int]
    _before_sampler: set[int]
    _sampler_ident: int | None
    _stop_lock: _thread.LockType | None
    _stopped_lock: _thread.LockType | None
    _last_checkpoint: float
    _measuring_since: float
    _measuring_since_cpu: float
    _last_checkpoint_cpu: float
    _checkpoint_cost: float

    if TYPE_CHECKING:  # the session's own, which the sampler calls

        def register_thread(
            self,
            thread: threading.Thread | None,
            main: bool = False,
            ident: int | None = None,
            native_id: int | None = None,
            program_ns: int = -1,
            from_birth: bool = False,
        ) -> ThreadState: ...

        def _retire(self, state: ThreadState, final_delta: bool) -> None: ...

        def checkpoint(self) -> None: ...

    # -- sampling -------------------------------------------------------------------------------

    def sample(self) -> None:
        """Take one sample of every thread (the sampler thread calls this each period)."""
        clocks = self.clocks
        now = clocks.wall()
        now_ns = clocks.epoch_ns() if self.options.trace else 0
        thread_cpu = clocks.thread_cpu
        cpu_metric = self._cpu_metric
        real_metric = self._real_metric
        tracing = self.options.trace
        functions = self.functions
        fid_of = functions.fid_of
        python_lm = self.python_lm
        kind = self.sampling_kind
        active = threading._active  # type: ignore[attr-defined]
        finished_opcodes = _FINISHED_OPCODES
        with self.lock:
            if self.finished:
                return
            # The frames are taken once the lock is held: waiting for it lets other threads
            # run, and a frame walked after its thread went on is at best a stale stack, and
            # on CPython 3.11 can be freed memory (a crash in f_back; python/cpython#111363).
            frames = clocks.current_frames()
            self.samples += 1
            states = self.states
            sampler = self._sampler_ident
            finished = self._finished
            excluded = self._excluded
            for ident, frame in frames.items():
                if ident == sampler or ident in excluded:
                    continue
                state = states.get(ident)
                if state is None:
                    if ident in finished:
                        thread = active.get(ident)
                        if thread is None or thread is finished[ident]:
                            continue  # it wrote its profile and is ending
                        del finished[ident]
                    state = self._adopt(ident, active.get(ident))
                elif state.thread is not None and active.get(ident, state.thread) is not (
                    state.thread
                ):
                    # The ident was reused: the thread we knew ended without telling us.
                    states.pop(ident)
                    self._retire(state, final_delta=False)
                    state = self._adopt(ident, active.get(ident))
                cpu_delta = 0.0
                if cpu_metric >= 0 and state.clock_id is not None:
                    try:
                        cpu = thread_cpu(state.clock_id)
                    except OSError:
                        cpu = state.last_cpu
                    cpu_delta = cpu - state.last_cpu
                    state.last_cpu = cpu
                real_delta = now - state.last_wall
                state.last_wall = now
                if real_metric < 0 and cpu_delta <= 0.0:
                    if tracing and not state.idle:
                        state.cct.retain(state.cct.no_activity)
                        state.trace_times.append(now_ns)
                        state.trace_nodes.append(state.cct.no_activity)
                    state.idle = True
                    continue
                cct = state.cct
                try:
                    leaf_done = frame.f_code.co_code[frame.f_lasti] in finished_opcodes
                except IndexError:
                    leaf_done = False
                if leaf_done:
                    leaf = cct.last_leaf
                else:
                    ips = python_frame_ips(frame, functions, fid_of)
                    if ips == state.last_ips:  # the same path as last time: a hot loop
                        leaf = state.last_path_leaf
                    else:
                        leaf = cct.path(python_lm, ips)
                        state.last_ips, state.last_path_leaf = ips, leaf
                    cct.last_leaf = leaf
                values = cct.values_of(kind)
                if cpu_delta > 0.0:
                    values.add(leaf, cpu_metric, cpu_delta)
                if real_metric >= 0 and real_delta > 0.0:
                    values.add(leaf, real_metric, real_delta)
                state.idle = False
                if tracing:
                    cct.retained[leaf] = 1
                    state.trace_times.append(now_ns)
                    state.trace_nodes.append(leaf)
            if finished:
                for ident in [i for i in finished if i not in frames]:
                    del finished[ident]
            if len(states) >= len(frames):
                for ident in [i for i in states if i not in frames]:
                    # Gone from sys._current_frames(): either the thread ended without passing
                    # through threading (write what it had), or it is a native thread between
                    # two calls into Python (it keeps its CCT). Its CPU clock tells which.
                    if not self._alive(states[ident]):
                        self._retire(states.pop(ident), final_delta=False)
            if sampler is not None:
                self._tune_switch_interval(len(frames) - (sampler in frames))

    def _tune_switch_interval(self, program_threads: int) -> None:
        """Let the sampler get the GIL within a fraction of a period in one-thread programs.

        A thread that wants the GIL waits a whole switch interval (5 ms by default) before it
        asks the running thread to drop it, so a sampler thread would sample a CPU-bound
        program at most every 5 ms plus its period. While the program has a single Python
        thread the only waiter is the sampler, so a short interval changes nothing else; as
        soon as the program runs a second thread the program's own interval is restored (its
        threads' scheduling is its business). ``sys.getswitchinterval`` keeps reporting the
        program's value (hooks).
        """
        fast = (
            program_threads <= 1
            and self._stop_lock is not None
            and not self.finished
            and self.engine is None  # the engine samples without the GIL
        )
        if fast != self._fast_switch:
            self._fast_switch = fast
            interval = self.program_switch_interval
            _set_switch_interval(min(interval, self._fast_interval) if fast else interval)

    def set_program_switch_interval(self, interval: float) -> None:
        """The program called ``sys.setswitchinterval(interval)``."""
        _set_switch_interval(interval)  # validates, as the program's call would
        self.program_switch_interval = interval
        if self._fast_switch:
            _set_switch_interval(min(interval, self._fast_interval))

    def _alive(self, state: ThreadState) -> bool:
        """Whether the thread still exists: a dead thread's CPU clock cannot be read."""
        if state.clock_id is None:
            return False
        try:
            self.clocks.thread_cpu(state.clock_id)
        except OSError:
            return False
        return True

    def _adopt(self, ident: int, thread: threading.Thread | None) -> ThreadState:
        """A thread seen for the first time by the sampler (it existed before, is foreign, or
        has not reached pyrun's thread hook yet): one born since measuring began counts its
        CPU time from its birth, as the engine does."""
        main = thread is not None and thread is threading.main_thread()
        born = ident not in self._before_sampler
        return self.register_thread(thread, main=main, ident=ident, from_birth=born)

    # -- sampler thread -------------------------------------------------------------------------

    def start_sampler(self) -> None:
        """Start the sampler thread (a raw ``_thread``, invisible to ``threading.enumerate``)."""
        stop = _thread.allocate_lock()
        stop.acquire()
        stopped = _thread.allocate_lock()
        stopped.acquire()
        self._stop_lock, self._stopped_lock = stop, stopped
        started = _thread.allocate_lock()
        started.acquire()
        main = self._sampler_main if self.engine is None else self._drain_main
        _thread.start_new_thread(main, (stop, stopped, started))
        started.acquire()
        if self.engine is not None:
            try:
                self.engine.start()  # after the drain thread left itself out
            except OSError as error:
                sys.stderr.write(f"pyrun: cannot start the sampling engine: {error}\n")
                return
            self.engine.register_current_thread()

    def _drain_main(
        self, stop: _thread.LockType, stopped: _thread.LockType, started: _thread.LockType
    ) -> None:
        """The sampler thread under the engine: move samples into the CCTs, write checkpoints."""
        self._sampler_ident = _thread.get_ident()
        _name_own_thread("pyrun-drain")
        assert self.engine is not None
        self.engine.exclude_current_thread()
        started.release()
        failures = 0
        try:
            period = engine.drain_period()
            while not stop.acquire(True, period):
                try:
                    with self.lock:
                        if not self.finished:
                            self.engine.drain()
                    self._checkpoint_if_due()
                except Exception as error:  # one bad drain must not end the measurement
                    failures += 1
                    if failures == 1:
                        sys.stderr.write(f"pyrun: a drain failed: {error!r}\n")
                    if failures >= 100:
                        raise
        except Exception as error:  # never kill the program; say once why measurement stopped
            sys.stderr.write(f"pyrun: sampler stopped: {error!r}\n")
        finally:
            self.engine.own_thread_end()  # pyrun's CPU time, not the program's lost time
            stopped.release()

    def _sampler_main(
        self, stop: _thread.LockType, stopped: _thread.LockType, started: _thread.LockType
    ) -> None:
        self._sampler_ident = _thread.get_ident()
        started.release()
        period = self.options.period_s
        wall = time.monotonic
        # Each period gets one wake-up at a random point inside it (stratified sampling): a
        # strictly periodic sampler aliases with periodic programs and over-samples some phases
        # of their loops. xorshift32 draws the offsets: ``random`` would cost an import.
        state = (os.getpid() * 2654435761 + time.monotonic_ns()) & 0xFFFFFFFF or 1
        window = wall()
        next_wake = window + period * 0.5
        failures = 0
        try:
            while not stop.acquire(True, max(0.0, next_wake - wall())):
                try:
                    self.sample()
                    self._checkpoint_if_due()
                except Exception as error:  # one bad sample must not end the measurement
                    failures += 1
                    if failures == 1:
                        sys.stderr.write(f"pyrun: a sample failed: {error!r}\n")
                    if failures >= 100:
                        raise
                now = wall()
                window += period
                if window + period < now:  # fell behind (a long GIL hold): no burst to catch up
                    window = now
                state ^= (state << 13) & 0xFFFFFFFF
                state ^= state >> 17
                state ^= (state << 5) & 0xFFFFFFFF
                next_wake = window + period * (state / 4294967296.0)
        except Exception as error:  # never kill the program; say once why measurement stopped
            sys.stderr.write(f"pyrun: sampler stopped: {error!r}\n")
        finally:
            stopped.release()

    def _checkpoint_if_due(self) -> None:
        """Write a checkpoint if one is due (the sampler thread asks after each wake-up).

        The first comes :data:`FIRST_CHECKPOINT_S` after measuring began, each next one once
        1/:data:`CHECKPOINT_SHARE` of the time measured so far has passed since the last, on
        the wall clock or on the process's CPU clock, whichever comes first, backing off to
        ``--checkpoint`` seconds: a crash or SIGKILL at any moment keeps about four fifths of
        what came before it, in wall-clock and in CPU time, on a loaded machine too (a crash
        after 1.5 s keeps 1.2 s), where a first checkpoint after 10 s kept nothing of a shorter
        run. Each waits at least :data:`CHECKPOINT_COST_SHARE` times the CPU time the last one
        took, so that checkpoints of many threads cost at most 1 % of a CPU.
        """
        interval = self.options.checkpoint_s
        if not interval:
            return
        now, cpu = time.monotonic(), time.process_time()
        floor = max(FIRST_CHECKPOINT_S, self._checkpoint_cost * CHECKPOINT_COST_SHARE)
        wall_since, cpu_since = now - self._last_checkpoint, cpu - self._last_checkpoint_cpu
        due = wall_since >= interval or (
            wall_since >= floor
            and (
                wall_since >= (now - self._measuring_since) / CHECKPOINT_SHARE
                or cpu_since >= (cpu - self._measuring_since_cpu) / CHECKPOINT_SHARE
            )
        )
        if not due:
            return
        began = time.thread_time()
        self.checkpoint()
        self._last_checkpoint, self._last_checkpoint_cpu = time.monotonic(), time.process_time()
        self._checkpoint_cost = time.thread_time() - began

    def stop_sampler(self, timeout: float = 2.0) -> None:
        """Stop the sampler thread and wait (bounded) for it to finish its current sample."""
        stop, stopped = self._stop_lock, self._stopped_lock
        if stop is None or stopped is None:
            return
        self._stop_lock = self._stopped_lock = None
        stop.release()
        self._tune_switch_interval(2)
        if _thread.get_ident() != self._sampler_ident:
            stopped.acquire(True, timeout)


def _name_own_thread(name: str) -> None:
    """Give pyrun's own thread a kernel name (top, ``ps -L``, py-spy and the per-task CPU in
    /proc tell it from the program's threads); nothing if /proc is not there."""
    try:
        with open(f"/proc/self/task/{_thread.get_native_id()}/comm", "w") as stream:
            stream.write(name[:15])
    except OSError:
        pass

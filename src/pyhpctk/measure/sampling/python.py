"""The Python sampler (the fallback where the engine cannot run).

Each wake-up of the sampling thread (:mod:`.thread`) samples every thread itself
(:meth:`PythonSampler.sample`): it wakes once per period, at a random point inside it, reads
``sys._current_frames()`` and each thread's CPU clock, and attributes each thread's CPU-time or
wall-time delta to its current Python stack. While the program has one Python thread it
shortens the GIL's switch interval so that the sampler gets the GIL within a fraction of a
period (:meth:`PythonSampler.tune_switch_interval`; the session keeps the program's own value
here under the engine too). It holds the session's
:class:`~pyhpctk.measure.session.table.ThreadTable` and reaches nothing else of it.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import _thread
import opcode
import os
import sys
import threading
import time

from pyhpctk.measure.cct import python_frame_ips
from pyhpctk.measure.events import CLOCK_THREAD_CPU, CLOCK_WALL, READ_DELTA
from pyhpctk.measure.gc_context import Collections, held_off, listen, stop_listening
from pyhpctk.measure.ranges import place_inner

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from pyhpctk.measure.ranges import Change, State
    from pyhpctk.measure.sampling.tasks import TaskChains
    from pyhpctk.measure.session.table import ThreadTable
    from pyhpctk.measure.thread_state import ThreadState

# The interpreter's own functions: hooks.py wraps the sys attributes for the program.
_set_switch_interval = sys.setswitchinterval
_get_switch_interval = sys.getswitchinterval

# A leaf frame whose last instruction returned or yielded has finished since
# sys._current_frames() was taken (the GIL can change hands while a sample is walked): its
# parents now show where the thread went on, so that stack is not used.
_FINISHED_OPCODES = frozenset(
    opcode.opmap[name]
    for name in ("RETURN_VALUE", "RETURN_CONST", "YIELD_VALUE")
    if name in opcode.opmap
)


def _metric_of(table: ThreadTable, clock: str) -> int:
    """The first event that reads deltas of ``clock`` (its metric), -1 when none does."""
    return next(
        (
            i
            for i, spec in enumerate(table.options.events)
            if spec.event.clock == clock and spec.event.reads == READ_DELTA
        ),
        -1,
    )


class PythonSampler:
    """Samples every thread from the sampling thread (see the module docstring)."""

    def __init__(self, table: ThreadTable, samples_itself: bool = True) -> None:
        self.table = table
        #: False under the engine: this one only keeps the program's switch interval then.
        self.samples_itself = samples_itself
        # The Python sampler reads the registry's deltas of both clocks.
        self.cpu_metric = _metric_of(table, CLOCK_THREAD_CPU)
        self.real_metric = _metric_of(table, CLOCK_WALL)
        # The GIL switch interval the program asked for (sys.getswitchinterval reports it), and
        # the shorter one pyrun uses while the program has one Python thread.
        self.program_switch_interval = _get_switch_interval()
        self._fast_interval = max(50e-6, table.options.period_s / 8)
        self._fast_switch = False
        self._writing = False  # pyrun's thread writes a checkpoint (:meth:`writing`)
        self.running = False  # the sampling thread runs (started, not asked to stop)
        # The collections it cannot sample (gc_context), timed while it samples itself.
        self.collections: Collections | None = None
        self.paused = False  # between windows (pyrun ctl stop, --start-paused): no sample
        # pyrun --async-aware: a coroutine's time under the chain of tasks awaiting it
        self.tasks: TaskChains | None = None
        if table.options.async_aware:
            from pyhpctk.measure.sampling import tasks

            self.tasks = tasks.TaskChains(table)
        self.reset()

    def reset(self) -> None:
        """A new process (or a forked child) starts afresh."""
        self.samples = 0
        self.sampler_ident: int | None = None  # the sampling thread's, once it runs
        # Threads alive when measuring began: any other the sampler finds was born since.
        with held_off:  # frame objects of other threads are made (gc_context.HeldOff)
            self._before_sampler: set[int] = set(sys._current_frames())
        self._window = self._next_wake = 0.0
        self._draw = 1

    # -- the sampling thread's wake-ups (the Sampler interface) --------------------------------

    def thread_began(self) -> None:
        self.sampler_ident = _thread.get_ident()

    def first_wait(self) -> float:
        # Each period gets one wake-up at a random point inside it (stratified sampling): a
        # strictly periodic sampler aliases with periodic programs and over-samples some phases
        # of their loops. xorshift32 draws the offsets: ``random`` would cost an import.
        self._draw = (os.getpid() * 2654435761 + time.monotonic_ns()) & 0xFFFFFFFF or 1
        self._window = time.monotonic()
        self._next_wake = self._window + self.table.options.period_s * 0.5
        return max(0.0, self._next_wake - time.monotonic())

    def wake(self) -> None:
        self.sample()

    def next_wait(self) -> float:
        period = self.table.options.period_s
        now = time.monotonic()
        self._window += period
        if self._window + period < now:  # fell behind (a long GIL hold): no burst to catch up
            self._window = now
        draw = self._draw
        draw ^= (draw << 13) & 0xFFFFFFFF
        draw ^= draw >> 17
        draw ^= (draw << 5) & 0xFFFFFFFF
        self._draw = draw
        self._next_wake = self._window + period * (draw / 4294967296.0)
        return max(0.0, self._next_wake - time.monotonic())

    def thread_ended(self) -> None:
        """Nothing to account: without the engine pyrun's own CPU time is not told apart."""

    def started(self, paused: bool = False) -> None:
        """The sampling thread was started (``paused``: it samples from :meth:`resume` on)."""
        self.running = True
        if self.samples_itself:
            if self.collections is None:
                self.collections = Collections(self.table.functions)
            listen(self.collections)
        self.paused = paused

    def pause(self) -> None:
        """No sample from now on until :meth:`resume` (call with the table's lock held): each
        thread's time since its last sample goes where it was last seen, and the program has
        its own switch interval again."""
        for state in self.table.states.values():
            if not state.is_stream:
                self.final_delta(state)
        self.paused = True
        self.tune_switch_interval(2)

    def resume(self) -> None:
        """Sample again (call with the table's lock held): each thread's clocks count from now,
        and a thread found later was born since (its CPU time counts from its birth)."""
        clocks = self.table.clocks
        now = clocks.wall()
        for state in self.table.states.values():
            if state.clock_id is not None:
                try:  # noqa: SIM105  # contextlib: one more import in every measured process
                    state.last_cpu = clocks.thread_cpu(state.clock_id)
                except OSError:
                    pass  # it ended: the next sample retires it
            state.last_wall = now
        with held_off:
            self._before_sampler = set(sys._current_frames())
        self.paused = False

    def forked(self) -> None:
        """In a forked child: no sampling thread, the program's switch interval."""
        self.running = False
        self._fast_switch = True
        self._writing = False  # the parent's sampling thread was writing: not this process's
        self.tune_switch_interval(2)
        held_off.forked()
        if self.collections is not None:
            stop_listening(self.collections)
            self.collections.reset()

    def stopped(self) -> None:
        """The sampling thread was asked to stop: the program's switch interval again."""
        self.running = False
        self.tune_switch_interval(2)
        if self.collections is not None:
            stop_listening(self.collections)

    # -- sampling -------------------------------------------------------------------------------

    def sample(self) -> None:
        """Take one sample of every thread (the sampling thread calls this each period)."""
        table = self.table
        clocks = table.clocks
        now = clocks.wall()
        tracing = table.options.trace
        now_ns = clocks.epoch_ns() if tracing else 0
        thread_cpu = clocks.thread_cpu
        cpu_metric = self.cpu_metric
        real_metric = self.real_metric
        functions = table.functions
        fid_of = functions.fid_of
        python_lm = table.python_lm
        kind = table.sampling_kind
        active = threading._active  # type: ignore[attr-defined]
        finished_opcodes = _FINISHED_OPCODES
        collections = self.collections
        # No collection starts while the frames are read and walked (on 3.11, one started by
        # the frame object made for another thread's frame could hand that thread the GIL; it
        # left the frame and reused its memory: a SIGSEGV of the program; gc_context.HeldOff),
        # nor until this sample is done: one held off would then run on the sampling thread,
        # its time lost to the program's profile, where the program's next allocation runs it.
        with table.lock, held_off:
            if table.finished:
                return
            # The frames are taken once the lock is held: waiting for it lets other threads
            # run, and a frame walked after its thread went on is at best a stale stack, and
            # on CPython 3.11 can be freed memory (a crash in f_back; python/cpython#111363).
            frames = clocks.current_frames()
            self.samples += 1
            tasks = self.tasks
            if tasks is not None:
                tasks.refresh()
            ranges = table.ranges
            states = table.states
            sampler = self.sampler_ident
            skipped = table.skipped
            for ident, frame in frames.items():
                if ident == sampler:
                    continue
                state = states.get(ident)
                if state is None:
                    if skipped(ident, active.get(ident)):
                        continue  # pyrun's own, or it wrote its profile and is ending
                    state = self._adopt(ident, active.get(ident))
                elif state.thread is not None and active.get(ident, state.thread) is not (
                    state.thread
                ):
                    # The ident was reused: the thread we knew ended without telling us.
                    table.retire(ident)
                    state = self._adopt(ident, active.get(ident))
                cpu_delta = 0.0
                cpu_before = state.last_cpu
                if cpu_metric >= 0 and state.clock_id is not None:
                    try:
                        cpu = thread_cpu(state.clock_id)
                    except OSError:
                        cpu = state.last_cpu
                    cpu_delta = cpu - state.last_cpu
                    state.last_cpu = cpu
                real_delta = now - state.last_wall
                state.last_wall = now
                collected = (
                    collections.take(ident, state.last_cpu, now)
                    if collections is not None
                    else None
                )
                if collected:
                    cpu_delta, real_delta = self._collected(state, collected, cpu_delta, real_delta)
                if real_metric < 0 and cpu_delta <= 0.0:
                    state.go_idle(now_ns)
                    continue
                cct = state.cct
                try:
                    leaf_done = frame.f_code.co_code[frame.f_lasti] in finished_opcodes
                except IndexError:
                    leaf_done = False
                frame_ips: list[int] | None = None
                if leaf_done:
                    leaf = cct.last_leaf
                else:
                    if tasks is None:
                        ips = frame_ips = python_frame_ips(frame, functions, fid_of)
                    else:
                        ips = frame_ips = tasks.thread_ips(frame, fid_of)
                    state.last_frame_ips = frame_ips
                    if ranges is not None:
                        ips = ranges.under(ips, ident)
                    if ips == state.last_ips:  # the same path as last time: a hot loop
                        leaf = state.last_path_leaf
                    else:
                        leaf = cct.path(python_lm, ips)
                        state.last_ips, state.last_path_leaf = ips, leaf
                    cct.last_leaf = leaf
                values = cct.values_of(kind)
                if ranges is not None and cpu_delta > 0.0:
                    changes = ranges.changes_of(ident)
                    if changes:
                        cpu_delta = self._split_at_changes(
                            state, changes, frame_ips, cpu_before, cpu_delta
                        )
                if cpu_delta > 0.0:
                    values.add(leaf, cpu_metric, cpu_delta)
                if real_metric >= 0 and real_delta > 0.0:
                    values.add(leaf, real_metric, real_delta)
                state.idle = False
                if tracing:
                    cct.retained[leaf] = 1
                    state.trace_times.append(now_ns)
                    state.trace_nodes.append(leaf)
            table.forget_wound_down(frames)
            if len(states) >= len(frames):
                for ident in [i for i in states if i not in frames]:
                    # Gone from sys._current_frames(): either the thread ended without passing
                    # through threading (write what it had), or it is a native thread between
                    # two calls into Python (it keeps its CCT). Its CPU clock tells which.
                    if not self._alive(states[ident]):
                        table.retire(ident)
            if sampler is not None:
                self.tune_switch_interval(len(frames) - (sampler in frames))

    def _split_at_changes(
        self,
        state: ThreadState,
        changes: list[Change],
        frame_ips: list[int] | None,
        before: float,
        cpu_delta: float,
    ) -> float:
        """Give the CPU time a thread spent before each change of its ranges since its last
        sample (``before``: its CPU clock then) to the ranges it spent it under: up to the
        first change, where the last sample saw it; between two, to the ranges of that stretch
        themselves, under the frames that opened them (no sample saw where in them the thread
        was: its frames now, ``frame_ips``, innermost first, were often a function that never
        ran in them, and the line of another range), or, outside any range, its frames now
        (None: those the last sample saw). Returns what is left of ``cpu_delta``: the time
        since the last change, the stack's now.

        A sample comes late on a loaded machine (the sampling thread waits for a CPU, then for
        the GIL), and all the CPU time since the last one would go to the stack it finds: the
        whole of a range that ended meanwhile to the next one. The hooks know when each range
        opened and closed, on the thread's own CPU clock: the time is split there."""
        cct = state.cct
        frames = state.last_frame_ips if frame_ips is None else frame_ips
        # None: where the last sample saw it; else (the state, the frames that opened it)
        spent_under: dict[tuple[State, tuple[int, ...]] | None, float] = {}
        start = before
        for i, (at, left, openers) in enumerate(changes):
            spent = min(at - start, cpu_delta)
            if spent > 0.0:
                key = None if i == 0 else (left, tuple(openers if left else frames))
                spent_under[key] = spent_under.get(key, 0.0) + spent
                cpu_delta -= spent
                start = at
        values = cct.values_of(self.table.sampling_kind)
        for key, spent in spent_under.items():  # a model's modules: a few states, many changes
            path = None if key is None else place_inner(list(key[1]), key[0])
            leaf = cct.last_leaf if path is None else cct.path(self.table.python_lm, path)
            values.add(leaf, self.cpu_metric, spent)
        return cpu_delta

    def _collected(
        self,
        state: ThreadState,
        collected: dict[tuple[int, ...], list[float]],
        cpu_delta: float,
        real_delta: float,
    ) -> tuple[float, float]:
        """Move the time of a thread's collections since its last sample out of its deltas,
        to ``<gc>`` under the stacks that triggered them; the deltas that are left."""
        cct = state.cct
        values = cct.values_of(self.table.sampling_kind)
        for path, (cpu, wall) in collected.items():
            leaf = cct.path(self.table.python_lm, list(path))
            cpu = min(cpu, cpu_delta)
            if self.cpu_metric >= 0 and cpu > 0.0:
                values.add(leaf, self.cpu_metric, cpu)
                cpu_delta -= cpu
            wall = min(wall, real_delta)
            if self.real_metric >= 0 and wall > 0.0:
                values.add(leaf, self.real_metric, wall)
                real_delta -= wall
        return cpu_delta, real_delta

    def tune_switch_interval(self, program_threads: int) -> None:
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
            and self.running
            and not self.paused
            and not self.table.finished
            and self.samples_itself  # the engine samples without the GIL
        )
        if fast != self._fast_switch:
            self._fast_switch = fast
            self._apply_switch_interval()

    def writing(self, writes: bool) -> None:
        """pyrun's own thread begins (``writes``) or ends writing files, a checkpoint.

        Each write gives the GIL up, and taking it back waits a whole switch interval where
        the program has a second thread: a checkpoint of a few files took 0.36 s of the
        program's 1 s, the sampling thread's, no sample meanwhile. The short interval holds
        while it writes (a few milliseconds so)."""
        self._writing = writes
        self._apply_switch_interval()

    def set_program_switch_interval(self, interval: float) -> None:
        """The program called ``sys.setswitchinterval(interval)``."""
        _set_switch_interval(interval)  # validates, as the program's call would
        self.program_switch_interval = interval
        self._apply_switch_interval()

    def _apply_switch_interval(self) -> None:
        interval = self.program_switch_interval
        if self._fast_switch or self._writing:
            interval = min(interval, self._fast_interval)
        _set_switch_interval(interval)

    def _alive(self, state: ThreadState) -> bool:
        """Whether the thread still exists: a dead thread's CPU clock cannot be read."""
        if state.clock_id is None:
            return False
        try:
            self.table.clocks.thread_cpu(state.clock_id)
        except OSError:
            return False
        return True

    def _adopt(self, ident: int, thread: threading.Thread | None) -> ThreadState:
        """A thread seen for the first time by the sampler (it existed before, is foreign, or
        has not reached pyrun's thread hook yet): one born since measuring began counts its
        CPU time from its birth, as the engine does."""
        main = thread is not None and thread is threading.main_thread()
        born = ident not in self._before_sampler
        return self.table.register_thread(thread, main=main, ident=ident, from_birth=born)

    def final_delta(self, state: ThreadState) -> None:
        """Attribute what a thread used since its last sample to the last place it was seen
        (nothing between windows: the pause attributed what came before it)."""
        if self.paused:
            return
        cct = state.cct
        values = cct.values_of(self.table.sampling_kind)
        clocks = self.table.clocks
        ranges = self.table.ranges
        if self.cpu_metric >= 0 and state.clock_id is not None:
            try:
                cpu = clocks.thread_cpu(state.clock_id)
            except OSError:
                cpu = state.last_cpu
            spent, leaf = cpu - state.last_cpu, cct.last_leaf
            changes = ranges.changes_of(state.ident) if ranges is not None else None
            if changes and ranges is not None and spent > 0.0:  # its ranges changed since
                spent = self._split_at_changes(state, changes, None, state.last_cpu, spent)
                path = place_inner(state.last_frame_ips, ranges.state_of(state.ident))
                leaf = cct.path(self.table.python_lm, path)
            if spent > 0.0:
                values.add(leaf, self.cpu_metric, spent)
            state.last_cpu = cpu
        if self.real_metric >= 0:
            now = clocks.wall()
            if now > state.last_wall:
                values.add(cct.last_leaf, self.real_metric, now - state.last_wall)
            state.last_wall = now

"""Ranges as calling contexts (``pyrun --ranges``, issue #37 item 1).

A program marks parts of its run as ranges: PyTorch modules (each ``nn.Module`` call, named by
its path in its model, ``layer1.0.conv1 (Conv2d)``), ``torch.profiler.record_function``,
``torch.cuda.nvtx`` and the ``nvtx`` package's ranges (:mod:`pyhpctk.measure.torch_ranges`
installs those hooks). Each thread keeps a stack of the ranges open on it; a range is a
context node (a function named after the range, in the pseudo file :data:`RANGE_FILE`) placed
right under the Python frame that opened it, above the frames and the GPU work inside it::

    train → _call_impl → ResNet → forward → _call_impl → layer1.0.conv1 (Conv2d) → forward → …

A range remembers its *anchor*: the innermost frame of the program (not pyrun's own) when it was
pushed, and that frame's depth, counted in the frames :func:`~.cct.python_frame_ips` keeps. A
sample or a GPU launch places each open range after that many Python frames of its own path:

- the Python sampler and the GPU monitor read the thread's ranges as they are (:meth:`place`);
  a late sample would give all the CPU time since the last one to the ranges open now, so each
  change is also logged with the thread's CPU clock, where the sampler splits that time
  (:meth:`changes_of`);
- the engine samples in a signal handler, and its samples are drained later: each change of a
  thread's ranges is logged with its time (``CLOCK_REALTIME``, the clock of the engine's sample
  stamps), and the drain places each sample under the ranges open at its time
  (:meth:`engine_entries`);
- the CUPTI hook remembers launch sites by their frames: each change tells it the thread's
  ranges (a :attr:`listeners` callback), which become part of the site.

The backward pass of a module runs on autograd's threads, often without a Python frame of the
program: :meth:`switch` sets a thread's whole stack (the chain of forward modules whose backward
runs now), anchored at the thread's own frames (none: at the root of its path).

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import sys
import time
from _thread import get_ident as _get_ident

from pyhpctk.formats.hpcrun_constants import LOGICAL_FID_SHIFT as FID_SHIFT
from pyhpctk.formats.vocabulary import RANGE_FILE
from pyhpctk.measure.cct import python_frame_ips

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import FrameType

    from pyhpctk.measure.cct import FunctionTable

    #: A thread's open ranges, outermost first: (anchor depth, range ip) each.
    State = tuple[tuple[int, int], ...]
    #: An open range: (ip, anchor depth, anchor frame, the thread's state before it)
    Mark = tuple[int, int, FrameType | None, State]
    #: A change of a thread's ranges, for the Python sampler: (the thread's CPU clock then,
    #: the state it left, the ips of the frames that opened that state's ranges, innermost
    #: first, as they were when it was entered)
    Change = tuple[float, State, list[int]]
    #: What a switch to a chain of names made: (the innermost range it kept, the anchor's
    #: depth, the ranges it opened, the state they make)
    Switched = tuple[Mark | None, int, list[Mark], State]

#: A thread's ranges are logged (for the engine's drain) at most this many changes between two
#: drains; beyond, the oldest half is folded into one (samples then land in fewer ranges).
LOG_LIMIT = 1 << 16
EMPTY: State = ()
_NATIVE_OR_TASK = 3 << 62  # the engine's native frames and task markers: not Python frames


class ThreadRanges:
    """One thread's open ranges."""

    __slots__ = ("changes", "drained", "log", "marks", "openers", "state", "switched", "switches")

    def __init__(self) -> None:
        #: (ip, depth, anchor frame, the state before it) of each open range, outermost first
        self.marks: list[Mark] = []
        self.state: State = EMPTY
        #: (CLOCK_REALTIME ns, state) of each change since the last drain, for the engine
        self.log: list[tuple[int, State]] = []
        self.drained: State = EMPTY  # the state before the first change logged
        #: (the thread's CPU clock, the state it left, that state's openers) of each change
        #: since the Python sampler's last sample of it (:meth:`Ranges.changes_of`)
        self.changes: list[Change] = []
        #: the frames that opened :attr:`state`'s innermost range, as they were then
        self.openers: list[int] = []
        #: the caller of the last :meth:`Ranges.switch`, and the anchor found from it
        self.switched: tuple[object, FrameType | None, int] = (None, None, 0)
        #: what :meth:`Ranges.switch` made of each chain of names under that anchor
        self.switches: dict[tuple[str, ...], Switched] = {}


class Ranges:
    """The open ranges of every thread of the measured process (see the module docstring).

    ``functions``: the session's function table, which names the ranges' nodes; ``timed``: log
    each change with its time (the engine drains its samples later); ``cpu_timed``: log each
    change with the thread's CPU clock (the Python sampler splits a sample's CPU time there)."""

    def __init__(self, functions: FunctionTable, timed: bool = False, cpu_timed: bool = False):
        self.timed = timed
        self.cpu_timed = cpu_timed
        #: told each new state of the calling thread (the CUPTI hook's ``set_range``)
        self.listeners: list[Callable[[State | None], object]] = []
        #: PyTorch's hooks (:class:`~.torch_ranges.TorchRanges`), once installed
        self.hooks: object = None
        self.reset(functions)

    def reset(self, functions: FunctionTable) -> None:
        """A new process (a forked child): no range is open, the names are numbered anew."""
        self.functions = functions
        self._threads: dict[int, ThreadRanges] = {}
        self._ips: dict[str, int] = {}
        self._interned: dict[State, State] = {}
        self._children: dict[tuple[int, int, int], State] = {}
        #: (names, id(state), depth) -> the (ip, state before it) of each name, the state after
        self._steps: dict[tuple[tuple[str, ...], int, int], tuple[list[tuple[int, State]], State]]
        self._steps = {}

    # -- the program's side: ranges opened and closed ------------------------------------

    def ip_of(self, name: str) -> int:
        """The ip of the node of the range named ``name``."""
        ip = self._ips.get(name)
        if ip is None:
            ip = self._ips[name] = self.functions.named(name, RANGE_FILE) << FID_SHIFT
        return ip

    def thread(self) -> ThreadRanges:
        ident = _get_ident()
        found = self._threads.get(ident)
        if found is None:
            found = self._threads[ident] = ThreadRanges()
        return found

    # push, pop and switch run at every module call and hooked autograd node (a backward's on
    # autograd's device thread, under the GIL): their common case takes no method call

    def push(self, name: str, frame: FrameType | None = None) -> None:
        """Open the range ``name`` on the calling thread, under ``frame`` (default: the
        caller's; pyrun's own frames are looked through)."""
        thread = self._threads.get(_get_ident()) or self.thread()
        anchor, depth = self._anchor(thread, sys._getframe(1) if frame is None else frame)
        before = thread.state
        ip = self._ips.get(name) or self.ip_of(name)
        thread.marks.append((ip, depth, anchor, before))
        self._set(
            thread, self._children.get((id(before), depth, ip)) or self._child(before, depth, ip)
        )

    def pop(self) -> None:
        """Close the calling thread's innermost range (none open: nothing happens)."""
        thread = self._threads.get(_get_ident()) or self.thread()
        if thread.marks:
            self._set(thread, thread.marks.pop()[3])

    def switch(self, names: tuple[str, ...], keep: int = 0, frame: FrameType | None = None) -> None:
        """Make ``names`` (outermost first) the calling thread's ranges above its ``keep``
        outermost ones, all under ``frame`` (default: the caller's): the chain of modules
        whose backward runs now, on the thread that runs it."""
        thread = self._threads.get(_get_ident()) or self.thread()
        start = sys._getframe(1) if frame is None else frame
        # A backward pass switches once per hooked node, from the same frames (autograd's
        # device thread: from none, and a caller of no frame is known by its code): the anchor
        # is found once, and what each chain of names makes under it is kept until it moves.
        # Unless the anchor was the last switch's own frame (a call from the program's code).
        back = start.f_back
        caller, anchor, depth = thread.switched
        if caller is not (back or start.f_code) or (
            anchor is not None and (back is None or anchor.f_back is back)
        ):
            found, depth = self._anchor(thread, start, False)
            if found is not anchor:
                thread.switches.clear()  # (its ranges hold the frame)
            anchor = found
            thread.switched = (back or start.f_code, anchor, depth)
        kept = thread.marks[:keep]
        last = kept[-1] if kept else None
        made = thread.switches.get(names)
        if made is None or made[0] is not last or made[1] != depth:
            made = self._switched(thread, names, last, anchor, depth)
        kept += made[2]
        thread.marks = kept
        self._set(thread, made[3])

    def _switched(
        self,
        thread: ThreadRanges,
        names: tuple[str, ...],
        last: Mark | None,
        anchor: FrameType | None,
        depth: int,
    ) -> Switched:
        """What :meth:`switch` makes of ``names`` above the kept range ``last``, under
        ``anchor`` (kept for the thread: :attr:`ThreadRanges.switches`). The same states each
        time: a pass on the calling thread is anchored anew, its chains are not."""
        base = EMPTY if last is None else self._child(last[3], last[1], last[0])
        key = (names, id(base), depth)
        steps = self._steps.get(key)
        if steps is None:
            if len(self._steps) > LOG_LIMIT:
                self._steps.clear()
            opened: list[tuple[int, State]] = []
            state = base
            for name in names:
                ip = self.ip_of(name)
                opened.append((ip, state))
                state = self._child(state, depth, ip)
            steps = self._steps[key] = (opened, state)
        switches = thread.switches
        if len(switches) > LOG_LIMIT:  # chains made up at run time: start over
            switches.clear()
        marks = []
        for ip, before in steps[0]:  # (a comprehension costs a function call in 3.11)
            marks.append((ip, depth, anchor, before))
        made = switches[names] = (last, depth, marks, steps[1])
        return made

    def save(self) -> list[Mark]:
        """The calling thread's open ranges, for :meth:`restore`."""
        return list(self.thread().marks)

    def restore(self, saved: list[Mark]) -> None:
        """Reopen exactly the ranges :meth:`save` returned (after a backward pass)."""
        thread = self.thread()
        thread.switched = (None, None, 0)  # no frame of the pass is held
        thread.switches.clear()
        if thread.marks != saved:
            thread.marks = list(saved)
            last = saved[-1] if saved else None
            self._set(thread, EMPTY if last is None else self._child(last[3], last[1], last[0]))

    def _anchor(
        self, thread: ThreadRanges, frame: FrameType | None, nested: bool = True
    ) -> tuple[FrameType | None, int]:
        """The program's innermost frame from ``frame`` outwards, and its depth (frames kept,
        counted from the outermost: 0 for no frame). Counted up to the innermost open range's
        anchor when that frame is met (nested ranges: a few frames each)."""
        fid_of = self.functions.fid_of
        register = self.functions.register
        outer = thread.marks[-1] if nested and thread.marks else None
        stop, above = (outer[2], outer[1]) if outer is not None else (None, 0)
        anchor: FrameType | None = None
        count = 0
        while frame is not None:
            if frame is stop:
                return (anchor or frame), count + above
            code = frame.f_code
            fid = fid_of.get(id(code))
            if fid is None:
                fid = register(code)
            if fid:
                count += 1
                if anchor is None:
                    anchor = frame
            frame = frame.f_back
        return anchor, count

    def _child(self, parent: State, depth: int, ip: int) -> State:
        """The state ``parent`` with one more range: the same object each time (the C hook
        knows a thread's ranges by it), found without hashing the whole stack."""
        key = (id(parent), depth, ip)
        found = self._children.get(key)
        if found is None:
            if len(self._children) > LOG_LIMIT:  # names made up at run time: start over
                self._children.clear()
                self._interned.clear()
                self._steps.clear()
                for thread in list(self._threads.values()):  # their states: made anew too
                    thread.switches.clear()
            state = (*parent, (depth, ip))
            found = self._interned.setdefault(state, state)
            self._children[key] = found
            self._interned.setdefault(parent, parent)  # its id stays its own
        return found

    def _set(self, thread: ThreadRanges, state: State) -> None:
        if self.cpu_timed:
            changes = thread.changes
            if len(changes) >= LOG_LIMIT:  # a thread no sample reaches: its oldest go
                del changes[: LOG_LIMIT // 2]
            changes.append((time.thread_time(), thread.state, thread.openers))
            # A late sample cannot tell where in this state the thread ran, only that it did:
            # under the frames that opened its ranges, as they are now (their lines move on).
            marks = thread.marks
            anchor = marks[-1][2] if state and marks else None
            functions = self.functions
            thread.openers = (
                python_frame_ips(anchor, functions, functions.fid_of) if anchor is not None else []
            )
        thread.state = state
        if self.timed:
            log = thread.log
            if len(log) >= LOG_LIMIT:
                thread.drained = log[LOG_LIMIT // 2 - 1][1]
                del log[: LOG_LIMIT // 2]
            log.append((time.time_ns(), state))
        if self.listeners:
            for listener in self.listeners:
                listener(state or None)

    # -- the samplers' and the GPU monitor's side ---------------------------------------

    def forget(self, ident: int) -> None:
        """Thread ``ident`` ended: its ranges with it."""
        self._threads.pop(ident, None)

    def state_of(self, ident: int) -> State:
        """Thread ``ident``'s open ranges now."""
        thread = self._threads.get(ident)
        return EMPTY if thread is None else thread.state

    def current(self) -> State:
        """The calling thread's open ranges now."""
        thread = self._threads.get(_get_ident())
        return EMPTY if thread is None else thread.state

    def changes_of(self, ident: int) -> list[Change]:
        """Thread ``ident``'s changes since the last call (:data:`Change`), oldest first
        (``cpu_timed``; for the Python sampler, which holds the GIL: the thread appends none
        meanwhile)."""
        thread = self._threads.get(ident)
        if thread is None or not thread.changes:
            return []
        changes, thread.changes = thread.changes, []
        return changes

    def under(self, ips: list[int], ident: int | None = None) -> list[int]:
        """``ips`` (innermost first) under the ranges open now on thread ``ident`` (default:
        the calling thread)."""
        thread = self._threads.get(_get_ident() if ident is None else ident)
        return ips if thread is None or not thread.state else place_inner(ips, thread.state)

    def engine_entries(self, ident: int, entries: list[Entry], full: list[int]) -> list[Entry]:
        """The engine's drained ``entries`` of thread ``ident``, each a whole path (``common``
        0) under the ranges open at its time (``full``: the thread's last path, which the
        entries' ``common`` prefixes continue; updated)."""
        thread = self._threads.get(ident)
        log = thread.log if thread is not None else []
        state = thread.drained if thread is not None else EMPTY
        at = 0
        out = []
        for common, ips, timer, gil, cpu, wall, when in entries:
            del full[common:]
            full.extend(ips)
            while at < len(log) and log[at][0] <= when:
                state = log[at][1]
                at += 1
            path = place(full, state, _NATIVE_OR_TASK) if state else list(full)
            out.append((0, tuple(path), timer, gil, cpu, wall, when))
        if thread is not None:
            thread.drained = state
            del log[:at]  # in place: the program's thread may be appending to it
        return out


def place(path: Sequence[int], state: State, not_python: int = 0) -> list[int]:
    """``path`` (outermost first) with each range of ``state`` after as many Python frames as
    its anchor's depth (``not_python``: the bits that mark an ip as no Python frame); a range
    deeper than the path's Python frames is left out (its frame has returned: a stale state,
    as the engine's last samples of a thread can see)."""
    out: list[int] = []
    seen = 0
    marks = iter(state)
    depth, ip = next(marks, (-1, 0))
    for frame in path:
        while 0 <= depth <= seen:
            out.append(ip)
            depth, ip = next(marks, (-1, 0))
        out.append(frame)
        if not frame & not_python:
            seen += 1
    while 0 <= depth <= seen:
        out.append(ip)
        depth, ip = next(marks, (-1, 0))
    return out


def place_inner(ips: list[int], state: State) -> list[int]:
    """As :func:`place`, for ips innermost first (:func:`~.cct.python_frame_ips`)."""
    if not state:
        return ips
    return place(ips[::-1], state)[::-1]


if TYPE_CHECKING:
    Entry = tuple[int, tuple[int, ...], int, int, int, int, int]

__all__ = ["RANGE_FILE", "Ranges", "place", "place_inner"]

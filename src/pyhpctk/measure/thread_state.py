"""What a session keeps per thread, and the clocks it reads (tests inject fakes).

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from pyhpctk.measure.cct import ThreadCCT


def thread_cpu_clock(native_id: int) -> int:
    """Linux's clock id for thread ``native_id``'s CPU time (``MAKE_THREAD_CPUCLOCK``).

    Computing it from the kernel thread id avoids ``pthread_getcpuclockid``, which reads the
    thread's descriptor and is undefined once the thread has been joined; a dead thread's
    computed clock just fails with ``EINVAL``.
    """
    return ((~native_id) << 3) | 6  # CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED


class Clocks:
    """The clocks and frame source a session reads; tests inject fakes."""

    __slots__ = ("current_frames", "epoch_ns", "thread_cpu", "wall")

    def __init__(
        self,
        thread_cpu: Callable[[int], float] = time.clock_gettime,
        wall: Callable[[], float] = time.monotonic,
        epoch_ns: Callable[[], int] = time.time_ns,
        current_frames: Callable[[], dict[int, FrameType]] = sys._current_frames,
    ) -> None:
        self.thread_cpu = thread_cpu
        self.wall = wall
        self.epoch_ns = epoch_ns
        self.current_frames = current_frames


class ThreadState:
    """What the sampler keeps for one thread (a plain slotted class: it is made per thread)."""

    __slots__ = (
        "cct",
        "clock_id",
        "comm",
        "ident",
        "idle",
        "is_stream",
        "last_cpu",
        "last_frame_ips",
        "last_ips",
        "last_path_leaf",
        "last_wall",
        "native_id",
        "number",
        "path_nodes",
        "stem",
        "thread",
        "trace_nodes",
        "trace_times",
        "written",
    )

    def __init__(
        self,
        number: int,
        ident: int,
        thread: threading.Thread | None,
        cct: ThreadCCT,
        clock_id: int | None,
        last_cpu: float,
        last_wall: float,
        is_stream: bool = False,
    ) -> None:
        self.number = number
        self.ident = ident
        self.thread = thread
        self.cct = cct
        self.clock_id = clock_id
        self.last_cpu = last_cpu
        self.last_wall = last_wall
        self.is_stream = is_stream
        self.trace_times: array[int] = array("Q")
        self.trace_nodes: array[int] = array("L")
        self.idle = False
        self.stem = ""
        self.last_ips: list[int] = []  # the last sampled path and its leaf (a fast path)
        self.last_frame_ips: list[int] = []  # its Python frames alone (pyrun --ranges)
        self.last_path_leaf = cct.fence
        self.native_id: int | None = None  # the kernel thread id, once the engine sampled it
        self.path_nodes: list[int] = []  # the engine: the nodes of the last path, outermost first
        self.comm = ""  # the kernel's name of a thread without a threading.Thread (thread_names)
        # The sequence number of the encoding last written (ProfileWriter): a checkpoint's
        # older encoding, written late, must not replace the thread's final files.
        self.written = 0

    def go_idle(self, now_ns: int) -> None:
        """The thread takes no sample for now: a traced thread's trace says so once, with a
        ``NoActvty`` record at ``now_ns`` (hpcrun's idle placeholder)."""
        cct = self.cct
        if not self.idle and cct.no_activity >= 0:
            cct.retain(cct.no_activity)
            self.trace_times.append(now_ns)
            self.trace_nodes.append(cct.no_activity)
        self.idle = True

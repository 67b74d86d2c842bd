"""A backward pass's switches (``Ranges.switch``, ``pyrun --ranges``): what each chain of names
made is kept per thread, and must still be what the thread's ranges and frames say: the ranges
it keeps below the chain, the frame a pass runs under (anew each pass on the calling thread).
"""

from __future__ import annotations

import _thread
import sys
import threading
from types import FrameType

from pyhpctk.measure.cct import FunctionTable
from pyhpctk.measure.ranges import Ranges


def depth_of(frame: FrameType | None) -> int:
    """How many frames from ``frame`` to the root (each a frame of the program here)."""
    count = 0
    while frame is not None:
        count, frame = count + 1, frame.f_back
    return count


def test_a_switch_on_a_thread_of_no_frames_keeps_the_ranges_below_it() -> None:
    # autograd's device thread: the pre-hook is its only frame, pyrun's own (no anchor)
    ranges = Ranges(FunctionTable(skip_prefixes=(__file__,)), timed=True)
    seen: dict[str, object] = {}
    done = threading.Event()

    def device() -> None:
        try:
            assert sys._getframe().f_back is None
            ranges.switch(("Net", "fc1"))
            seen["alone"] = ranges.current()
            ranges.restore([])
            ranges.push("step")
            ranges.switch(("Net", "fc1"), keep=1)
            seen["kept"] = ranges.current()
            ranges.switch(("Net", "fc2"), keep=1)
            ranges.switch(("Net", "fc1"), keep=1)
            seen["again"] = ranges.current()
            ranges.switch(("Net", "fc1"))
            seen["dropped"] = ranges.current()
            seen["marks"] = len(ranges.thread().marks)
        finally:
            done.set()

    _thread.start_new_thread(device, ())
    assert done.wait(10)
    net, fc1, step = (ranges.ip_of(name) for name in ("Net", "fc1", "step"))
    assert seen["alone"] == ((0, net), (0, fc1))
    assert seen["kept"] == seen["again"] == ((0, step), (0, net), (0, fc1))
    assert seen["dropped"] == ((0, net), (0, fc1)) and seen["marks"] == 2


def test_each_pass_on_the_calling_thread_is_anchored_at_its_own_frame() -> None:
    ranges = Ranges(FunctionTable())  # every frame here is the program's
    net, fc1 = ranges.ip_of("Net"), ranges.ip_of("fc1")

    def backward(keep: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        ranges.switch(("Net", "fc1"), keep)
        anchor = ranges.thread().marks[-1][2]
        assert anchor is sys._getframe()
        return depth_of(anchor), ranges.current()

    def deeper(keep: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        return backward(keep)

    for run in (backward, backward, deeper, deeper, backward):  # no restore: frames move
        depth, state = run(0)
        assert state == ((depth, net), (depth, fc1))
    ranges.restore([])
    ranges.push("outer")
    outer = ranges.current()
    assert outer == ((depth_of(sys._getframe()), ranges.ip_of("outer")),)
    for run in (backward, deeper, backward):
        depth, state = run(1)
        assert state == (*outer, (depth, net), (depth, fc1))
    depth, state = backward(0)
    assert state == ((depth, net), (depth, fc1))

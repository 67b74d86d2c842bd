"""The measuring session of one process: its threads, their CCTs, and the writing of profiles.

:mod:`.session` (:class:`Session`: the threads measured, the extension points a GPU layer uses,
start and finish), :mod:`.table` (:class:`~.table.ThreadTable`, the door the samplers of
:mod:`pyhpctk.measure.sampling` use, which the session implements) and :mod:`.writing`
(:class:`~.writing.ProfileWriter`: encoding and writing a thread's files).

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

from pyhpctk.measure.session.session import SAMPLER_KIND, Session
from pyhpctk.measure.thread_state import Clocks, ThreadState, thread_cpu_clock

__all__ = ["SAMPLER_KIND", "Clocks", "Session", "ThreadState", "thread_cpu_clock"]

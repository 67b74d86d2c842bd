"""The sampler interface (types only: nothing here is imported when a program is measured).

Two samplers implement it: :class:`~.engine.EngineSampler` (a signal handler on each thread
takes the samples; each wake-up of the sampling thread *drains* them into the CCTs) and
:class:`~.python.PythonSampler` (each wake-up reads ``sys._current_frames()`` and the threads'
CPU clocks itself: the fallback). Each holds the session's
:class:`~pyhpctk.measure.session.table.ThreadTable`; :class:`~.thread.SamplingThread` drives
either.
"""

from __future__ import annotations

from typing import Protocol


class Sampler(Protocol):
    """What the sampling thread calls, whichever sampler it drives."""

    def thread_began(self) -> None:
        """On the sampling thread, before its first wake-up (leave itself out of sampling)."""
        ...

    def first_wait(self) -> float:
        """Seconds until the first wake-up."""
        ...

    def wake(self) -> None:
        """One wake-up: a sample of every thread, or a drain of the engine's samples."""
        ...

    def next_wait(self) -> float:
        """Seconds until the next wake-up, once one is over (it failed or not)."""
        ...

    def thread_ended(self) -> None:
        """On the sampling thread, as it ends."""
        ...

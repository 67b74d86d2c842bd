"""The doors between a session and its samplers (types only: nothing here is imported when a
program is measured).

:class:`ThreadTable` is what a sampler (:mod:`pyhpctk.measure.sampling`: the Python sampler,
the engine's drain) needs of the session that holds the measured threads: their states, the
tables a sample is written with, and two things it may do to a thread: register it (a thread
seen for the first time) and retire it (a thread that ended: its files written, its state
forgotten). :class:`~pyhpctk.measure.session.Session` implements it; a sampler holds one and
reaches nothing else of the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping

    from pyhpctk.measure.cct import FunctionTable, MetricKind
    from pyhpctk.measure.launch.config import MeasureOptions
    from pyhpctk.measure.ranges import Ranges
    from pyhpctk.measure.thread_state import Clocks, ThreadState


class ThreadTable(Protocol):
    """The threads one process measures, as a sampler sees them."""

    @property
    def options(self) -> MeasureOptions: ...

    @property
    def clocks(self) -> Clocks: ...

    @property
    def lock(self) -> threading.RLock:
        """Held while a CCT changes (a sample, a drain, a write)."""
        ...

    @property
    def functions(self) -> FunctionTable: ...

    @property
    def python_lm(self) -> int:
        """The load module of Python functions (the ``logical/`` file)."""
        ...

    @property
    def sampling_kind(self) -> MetricKind: ...

    @property
    def finished(self) -> bool:
        """The files were written for good: nothing more is sampled."""
        ...

    @property
    def ranges(self) -> Ranges | None:
        """The threads' open ranges (``pyrun --ranges``), or None."""
        ...

    @property
    def states(self) -> Mapping[int, ThreadState]:
        """The threads measured now, by ident (read only: register and retire change it)."""
        ...

    def add_load_module(self, path: str, flags: int = ...) -> int: ...

    def add_native_module(self, path: str) -> int:
        """The load-map id of a native module a sample reached for the first time; its
        identity (which build the file is) is taken at :meth:`identify_native_modules`."""
        ...

    def identify_native_modules(self) -> None:
        """Record which build each native module added since the last call is."""
        ...

    def register_thread(
        self,
        thread: threading.Thread | None,
        main: bool = False,
        ident: int | None = None,
        native_id: int | None = None,
        program_ns: int = -1,
        from_birth: bool = False,
    ) -> ThreadState:
        """Measure a thread from now on (see Session.register_thread)."""
        ...

    def retire(self, ident: int) -> None:
        """Thread ``ident`` ended without saying so: write its files and forget it."""
        ...

    def skipped(self, ident: int, thread: threading.Thread | None) -> bool:
        """Whether a thread the Python sampler finds is not to be measured (one of pyrun's
        own, or one that wrote its profile and is winding down)."""
        ...

    def forget_wound_down(self, alive: Mapping[int, object]) -> None:
        """Threads that wrote their profile and are gone from ``alive`` are forgotten."""
        ...

    def checkpoint(self) -> None:
        """Write every live thread's files now, measurement going on."""
        ...

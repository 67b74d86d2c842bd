"""The seam between a session and the monitors that extend it (the GPU layer), declared once.

:class:`Host` is what a :class:`~pyhpctk.measure.session.Session` offers an extension (its lock,
its CCTs, its metric table); :class:`Extension` is what the session calls on the extension it
holds in ``session.gpu``. Both sides import this module only for type checking: the session
never imports the GPU layer and the GPU layer never imports the session, so either can change
its insides (a sampling engine in C, another GPU backend) without the other noticing, as long
as these protocols hold.

Nothing here runs: importing it at run time would only cost ``typing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import threading
    from contextlib import AbstractContextManager

    from pyhpctk.measure.cct import FunctionTable, MetricKind, NodeIdAllocator, ThreadCCT
    from pyhpctk.measure.encode import ProfileIdentity
    from pyhpctk.measure.settings import RunSettings


class HostOptions(Protocol):
    """The measurement options an extension reads."""

    @property
    def output_dir(self) -> str: ...

    @property
    def trace(self) -> bool: ...

    @property
    def settings(self) -> RunSettings: ...


class Host(Protocol):
    """What a session offers an extension. Take :attr:`lock` while changing any CCT."""

    @property
    def lock(self) -> AbstractContextManager[bool]: ...

    @property
    def options(self) -> HostOptions: ...

    @property
    def ids(self) -> NodeIdAllocator: ...

    @property
    def functions(self) -> FunctionTable: ...

    @property
    def python_lm(self) -> int: ...

    @property
    def load_modules(self) -> list[tuple[int, str, int]]: ...

    @property
    def kinds(self) -> list[MetricKind]: ...

    def add_metric_kind(self, kind: MetricKind) -> MetricKind:
        """Give ``kind`` its place in every profile's metric table."""
        ...

    def add_load_module(self, path: str) -> int:
        """The load-map id of ``path``, added on first use."""
        ...

    def current_context(self, skip: int = 1) -> tuple[ThreadCCT, int]:
        """The calling thread's CCT and the node of its Python call path (``skip`` frames up)."""
        ...

    def open_stream(self, number: int) -> ThreadCCT:
        """A CCT written as its own profile with thread id ``number``."""
        ...

    def live_thread(self, ident: int) -> tuple[ThreadCCT, threading.Thread | None] | None:
        """The CCT the session keeps now for thread ``ident`` and that thread (None: none)."""
        ...

    def exclude_thread(self, ident: int) -> None:
        """Never measure thread ``ident`` (one of the extension's own threads)."""
        ...

    def stream_identity(self, number: int) -> ProfileIdentity:
        """The identity a profile numbered ``number`` (a GPU stream) is written under."""
        ...


class Extension(Protocol):
    """What the session calls on the extension it holds (``session.gpu``)."""

    def thread_ending(self, timeout: float = 10.0) -> None:
        """The calling thread is about to be written out: attribute its work first."""
        ...

    def finish(self, report: bool = True) -> object:
        """Stop, attribute everything, write the extension's own files (before the session's)."""
        ...

    def window(self, paused: bool) -> None:
        """pyrun ctl's window closed (``paused``) or opened: leave out what is issued while
        it is closed."""
        ...

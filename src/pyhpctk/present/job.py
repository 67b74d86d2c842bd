"""One run of pyview: what it was asked (:class:`PyviewOptions`), the database it opened, and the
two roles its outputs play: an :class:`Export` writes a file, a :class:`TextReport` prints to the
terminal.

The tables of exports (:mod:`.exports`) and reports (:mod:`.reports`) hold objects satisfying
these protocols; ``pyview``'s options and ``--help`` are derived from them
(:mod:`pyhpctk.cli.pyview`), and :func:`pyhpctk.present.pyview.run_pyview` runs them in table
order. Nothing here writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TextIO

from pyhpctk.present.api import Database
from pyhpctk.present.viewmodel import View


@dataclass(frozen=True, slots=True)
class PyviewOptions:
    """Everything the command line asked for."""

    database: str
    view: str = "top-down"
    metrics: tuple[str, ...] = ()
    sort: str | None = None
    derive: tuple[str, ...] = ()
    depth: int | None = None
    threshold: float = 0.0
    show_zero: bool = False
    color: bool | None = None
    tree: str | None = (
        None  # unicode, ascii, indent; None: unicode on a terminal, indent when piped
    )
    list_metrics: bool = False
    profiles: str = "all"  # which profiles --context and --imbalance compare
    # (report name, its value: None for a flag), in the order of the report table
    reports: tuple[tuple[str, int | None], ...] = ()
    exports: tuple[tuple[str, str], ...] = ()  # (export name, file; '-' is stdout)
    force: bool = False
    # percent of its parent a row holds to be expanded (None: the screen is filled best-first)
    hot_path: float | None = None
    lines: int | None = None  # text rows at most (None: the terminal's height, or 100; 0: all)
    width: int | None = None  # columns (None: the terminal's width, or no limit; 0: no limit)
    exclusive: bool = False
    show_internal: bool = False
    full: bool = False
    ranges: bool = False  # the tree folded to pyrun --ranges' ranges


@dataclass(slots=True)
class Job:
    """A database opened for one run, with the metrics asked for and the view built once."""

    db: Database
    options: PyviewOptions
    metrics: list[str] | None  # None: the database's default selection
    built: View | None = field(default=None, repr=False)

    def view(self) -> View:
        """The view the options ask for, built on first use and shared by every output."""
        if self.built is None:
            opts = self.options
            self.built = self.db.view(
                opts.view,
                self.metrics,
                opts.sort,
                opts.depth,
                opts.threshold,
                opts.show_zero,
                exclusive=opts.exclusive,
                show_internal=opts.show_internal or opts.full,
                hot_share=(50.0 if opts.hot_path is None else opts.hot_path) / 100.0,
                ranges=opts.ranges,
            )
        return self.built

    def hottest(self, count: int = 3) -> list[tuple[str, float]]:
        """The ``count`` functions that cost most themselves, wherever they are called from,
        with their share (percent) of the sort metric's total: the bottom-up view's first
        functions (``pyview --bottom-up -E``), for a top-down screen whose tree cannot show a
        function spread over many callers (issue #36 item 1)."""
        opts = self.options
        view = self.db.view(
            "bottom-up",
            self.metrics,
            opts.sort,
            exclusive=True,
            show_internal=opts.show_internal,
        )
        sort = view.columns[view.sort_column]
        inclusive = next(
            (i for i, c in enumerate(view.columns) if c.metric == sort.metric and c.inclusive),
            view.sort_column,
        )
        total = float(view.root.values[inclusive])
        ranked = sorted(view.root.children, key=lambda node: -float(node.values[view.sort_column]))
        return [
            (node.label.split(" (", 1)[0], 100.0 * float(node.values[view.sort_column]) / total)
            for node in ranked[:count]
            if total > 0 and float(node.values[view.sort_column]) > 0
        ]


class Export(Protocol):
    """A file pyview writes: ``pyview --NAME FILE`` (``-`` is stdout)."""

    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...

    def write(self, job: Job, stream: TextIO) -> None:
        """Write the export to ``stream`` (the caller makes the file appear whole or not)."""
        ...


class TextReport(Protocol):
    """A report pyview prints to the terminal: ``pyview --NAME``, or ``--NAME VALUE`` with an
    integer when :attr:`metavar` is set."""

    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...

    @property
    def metavar(self) -> str | None:
        """The value's name in ``--help``; None: a flag, no value."""
        ...

    @property
    def minimum(self) -> int | None:
        """The smallest value allowed, if any."""
        ...

    def write(self, job: Job, value: int | None, out: TextIO) -> None: ...

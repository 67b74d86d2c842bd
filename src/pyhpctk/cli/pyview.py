"""``pyview``: show a database in the terminal, export views, traces and an HTML report.

A thin click command over :mod:`pyhpctk.present.pyview`; see ``docs/pyview.md``. The view
options come from the view table (:data:`pyhpctk.present.views.VIEWS`), the report and export
options from theirs (:data:`pyhpctk.present.reports.REPORTS`,
:data:`pyhpctk.present.exports.EXPORTS`). Text goes to stdout
with colours and tree glyphs when stdout is a terminal, plain text when it is piped.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import Any, TextIO

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.errors import UsageError
from pyhpctk.present.exports import EXPORTS
from pyhpctk.present.pyview import PyviewOptions, run_pyview
from pyhpctk.present.reports import REPORTS
from pyhpctk.present.views import VIEWS

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _dest(kind: str, name: str) -> str:
    """The keyword a table's option reaches :func:`pyview` under (``export_trace_export``)."""
    return f"{kind}_{name.replace('-', '_')}"


def _table_options(*groups: list[Decorator]) -> Decorator:
    """One decorator adding the options of several tables, in the order given."""

    def add(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed([o for group in groups for o in group]):
            command = option(command)
        return command

    return add


def _view_options() -> list[Decorator]:
    return [
        click.option(f"--{view.name}", _dest("view", view.name), is_flag=True, help=view.help)
        for view in VIEWS
    ]


def _report_options() -> list[Decorator]:
    options: list[Decorator] = []
    for report in REPORTS:
        dest = _dest("report", report.name)
        if report.metavar is None:
            options.append(click.option(f"--{report.name}", dest, is_flag=True, help=report.help))
        else:
            kind = int if report.minimum is None else click.IntRange(min=report.minimum)
            options.append(
                click.option(
                    f"--{report.name}", dest, type=kind, metavar=report.metavar, help=report.help
                )
            )
    return options


def _export_options() -> list[Decorator]:
    return [
        click.option(f"--{e.name}", _dest("export", e.name), metavar="FILE", help=e.help)
        for e in EXPORTS
    ]


_FORCE_HELP = (
    f"Replace existing {', '.join(f'--{e.name}' for e in EXPORTS[:-1])} or --{EXPORTS[-1].name} "
    "files (refused without it)."
)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pyview")
@click.argument("database", type=click.Path())
@_table_options(_view_options())
@click.option(
    "-m",
    "--metric",
    "metrics",
    multiple=True,
    metavar="NAME",
    help="Metric to show (name, name without unit, or glob pattern); repeatable.",
)
@click.option("-s", "--sort", metavar="NAME", help="Sort by this metric's inclusive value.")
@click.option(
    "--derive",
    multiple=True,
    metavar="'NAME = FORMULA'",
    help="Add a derived metric, e.g. 'util = gker / gpuop'; repeatable.",
)
@click.option(
    "-d",
    "--depth",
    type=click.IntRange(min=0),
    metavar="N",
    help="Expand every scope down to N levels instead of the hot path alone (the hot path is "
    "always expanded).",
)
@click.option(
    "-t",
    "--threshold",
    type=click.FloatRange(0, 100),
    default=0.0,
    show_default=True,
    metavar="PCT",
    help="Hide scopes below PCT percent of the total.",
)
@click.option("--show-zero", is_flag=True, help="Also show scopes whose values are all zero.")
@click.option(
    "--hot-path",
    type=click.FloatRange(0, 100),
    metavar="PCT",
    help="Show hpcviewer's hot path instead: expand a scope while it holds at least PCT percent "
    "of its parent (0 expands every scope). By default the screen is filled with the costliest "
    "calls first, pass-through chains folded into one row.",
)
@click.option(
    "--lines",
    type=click.IntRange(min=0),
    metavar="N",
    help="Show at most N rows, the largest; '… N more rows' says what was left out "
    "(default: the terminal's height, 100 when not a terminal; 0: no limit). --html: the "
    "tables open at first what fits in N lines (default 40), the rest as '… N smaller rows'.",
)
@click.option(
    "--width",
    type=click.IntRange(min=0),
    metavar="N",
    help="Cut rows to N columns (default: the terminal's width; no limit when not a "
    "terminal; 0: no limit).",
)
@click.option(
    "-E",
    "--exclusive",
    is_flag=True,
    help="Order rows by the sort metric's exclusive value (self cost) instead of inclusive.",
)
@click.option(
    "--show-internal",
    is_flag=True,
    help="Show the interpreter's frames (import system, runpy, site); by default they are "
    "left out and their cost is shown in their callers.",
)
@click.option(
    "--ranges",
    is_flag=True,
    help="Fold the tree to the ranges pyrun --ranges measured (PyTorch modules, "
    "record_function and NVTX ranges): each range's exclusive cost is its own frames' and "
    "kernels', a thread's the cost outside any range.",
)
@click.option(
    "--full",
    is_flag=True,
    help="The whole view: every scope expanded, functions and their lines as rows of their "
    "own, no chain folded, no row or width limit, interpreter frames shown (pyview's output "
    "before these defaults).",
)
@click.option("--color/--no-color", default=None, help="Colours (default: when a terminal).")
@click.option(
    "--tree",
    "tree",
    type=click.Choice(["unicode", "ascii", "indent"]),
    help="Tree drawing (default: unicode on a terminal, indentation when piped).",
)
@click.option("--list-metrics", is_flag=True, help="List the metrics and exit.")
@click.option(
    "--profiles",
    type=click.Choice(["all", "cpu", "gpu"]),
    default="all",
    show_default=True,
    help="Which profiles --context/--imbalance compare.",
)
@_table_options(_report_options(), _export_options())
@click.option("--force", is_flag=True, help=_FORCE_HELP)
def pyview(
    database: str,
    metrics: tuple[str, ...],
    sort: str | None,
    derive: tuple[str, ...],
    depth: int | None,
    threshold: float,
    show_zero: bool,
    hot_path: float | None,
    lines: int | None,
    width: int | None,
    exclusive: bool,
    show_internal: bool,
    ranges: bool,
    full: bool,
    color: bool | None,
    tree: str | None,
    list_metrics: bool,
    profiles: str,
    force: bool,
    **tables: Any,
) -> int:
    """Show the performance database DATABASE (a pyprof / hpcprof output directory).

    \b
    The text views show one row per call (the function and the line it was called from),
    chains of frames that pass all their time on folded into one row ('a → … → b (5 frames
    folded)'), the costliest first within --lines rows ('... N more rows' says what was cut;
    the bottom-up view: the functions that cost most themselves first), cut to the terminal's
    width, without the interpreter's import-system, runpy and site frames (--show-internal).
    --hot-path PCT shows hpcviewer's hot path instead; --full prints every row of the view.

    \b
    Exports (the options taking a FILE below; '-' is stdout) never replace an
    existing file unless --force is given. Each file is written under a temporary name and
    renamed when complete: on a full disk pyview says so, exits with status 2 and leaves no
    partial file (an existing one stays as it was).
    """
    views = [view.name for view in VIEWS if tables[_dest("view", view.name)]]
    if len(views) > 1:
        raise UsageError(f"--{' and --'.join(views)} contradict each other: choose one view")
    reports: list[tuple[str, int | None]] = []
    for report in REPORTS:
        value = tables[_dest("report", report.name)]
        if report.metavar is None and value:
            reports.append((report.name, None))
        elif report.metavar is not None and value is not None:
            reports.append((report.name, int(value)))
    exports = [
        (e.name, str(tables[_dest("export", e.name)]))
        for e in EXPORTS
        if tables[_dest("export", e.name)]
    ]
    opts = PyviewOptions(
        database,
        views[0] if views else VIEWS[0].name,
        metrics,
        sort,
        derive,
        depth,
        threshold,
        show_zero,
        color,
        tree,
        list_metrics,
        profiles,
        tuple(reports),
        tuple(exports),
        force,
        hot_path,
        lines,
        width,
        exclusive,
        show_internal,
        full,
        ranges,
    )
    return run_pyview(opts, _names_as_bytes(sys.stdout))


def _names_as_bytes(stream: TextIO) -> TextIO:
    """``stream``, printing names that came from bytes which are not UTF-8 (a path in a Latin-1
    directory, read with surrogateescape) as those bytes, as ``ls`` does, not a traceback."""
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="surrogateescape")
    return stream


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``pyview DATABASE [options]``."""
    return run_command(pyview, argv, "pyview")


if __name__ == "__main__":
    raise SystemExit(main())

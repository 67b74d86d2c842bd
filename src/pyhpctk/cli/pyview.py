"""``pyview``: show a database in the terminal, export views, traces and an HTML report.

A thin click command over :mod:`pyhpctk.present`; see ``docs/pyview.md``. Text goes to stdout
with colours and tree glyphs when stdout is a terminal, plain text when it is piped.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.errors import UsageError
from pyhpctk.formats import output
from pyhpctk.present import imbalance, overlap, traces, waits
from pyhpctk.present.api import Database, open_database
from pyhpctk.present.fit import fit_view
from pyhpctk.present.render import TextStyle, format_value, render_csv, render_json, render_text
from pyhpctk.present.views import View


@dataclass(frozen=True, slots=True)
class PyviewOptions:
    """Everything the command line asked for."""

    database: str
    view: str
    metrics: tuple[str, ...]
    sort: str | None
    derive: tuple[str, ...]
    depth: int | None
    threshold: float
    show_zero: bool
    color: bool | None
    tree: str | None  # unicode, ascii, indent; None: unicode on a terminal, indent when piped
    csv: str | None
    json: str | None
    list_metrics: bool
    context: int | None
    imbalance: int | None
    profiles: str
    trace_summary: bool
    trace_export: str | None
    blame: bool
    html: str | None
    force: bool = False
    hot_path: float = 50.0  # percent of its parent a row holds to be expanded
    lines: int | None = None  # text rows at most (None: the terminal's height, or 100; 0: all)
    width: int | None = None  # columns (None: the terminal's width, or no limit; 0: no limit)
    exclusive: bool = False
    show_internal: bool = False
    full: bool = False
    overlap: bool = False  # issue #22: compute against communication per rank and stream

    def exports(self) -> list[tuple[str, str]]:
        """(option, file) of every export asked for, in the order they are written."""
        given = (
            ("--trace-export", self.trace_export),
            ("--html", self.html),
            ("--csv", self.csv),
            ("--json", self.json),
        )
        return [(option, dest) for option, dest in given if dest]


def _write(dest: str, option: str, force: bool, writer: Callable[[TextIO], None]) -> None:
    """Write one export: ``-`` is stdout; a file appears whole or not at all
    (:mod:`pyhpctk.formats.output`: a temporary name, renamed when complete)."""
    if dest == "-":
        writer(sys.stdout)
        return
    with output.open_text(dest, force, option) as stream:
        writer(stream)


def _print_spread(db: Database, spread: imbalance.ContextSpread, out: TextIO) -> None:
    s = spread.stats
    out.write(f"{spread.metric} at context {spread.ctx_id}: {imbalance.short_path(spread.path)}\n")
    out.write(
        f"  {s.count} profiles: min {s.minimum:.4g}  mean {s.mean:.4g}  max {s.maximum:.4g}  "
        f"stddev {s.stddev:.4g}  cv {s.cv:.3f}  imbalance {100 * s.imbalance:.1f}%\n"
    )
    for prof, value in zip(spread.profiles, spread.values.tolist(), strict=True):
        out.write(f"  {format_value(value, s.total):>18}  {db.experiment.profile_title(prof)}\n")


def _print_imbalance(spreads: list[imbalance.ContextSpread], metric: str, out: TextIO) -> None:
    out.write(f"Most imbalanced contexts for {metric} (max/mean - 1, over profiles)\n")
    out.write("  imbalance      cv        mean         max  context\n")
    for sp in spreads:
        s = sp.stats
        out.write(
            f"  {100 * s.imbalance:8.1f}%  {s.cv:6.3f}  {s.mean:10.4g}  {s.maximum:10.4g}  "
            f"{sp.label} [ctx {sp.ctx_id}]\n"
        )
    if not spreads:
        out.write("  (needs at least two profiles with values)\n")


def run_pyview(opts: PyviewOptions, out: TextIO) -> int:
    """Do what the options ask; the library behind the click command."""
    seen: dict[str, str] = {}
    for option, dest in opts.exports():
        if dest != "-" and dest in seen:
            raise UsageError(f"{seen[dest]} and {option} both write {dest}: choose two files")
        seen[dest] = option
        if dest != "-":  # refuse before any work rather than after the first export
            output.check_new(dest, opts.force, option)
    db = open_database(opts.database)
    for definition in opts.derive:
        db.derive(definition)
    if opts.list_metrics:
        for metric in db.catalog.metrics:
            tag = " (derived)" if metric.derived else ""
            desc = f"  - {metric.description}" if metric.description else ""
            out.write(f"{metric.name}{tag}{desc}\n")
        return 0
    derived = [db.catalog.resolve(d.partition("=")[0].strip()) for d in opts.derive]
    metrics = list(opts.metrics) or None
    if metrics is None and derived:
        metrics = [*db.catalog.default_selection(), *derived]
    chosen = imbalance.select_profiles(db.experiment, opts.profiles)
    if not chosen and (opts.context is not None or opts.imbalance is not None):
        raise UsageError(f"--profiles {opts.profiles}: {opts.database} has no such profiles")
    did_something = False
    if opts.context is not None:
        ctx = opts.context
        if db.experiment.tree.node_of(ctx) < 0 and not 0 <= ctx < db.experiment.values.n_contexts:
            raise UsageError(f"--context {ctx}: no such context in {opts.database}")
        names = db.catalog.select(metrics) if metrics else db.catalog.default_selection(1)
        for name in names:
            spread = imbalance.spread(db.catalog, opts.context, name, True, chosen)
            _print_spread(db, spread, out)
        did_something = True
    if opts.imbalance is not None:
        name = (
            db.catalog.resolve(opts.sort)
            if opts.sort
            else (db.catalog.select(metrics)[0] if metrics else db.catalog.default_selection(1)[0])
        )
        found = imbalance.most_imbalanced(db.catalog, name, opts.imbalance, profiles=chosen)
        _print_imbalance(found, name, out)
        did_something = True
    if opts.trace_summary:
        traces.render_summary(traces.summarize(db.experiment), out)
        did_something = True
    if opts.blame:
        traces.render_blame(traces.gpu_idle_blame(db.experiment), out)
        across = waits.collective_waits(db.experiment)
        if across.instances:  # several ranks ran collectives: who made whom wait
            waits.render_waits(across, out)
        did_something = True
    if opts.overlap:
        overlap.render_overlap(overlap.overlap_report(db.experiment), out)
        did_something = True
    if opts.trace_export:
        _write(
            opts.trace_export,
            "--trace-export",
            opts.force,
            lambda f: traces.write_perfetto(db.experiment, f),
        )
        did_something = True
    view: View | None = None

    def get_view() -> View:
        nonlocal view
        if view is None:
            view = db.view(
                opts.view,
                metrics,
                opts.sort,
                opts.depth,
                opts.threshold,
                opts.show_zero,
                exclusive=opts.exclusive,
                show_internal=opts.show_internal or opts.full,
                hot_share=opts.hot_path / 100.0,
            )
        return view

    if opts.html:
        from pyhpctk.present.html import report_views, write_html

        report = report_views(
            db,
            metrics,
            opts.sort,
            opts.depth,
            opts.threshold,
            opts.show_zero,
            show_internal=opts.show_internal or opts.full,
        )
        _write(opts.html, "--html", opts.force, lambda f: write_html(db, report, f))
        did_something = True
    if opts.csv:
        _write(opts.csv, "--csv", opts.force, lambda f: render_csv(get_view(), f))
        did_something = True
    if opts.json:
        _write(opts.json, "--json", opts.force, lambda f: render_json(get_view(), f))
        did_something = True
    if not did_something:
        color = opts.color if opts.color is not None else out.isatty()
        terminal = out.isatty()
        tree = opts.tree if opts.tree is not None else ("unicode" if terminal else "indent")
        size = shutil.get_terminal_size((0, 0)) if terminal else None
        width, budget = screen(opts, size)
        # -d N asks for every row to that depth (the hot path beyond), --full for every row.
        expand_all = opts.full or opts.depth is not None
        fitted = fit_view(get_view(), None if expand_all else opts.hot_path / 100.0, budget)
        render_text(fitted.view, out, TextStyle(color=color, tree=tree, width=width), fitted.cut)
    return 0


#: Text rows (below the title and header) when stdout is not a terminal.
PIPED_LINES = 100


def screen(opts: PyviewOptions, size: os.terminal_size | None) -> tuple[int | None, int | None]:
    """(width, row budget) of the text output: what the options ask, else the terminal's size
    (``size``; None when stdout is not a terminal: no width limit and :data:`PIPED_LINES`
    rows). ``--full`` and 0 mean no limit."""
    if opts.full:
        return None, None
    width = opts.width
    if width is None and size is not None and size.columns > 0:
        width = size.columns
    budget = opts.lines
    if budget is None:
        terminal = size is not None and size.lines > 0
        # Title, header, a note and the "more rows" line, and the shell's prompt after them.
        budget = max(size.lines - 5, 20) if size is not None and terminal else PIPED_LINES
    return (width or None), (budget or None)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pyview")
@click.argument("database", type=click.Path())
@click.option("--top-down", is_flag=True, help="Calling context tree (default).")
@click.option(
    "--bottom-up", is_flag=True, help="Callers view: each function's cost split over its callers."
)
@click.option(
    "--flat", is_flag=True, help="Flat view: load module > file > function > loop > line."
)
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
    default=50.0,
    show_default=True,
    metavar="PCT",
    help="Expand a scope while it holds at least PCT percent of its parent (hpcviewer's hot "
    "path); 0 expands every scope.",
)
@click.option(
    "--lines",
    type=click.IntRange(min=0),
    metavar="N",
    help="Show at most N rows, the largest; '… N more rows' says what was left out "
    "(default: the terminal's height, 100 when not a terminal; 0: no limit).",
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
    "--full",
    is_flag=True,
    help="The whole view: every scope expanded, no row or width limit, interpreter frames "
    "shown (pyview's output before these defaults).",
)
@click.option("--color/--no-color", default=None, help="Colours (default: when a terminal).")
@click.option(
    "--tree",
    "tree",
    type=click.Choice(["unicode", "ascii", "indent"]),
    help="Tree drawing (default: unicode on a terminal, indentation when piped).",
)
@click.option("--csv", metavar="FILE", help="Write the view as CSV ('-': stdout).")
@click.option("--json", "json_out", metavar="FILE", help="Write the view as JSON ('-': stdout).")
@click.option("--list-metrics", is_flag=True, help="List the metrics and exit.")
@click.option(
    "--context",
    "context",
    type=int,
    metavar="CTXID",
    help="Per-thread values of the shown metrics at context CTXID.",
)
@click.option(
    "--imbalance",
    type=click.IntRange(min=1),
    metavar="N",
    help="List the N most imbalanced contexts across threads/ranks.",
)
@click.option(
    "--profiles",
    type=click.Choice(["all", "cpu", "gpu"]),
    default="all",
    show_default=True,
    help="Which profiles --context/--imbalance compare.",
)
@click.option("--trace-summary", is_flag=True, help="Summarize each trace line.")
@click.option(
    "--trace-export", metavar="FILE", help="Write the traces as Perfetto / Chrome trace JSON."
)
@click.option(
    "--blame",
    is_flag=True,
    help="GPU idleness blame over the traces; with several ranks, also which rank's work made "
    "the others wait in collectives.",
)
@click.option(
    "--overlap",
    "overlap_report",
    is_flag=True,
    help="Per rank and GPU stream: time in compute, communication (NCCL), both at once, "
    "copies and idle, from the traces.",
)
@click.option("--html", metavar="FILE", help="Write a self-contained HTML report.")
@click.option(
    "--force",
    is_flag=True,
    help="Replace existing --csv/--json/--html/--trace-export files (refused without it).",
)
def pyview(
    database: str,
    top_down: bool,
    bottom_up: bool,
    flat: bool,
    metrics: tuple[str, ...],
    sort: str | None,
    derive: tuple[str, ...],
    depth: int | None,
    threshold: float,
    show_zero: bool,
    hot_path: float,
    lines: int | None,
    width: int | None,
    exclusive: bool,
    show_internal: bool,
    full: bool,
    color: bool | None,
    tree: str | None,
    csv: str | None,
    json_out: str | None,
    list_metrics: bool,
    context: int | None,
    imbalance: int | None,
    profiles: str,
    trace_summary: bool,
    trace_export: str | None,
    blame: bool,
    overlap_report: bool,
    html: str | None,
    force: bool,
) -> int:
    """Show the performance database DATABASE (a pyprof / hpcprof output directory).

    \b
    The text views show the hot path (rows holding at least --hot-path percent of their
    parent are expanded, the others folded beside them), at most --lines rows (the largest;
    '... N more rows' says what was cut), cut to the terminal's width, without the
    interpreter's import-system, runpy and site frames (--show-internal). --full prints every
    row of the view.

    \b
    Exports (--csv, --json, --html, --trace-export FILE; '-' is stdout) never replace an
    existing file unless --force is given. Each file is written under a temporary name and
    renamed when complete: on a full disk pyview says so, exits with status 2 and leaves no
    partial file (an existing one stays as it was).
    """
    views = [
        name
        for name, given in (("top-down", top_down), ("bottom-up", bottom_up), ("flat", flat))
        if given
    ]
    if len(views) > 1:
        raise UsageError(f"--{' and --'.join(views)} contradict each other: choose one view")
    view = views[0] if views else "top-down"
    opts = PyviewOptions(
        database,
        view,
        metrics,
        sort,
        derive,
        depth,
        threshold,
        show_zero,
        color,
        tree,
        csv,
        json_out,
        list_metrics,
        context,
        imbalance,
        profiles,
        trace_summary,
        trace_export,
        blame,
        html,
        force,
        hot_path,
        lines,
        width,
        exclusive,
        show_internal,
        full,
        overlap=overlap_report,
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

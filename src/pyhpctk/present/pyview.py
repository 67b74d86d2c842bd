"""The library behind the ``pyview`` command: run what :class:`~pyhpctk.present.job.PyviewOptions`
asks, in one place, so that everything the command does can be driven from Python.

Reports (:data:`pyhpctk.present.reports.REPORTS`) print first, then exports
(:data:`pyhpctk.present.exports.EXPORTS`) are written, each in its table's order; a run that asked
for neither prints the text view, fitted to the screen (:mod:`pyhpctk.present.fit`).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TextIO

from pyhpctk.errors import UsageError
from pyhpctk.formats import output
from pyhpctk.present.api import Database, open_database
from pyhpctk.present.condense import condense
from pyhpctk.present.exports import EXPORTS
from pyhpctk.present.fit import fit_view
from pyhpctk.present.job import Export, Job, PyviewOptions
from pyhpctk.present.render import TextStyle, render_text
from pyhpctk.present.reports import REPORTS

#: Text rows (below the title and header) when stdout is not a terminal.
PIPED_LINES = 100


def check_outputs(opts: PyviewOptions) -> None:
    """Refuse, before any work, an output no table holds, two exports that name one file, or a
    file that exists without ``--force``."""
    unknown = {name for name, _ in opts.reports} - {r.name for r in REPORTS}
    unknown |= {name for name, _ in opts.exports} - {e.name for e in EXPORTS}
    if unknown:
        raise UsageError(f"no such report or export: {', '.join(sorted(unknown))}")
    seen: dict[str, str] = {}
    for name, dest in opts.exports:
        option = f"--{name}"
        if dest != "-" and dest in seen:
            raise UsageError(f"{seen[dest]} and {option} both write {dest}: choose two files")
        seen[dest] = option
        if dest != "-":
            output.check_new(dest, opts.force, option)


def write_export(job: Job, chosen: Export, dest: str) -> None:
    """Write one export: ``-`` is stdout; a file appears whole or not at all
    (:mod:`pyhpctk.formats.output`: a temporary name, renamed when complete)."""
    if dest == "-":
        chosen.write(job, sys.stdout)
        return
    with output.open_text(dest, job.options.force, f"--{chosen.name}") as stream:
        chosen.write(job, stream)


def list_metrics(db: Database, out: TextIO) -> None:
    for metric in db.catalog.metrics:
        tag = " (derived)" if metric.derived else ""
        desc = f"  - {metric.description}" if metric.description else ""
        out.write(f"{metric.name}{tag}{desc}\n")


def run_pyview(opts: PyviewOptions, out: TextIO) -> int:
    """Do what the options ask; the library behind the click command."""
    check_outputs(opts)
    db = open_database(opts.database)
    for definition in opts.derive:
        db.derive(definition)
    if opts.list_metrics:
        list_metrics(db, out)
        return 0
    derived = [db.catalog.resolve(d.partition("=")[0].strip()) for d in opts.derive]
    metrics = list(opts.metrics) or None
    if metrics is None and derived:
        metrics = [*db.catalog.default_selection(), *derived]
    job = Job(db, opts, metrics)
    asked = dict(opts.reports)
    for chosen in REPORTS:
        if chosen.name in asked:
            chosen.write(job, asked[chosen.name], out)
    files = dict(opts.exports)
    for each in EXPORTS:
        if each.name in files:
            write_export(job, each, files[each.name])
    if not opts.reports and not opts.exports:
        print_view(job, out)
    return 0


def print_view(job: Job, out: TextIO) -> None:
    """The text view: the hot path, within the terminal's rows and columns."""
    opts = job.options
    color = opts.color if opts.color is not None else out.isatty()
    terminal = out.isatty()
    tree = opts.tree if opts.tree is not None else ("unicode" if terminal else "indent")
    size = shutil.get_terminal_size((0, 0)) if terminal else None
    width, budget = screen(opts, size)
    # --full: every row as built; --hot-path PCT: hpcviewer's hot path alone; otherwise the
    # condensed view (calls, pass-through chains folded), filled best-first to the budget.
    view = job.view() if opts.full else condense(job.view())
    hot = None if opts.full or opts.hot_path is None else opts.hot_path / 100.0
    fitted = fit_view(view, hot, budget)
    footer: list[str] = []
    if fitted.cut and view.kind == "top-down" and job.options.hot_path is None:
        # A function spread over many callers has no row of its own that the budget keeps:
        # one line names those that cost most themselves (issue #36 item 1).
        hottest = " · ".join(f"{name} {share:.1f}%" for name, share in job.hottest())
        if hottest:
            footer.append(f"hottest self: {hottest} (--bottom-up -E: where from)")
    style = TextStyle(color=color, tree=tree, width=width)
    render_text(fitted.view, out, style, fitted.cut, footer)


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
        # Title, header, a note, the "more rows" and "hottest self" lines, and the shell's
        # prompt after them.
        budget = max(size.lines - 6, 20) if size is not None and terminal else PIPED_LINES
    return (width or None), (budget or None)


__all__ = ["PIPED_LINES", "PyviewOptions", "run_pyview", "screen"]

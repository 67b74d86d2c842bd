"""The export table: every file ``pyview`` writes, in the order it writes them.

Each export satisfies :class:`pyhpctk.present.job.Export`; ``pyview --NAME FILE`` and its help,
the check that two exports do not name one file, and ``--force``'s help come from
:data:`EXPORTS`. Adding an export is one new module and one line here.
"""

from __future__ import annotations

from typing import TextIO

from pyhpctk.present import traces
from pyhpctk.present.job import Export, Job
from pyhpctk.present.render import render_csv, render_json


class PerfettoExport:
    name = "trace-export"
    help = "Write the traces as Perfetto / Chrome trace JSON."

    def write(self, job: Job, stream: TextIO) -> None:
        traces.write_perfetto(job.db.experiment, stream)


class HtmlExport:
    name = "html"
    help = "Write a self-contained HTML report."

    def write(self, job: Job, stream: TextIO) -> None:
        # The report's module is imported only when a report is asked for.
        from pyhpctk.present.html import HTML_LINES, report_views, write_html

        opts = job.options
        # What the text screen shows in --lines rows is open at first (--full, --lines 0: the
        # hot path, every row under it).
        lines = None if opts.full or opts.lines == 0 else opts.lines or HTML_LINES
        report = report_views(
            job.db,
            job.metrics,
            opts.sort,
            opts.depth,
            opts.threshold,
            opts.show_zero,
            show_internal=opts.show_internal or opts.full,
            condensed=not opts.full,
        )
        write_html(job.db, report, stream, lines)


class CsvExport:
    name = "csv"
    help = "Write the view as CSV ('-': stdout)."

    def write(self, job: Job, stream: TextIO) -> None:
        render_csv(job.view(), stream)


class JsonExport:
    name = "json"
    help = "Write the view as JSON ('-': stdout)."

    def write(self, job: Job, stream: TextIO) -> None:
        render_json(job.view(), stream)


#: Every export, in the order a run writes them.
EXPORTS: tuple[Export, ...] = (PerfettoExport(), HtmlExport(), CsvExport(), JsonExport())

"""The report table: every report ``pyview`` prints to the terminal, in the order it prints them.

Each report satisfies :class:`pyhpctk.present.job.TextReport`; ``pyview --NAME`` (or ``--NAME N``)
and its help come from :data:`REPORTS`. A run asked for reports or exports prints those instead
of the text view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from pyhpctk.errors import UsageError
from pyhpctk.present import imbalance, overlap, traces, waits, warps
from pyhpctk.present.api import Database
from pyhpctk.present.job import Job, TextReport
from pyhpctk.present.model import Profile
from pyhpctk.present.render import format_value


def chosen_profiles(job: Job) -> Sequence[Profile]:
    """The profiles ``--profiles`` names; a usage error when the database has none of them."""
    opts = job.options
    chosen = imbalance.select_profiles(job.db.experiment, opts.profiles)
    if not chosen:
        raise UsageError(f"--profiles {opts.profiles}: {opts.database} has no such profiles")
    return chosen


def print_spread(db: Database, spread: imbalance.ContextSpread, out: TextIO) -> None:
    s = spread.stats
    out.write(f"{spread.metric} at context {spread.ctx_id}: {imbalance.short_path(spread.path)}\n")
    out.write(
        f"  {s.count} profiles: min {s.minimum:.4g}  mean {s.mean:.4g}  max {s.maximum:.4g}  "
        f"stddev {s.stddev:.4g}  cv {s.cv:.3f}  imbalance {100 * s.imbalance:.1f}%\n"
    )
    for prof, value in zip(spread.profiles, spread.values.tolist(), strict=True):
        out.write(f"  {format_value(value, s.total):>18}  {db.experiment.profile_title(prof)}\n")


def print_imbalance(spreads: list[imbalance.ContextSpread], metric: str, out: TextIO) -> None:
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


class ContextReport:
    name = "context"
    help = "Per-thread values of the shown metrics at context CTXID."
    metavar = "CTXID"
    minimum = None

    def write(self, job: Job, value: int | None, out: TextIO) -> None:
        assert value is not None
        db, metrics = job.db, job.metrics
        chosen = chosen_profiles(job)
        if (
            db.experiment.tree.node_of(value) < 0
            and not 0 <= value < db.experiment.values.n_contexts
        ):
            raise UsageError(f"--context {value}: no such context in {job.options.database}")
        names = db.catalog.select(metrics) if metrics else db.catalog.default_selection(1)
        for name in names:
            print_spread(db, imbalance.spread(db.catalog, value, name, True, chosen), out)


class ImbalanceReport:
    name = "imbalance"
    help = "List the N most imbalanced contexts across threads/ranks."
    metavar = "N"
    minimum = 1

    def write(self, job: Job, value: int | None, out: TextIO) -> None:
        assert value is not None
        db, metrics, sort = job.db, job.metrics, job.options.sort
        chosen = chosen_profiles(job)
        name = (
            db.catalog.resolve(sort)
            if sort
            else (db.catalog.select(metrics)[0] if metrics else db.catalog.default_selection(1)[0])
        )
        found = imbalance.most_imbalanced(db.catalog, name, value, profiles=chosen)
        print_imbalance(found, name, out)


class TraceSummaryReport:
    name = "trace-summary"
    help = "Summarize each trace line."
    metavar = None
    minimum = None

    def write(self, job: Job, value: int | None, out: TextIO) -> None:
        traces.render_summary(traces.summarize(job.db.experiment), out)


class BlameReport:
    name = "blame"
    help = (
        "GPU idleness blame over the traces; with several ranks, also which rank's work made "
        "the others wait in collectives."
    )
    metavar = None
    minimum = None

    def write(self, job: Job, value: int | None, out: TextIO) -> None:
        traces.render_blame(traces.gpu_idle_blame(job.db.experiment), out)
        across = waits.collective_waits(job.db.experiment)
        if across.instances:  # several ranks ran collectives: who made whom wait
            waits.render_waits(across, out)


class OverlapReport:
    name = "overlap"
    help = (
        "Per rank and GPU stream: time in compute, communication (NCCL), both at once, "
        "copies and idle, from the traces."
    )
    metavar = None
    minimum = None

    def write(self, job: Job, value: int | None, out: TextIO) -> None:
        overlap.render_overlap(overlap.overlap_report(job.db.experiment), out)


class WarpsReport:
    name = "warps"
    help = (
        "Traced kernels' warps: time per PTX block and per source line, imbalance across warps "
        "and SMs, the longest warp's path."
    )
    metavar = None
    minimum = None

    def write(self, job: Job, value: int | None, out: TextIO) -> None:
        warps.render_warp_summary(warps.warp_summary(job.db.experiment), out)


#: Every report, in the order a run prints them.
REPORTS: tuple[TextReport, ...] = (
    ContextReport(),
    ImbalanceReport(),
    TraceSummaryReport(),
    BlameReport(),
    OverlapReport(),
    WarpsReport(),
)

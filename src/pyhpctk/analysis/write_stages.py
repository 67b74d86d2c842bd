"""The driver's last stages: the database's files, written by every rank at its own offsets.

After the statistics (:mod:`.pipeline`), rank 0 makes the staging directory beside the output
(:func:`stage_files`); every rank writes its profile.db blocks and trace.db lines at offsets
from the exclusive scans of the all-gathered sizes (:func:`write_profile_db`, on a thread,
:mod:`.slices`) and takes part in the rounds that build cct.db and
the summary (:func:`write_cct_db`, :mod:`.exchange`), during which rank 0 writes meta.db,
``metrics/default.yaml``, ``threads.txt`` and ``src/`` on a thread (:func:`write_meta_db`); rank 0
writes the summary block, the heads and footers and renames the database into place
(:func:`finish`). A full disk on any rank is one error on every rank
(:meth:`.state.Analysis.writing`), and nothing is left under the output's name.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.comm import on_all, on_all_shared, on_root
from pyhpctk.analysis.database import AggregateDatabase
from pyhpctk.analysis.exchange import (
    Columns,
    Window,
    outgoing,
    own_window,
    plan_rounds,
    split_even,
)
from pyhpctk.analysis.memory import check_contexts
from pyhpctk.analysis.metrics import Partial
from pyhpctk.analysis.planes import block_of
from pyhpctk.analysis.screening import ProfileError
from pyhpctk.analysis.slices import FileSlice
from pyhpctk.analysis.sources import SourcesReport, copy_gpu_memory, copy_sources
from pyhpctk.analysis.state import Analysis, RunReport
from pyhpctk.analysis.stats import SparseValues, TreeShape, metric_bases
from pyhpctk.analysis.taxonomy import EXTRA_ROOTS, default_yaml
from pyhpctk.analysis.timing import Laps
from pyhpctk.analysis.write import (
    build_metadb,
    make_staging,
    prepare_output,
    write_taxonomy,
)
from pyhpctk.formats import cctdb, metadb, profiledb, threads, tracedb
from pyhpctk.formats.output import commit_directory

META_DB_VALUES = 40
"""Writing meta.db costs rank 0 about what owning this many cct.db values per context does
(measured with benchmarks/pyprof.py: ~6 us a context against ~0.15 us a value)."""


def stage_files(state: Analysis) -> None:
    """The staging directory beside the output (rank 0), with empty profile.db and cct.db."""
    options = state.options
    plan = state.plan
    assert plan is not None

    def make() -> Path:
        prepare_output(plan.output, options.force)
        staging = make_staging(plan.output)
        for name in ("profile.db", "cct.db"):
            os.close(os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))
        return staging

    state.output.staging = on_root(state.comm, state.writing(make))


def write_meta_db(state: Analysis) -> None:
    """meta.db, ``metrics/default.yaml``, ``threads.txt`` and ``src/`` on a thread of rank 0
    (joined by :func:`finish`), while every rank goes on with its profiles."""
    if not state.root:
        return
    options, plan, screened, staging = (
        state.options,
        state.plan,
        state.screened,
        state.output.staging,
    )
    assert plan is not None and screened is not None and staging is not None
    assert state.expanded is not None
    table = screened.table
    bases_by_name, _, _ = metric_bases(table.metrics, state.partials)
    db = AggregateDatabase(
        title=plan.title,
        tree=state.expanded,
        metrics=table.metrics,
        bases=bases_by_name,
        partials=state.partials,
        profiles=[],
        summary=SparseValues.empty(),
        formulas=table.formulas,
    )

    def write() -> None:
        began = time.perf_counter()
        try:
            if options.copy_sources:
                copied, state.output.sources = copy_sources(db.files(), staging, state.warrants)
                db.copied_files |= copied
            else:
                state.output.sources = SourcesReport(skipped=True)
            metadb.write(build_metadb(db), staging / "meta.db")
            extra = EXTRA_ROOTS if options.derived else ()
            write_taxonomy(staging, default_yaml(table.metrics, table.formulas, db.partials, extra))
            write_thread_names(state, staging)
            if state.sources.measurements:  # pyrun's GPU memory timelines (formats.md)
                copy_gpu_memory(state.sources.measurements, staging)
        except BaseException as error:  # re-raised by finish()
            state.output.meta_errors.append(error)
        state.timings["meta.db (thread)"] = round(time.perf_counter() - began, 3)

    state.output.meta_thread = threading.Thread(target=write, name="pyprof-meta.db", daemon=True)
    state.output.meta_thread.start()


def write_thread_names(state: Analysis, staging: Path) -> None:
    """``threads.txt``: the names pyrun recorded, by profile.db index (docs/formats.md, "Thread
    names"); no file when no profile has one (hpcrun's measurements)."""
    screened = state.screened
    assert screened is not None
    names = threads.ThreadNamesFile(threads.BY_PROFILE)
    for position, brief in enumerate(screened.usable):
        entry = state.thread_names.get(brief.index)
        if entry is not None:
            names.entries.append(dataclasses.replace(entry, key=str(position + 1)))
    if names.entries:
        threads.write(names, staging / threads.DATABASE_FILE)


def write_profile_db(state: Analysis) -> None:
    """Start writing this rank's profile.db blocks and trace.db lines at their offsets, on a
    thread (every rank; :func:`join_profile_db` waits for it).

    Buffered writes to one file take its inode lock, so the ranks of one machine write one at
    a time (:mod:`.slices`): on a thread, during the cct.db rounds, that wait is off the critical
    path. Blocks go out back to back in few ``pwritev`` calls, each of which releases the GIL.
    """
    layout, staging = state.output.layout, state.output.staging
    assert layout is not None and staging is not None
    profile_plan = profiledb.layout(layout.infos, layout.n_values, layout.n_ctxs)
    trace_plan = layout.trace_plan()

    def write() -> None:
        batch = PROFILE_BATCH
        if state.options.memory_limit is not None:
            batch = min(batch, max(state.options.memory_limit // 8, 1 << 20))
        blocks = (
            piece
            for m in state.planes
            for piece in profiledb.block_slices(profile_plan, m.position + 1, m.load(state.spill))
        )
        _write_runs(staging / "profile.db", blocks, batch)
        if layout.has_traces:
            lines = [  # in the file's order, which is not the profiles' (tracedb.layout)
                (int(trace_plan.lines_at[m.position]), m.trace.elements)
                for m in state.planes
                if m.trace is not None and len(m.trace.elements)
            ]
            lines.sort(key=lambda line: line[0])
            _write_runs(staging / "trace.db", iter(lines), batch, create=True)
            for m in state.planes:
                m.trace = None

    state.output.profile_thread = _in_background(state, write, "pyprof-profile.db")


PROFILE_BATCH = 64 << 20
"""Bytes of blocks handed to the kernel at once (under a memory cap, blocks are loaded from the
scratch file until this many, or an eighth of the cap, are held)."""


def _in_background(state: Analysis, write: Callable[[], object], name: str) -> threading.Thread:
    """``write`` (under ``state.writing``: a full disk becomes the one message) on a thread of
    its own, started; its error is kept for ``join_profile_db`` to raise."""
    guarded = state.writing(write)

    def background() -> None:
        try:
            guarded()
        except BaseException as error:  # re-raised by join_profile_db
            state.output.profile_errors.append(error)

    thread = threading.Thread(target=background, name=name)
    thread.start()
    return thread


def _write_runs(
    path: Path,
    runs: Iterator[tuple[int, npt.NDArray[Any]]],
    batch: int,
    create: bool = False,
) -> None:
    """Arrays at increasing offsets of ``path`` (a rank's blocks or lines lie back to back:
    ranks hold contiguous runs of profiles; gaps between them are zeros), in ``pwritev`` calls
    of about ``batch`` bytes."""
    if create:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
    with FileSlice(path, 0, sys.maxsize, mapped=False) as mine:
        at = cursor = -1
        pieces: list[memoryview] = []
        for offset, data in runs:
            if at < 0:
                at = cursor = offset
            if offset < cursor:
                raise ValueError("internal error: runs out of order")
            if offset > cursor:  # alignment padding
                pieces.append(memoryview(bytes(offset - cursor)))
            pieces.append(memoryview(np.ascontiguousarray(data).view(np.uint8).data))
            cursor = offset + data.nbytes
            if cursor - at >= batch:
                mine.write_back_to_back(at, pieces)
                at, pieces = cursor, []
        if pieces:
            mine.write_back_to_back(at, pieces)


def join_profile_db(state: Analysis) -> None:
    """Wait for :func:`write_profile_db`'s thread and the last cct.db window's
    (:func:`write_cct_db`); an error of either, on any rank, stops every rank."""

    def join() -> None:
        if state.output.profile_thread is not None:
            state.output.profile_thread.join()
        _join_window(state)
        if state.output.profile_errors:
            raise state.output.profile_errors[0]

    on_all(state.comm, join)


def write_cct_db(state: Analysis) -> None:
    """cct.db in rounds of contexts and the summary values (every rank, :mod:`.exchange`)."""
    comm, plan, staging = state.comm, state.plan, state.output.staging
    assert plan is not None and staging is not None
    shape = plan.shape
    n_contexts = len(shape)
    clock = Laps(state.timings, "cct.db: ", comm)  # where the stage's time goes, for the benchmark
    nnz = comm.allreduce_sum(state.local_counts)
    check_contexts(nnz, state.options.memory_limit)  # every rank: one context fits a round
    rounds = plan_rounds(nnz, comm.size, state.options.memory_limit)
    eligible = np.zeros(n_contexts, dtype=bool)
    if n_contexts:
        eligible = shape.lexical & ~shape.loop & (shape.parent >= 0)
        eligible &= shape.loop[np.maximum(shape.parent, 0)]
    loop_children = np.flatnonzero(eligible).astype(np.int64)
    loop_parents = shape.parent[loop_children] if n_contexts else loop_children
    empty = cctdb.layout(np.zeros(n_contexts, np.int64), np.zeros(n_contexts, np.int64))
    cursor = empty.footer_at
    state.n_metrics = np.zeros(n_contexts, dtype=np.int64)
    # Rank 0 writes meta.db meanwhile (from the first exchange on): its share of every round is
    # cut by that work, so that it does not keep the others waiting (any split writes the same
    # bytes).
    per_rank = max(int(nnz.sum()) / comm.size, 1.0)
    first_share = 1.0 if comm.size == 1 else max(0.2, 1 - META_DB_VALUES * n_contexts / per_rank)
    clock.lap("plan")
    for start, stop in rounds:
        if state.options.memory_limit is not None:
            _join_window(state)  # the last round's window not held through this one's exchange
        owners = split_even(nnz[start:stop], comm.size, first_share, state.speeds) + start
        sending = outgoing(
            comm.size, state.planes, state.spill, owners, loop_children, loop_parents
        )
        clock.lap("cut")
        if state.root and state.output.meta_thread is None:
            # Not before: the thread's Python holds the GIL most of the time, and the cut is
            # many small numpy calls that every rank waits for in the exchange; MPI's calls
            # release the GIL, and rank 0 owns less of the placing that follows.
            write_meta_db(state)
        arrays, counts = comm.alltoall_columns(sending.arrays, sending.counts)
        incoming = Columns(arrays, counts)
        del sending, arrays
        clock.lap("exchange")
        lo, hi = int(owners[comm.rank]), int(owners[comm.rank + 1])
        _join_window(state)  # the last round's bytes written: its memory back before placing
        placing = partial(_placed, incoming, lo, hi, shape, state.partials)
        piece, sizes = on_all_shared(comm, placing)  # every window's size, every rank's error
        del incoming, placing
        clock.lap("place+summarise")
        at = cursor + sum(sizes[: comm.rank])
        _start_window(state, at, piece)
        cursor += sum(sizes)
        clock.lap("write")
        gathered = comm.gather((lo, piece.n_metrics, piece.summary))
        if gathered is not None:
            for where, metrics_here, summary in gathered:
                state.n_metrics[where : where + len(metrics_here)] = metrics_here
                state.summary_parts.append(summary)
        clock.lap("gather")
    if state.root and state.output.meta_thread is None:
        write_meta_db(state)  # no rounds: no contexts
    state.local_counts = nnz
    state.output.cct_end = cursor


def _placed(
    incoming: Columns, lo: int, hi: int, shape: TreeShape, partials: tuple[Partial, ...]
) -> tuple[Window, int]:
    window = own_window(incoming, lo, hi, shape, partials)
    return window, window.size


def _start_window(state: Analysis, at: int, window: Window) -> None:
    """Write this rank's cct.db blocks of a round back to back from ``at``, on a thread: joined
    before the next round places its values (under ``--memory-limit``, before it cuts its
    blocks: the window is not held through the exchange; :func:`_join_window`) or by
    :func:`join_profile_db`, whose collective carries an error to every rank.

    ``os.pwritev``, not memory maps: the ranks of one machine take turns for the file's inode
    lock, but a mapped byte costs about 2.5 times a written one (a page fault, the page zeroed
    first), and on the 16-core device machine 16 ranks' maps took as long as one rank's
    ``pwritev`` of the whole file (0.13 s a rank, 2026-12-02); on a thread the turns are waited
    for off the critical path, during the gather and the next round's cut and exchange.
    """
    assert state.output.staging is not None
    path = state.output.staging / "cct.db"

    def write() -> None:
        with FileSlice(path, at, at + window.size, mapped=False) as mine:
            mine.write_back_to_back(at, window.pieces)

    def write_and_drop() -> None:
        try:
            write()
        finally:
            del window.pieces[:]

    state.output.cct_thread = _in_background(state, write_and_drop, "pyprof-cct.db")


def _join_window(state: Analysis) -> None:
    """Wait for :func:`_start_window`'s thread, if one runs (its error stays recorded)."""
    if state.output.cct_thread is not None:
        state.output.cct_thread.join()
        state.output.cct_thread = None


def finish(state: Analysis) -> RunReport:
    """Rank 0: the summary block, the files' heads and footers, meta.db joined, the rename."""
    plan, layout, staging, screened = (
        state.plan,
        state.output.layout,
        state.output.staging,
        state.screened,
    )
    assert plan is not None and layout is not None and staging is not None
    assert screened is not None

    clock = Laps(state.timings, "finish: ")

    def write() -> RunReport:
        cct_plan = cctdb.layout(state.local_counts, state.n_metrics)
        if cct_plan.footer_at != state.output.cct_end:
            raise ProfileError("internal error: cct.db blocks do not add up to the layout")
        fd = os.open(staging / "cct.db", os.O_WRONLY)
        try:
            cctdb.write_head(fd, cct_plan)
            cctdb.write_footer(fd, cct_plan)
        finally:
            os.close(fd)
        parts = state.summary_parts  # the owners' windows in context order: already sorted
        summary = block_of(
            SparseValues(
                np.concatenate([p.ctx for p in parts] or [np.zeros(0, np.int64)]),
                np.concatenate([p.metric for p in parts] or [np.zeros(0, np.int64)]),
                np.concatenate([p.value for p in parts] or [np.zeros(0, np.float64)]),
            )
        )
        layout.n_values[0], layout.n_ctxs[0] = summary.n_values, summary.n_contexts
        final = profiledb.layout(layout.infos, layout.n_values, layout.n_ctxs)
        fd = os.open(staging / "profile.db", os.O_WRONLY)
        try:
            profiledb.write_head(fd, final)
            profiledb.write_block(fd, final, 0, summary)
            profiledb.write_footer(fd, final)
        finally:
            os.close(fd)
        if layout.has_traces:
            trace_plan = layout.trace_plan()
            fd = os.open(staging / "trace.db", os.O_WRONLY)
            try:
                tracedb.write_head(fd, trace_plan)
                tracedb.write_footer(fd, trace_plan)
            finally:
                os.close(fd)
        clock.lap("heads")
        if state.output.meta_thread is not None:
            state.output.meta_thread.join()
        if state.output.meta_errors:
            raise state.output.meta_errors[0]
        clock.lap("meta.db join")
        commit_directory(staging, plan.output)
        clock.lap("commit")
        return RunReport(
            output=plan.output,
            profiles=len(screened.usable),
            contexts=len(plan.shape),
            metrics=sum(1 for m in screened.table.metrics if not m.is_derived),
            traces=int(np.count_nonzero(layout.trace_counts > 0)),
            problems=tuple(screened.problems),
            timings=state.timings,
            sources=state.output.sources,
        )

    return on_root(state.comm, state.writing(write))


__all__ = [
    "finish",
    "join_profile_db",
    "stage_files",
    "write_cct_db",
    "write_meta_db",
    "write_profile_db",
]

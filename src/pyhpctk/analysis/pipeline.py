"""pyprof's one analysis driver: the same stages in one process or on every rank of an MPI job.

Serial pyprof is pyprof-mpi on one rank (:class:`~.comm.SerialComm`); with ``mpiexec`` every
rank runs :func:`run` with the same options over :func:`~.comm.world` (docs/pyprof.md). Each
stage is a function below, named after it, that reads and fills the :class:`Analysis` the
stages share; collectives go through the :class:`~.comm.Comm`, and an error on any rank stops
every rank with the first one's message (:func:`~.comm.on_all`).

1. :func:`read`: rank 0 lists the profiles; each rank reads a contiguous slice of them,
   balanced by bytes and the ranks' speeds (:mod:`.balance`), on ``-j`` threads, folding
   each into its one call-path tree as it arrives; rank 0 reads less and expands its own tree
   meanwhile (:func:`.expand_plan.expand_early`).
   What every rank must know about every profile is all-gathered and screened once
   (:func:`.screening.screen`: warnings, ``--strict``, metric tables).
2. :func:`unify`: the ranks' trees are reduced along a binomial tree, lower ranks on the left;
   :meth:`.unify.RawTree.merge` numbers nodes as one-by-one insertion in profile order would, so
   any grouping gives serial pyprof's tree. It is broadcast; ranks re-map their profiles into it.
3. :func:`expand_contexts` on rank 0: structure files, symbols, logical metadata, GPU
   reconstruction (``GINS`` weights summed over ranks), for the frames the early expansion did
   not cover (:mod:`.expand_plan`); what the statistics need is broadcast.
4. :func:`statistics` and :func:`rewrite_traces`: every rank computes its profiles' planes
   (:mod:`.planes`); the blocks' sizes are all-gathered so that each rank knows every offset.
5. :func:`write_profile_db` (with the trace.db lines) and :func:`write_cct_db`: ranks write
   disjoint slices of the files at offsets from exclusive scans of those sizes (``pwritev`` on
   threads, :mod:`.slices`); cct.db is built in rounds by the
   exchange of :mod:`.exchange`, which also yields the summary profile. From the first
   exchange on, rank 0 writes meta.db, ``metrics/default.yaml`` and ``src/`` on a thread
   (:func:`write_meta_db`), and owns that much less of cct.db.
6. :func:`finish` on rank 0: the summary block, heads and footers, and the rename into place.

:func:`aggregate` runs stages 1-4 in memory on one process (an
:class:`~.database.AggregateDatabase`, for tests, comparisons and :mod:`.write`). Floating-point
sums run over the same values in the same order whatever the rank count, so every rank count
writes the same bytes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis import inputs
from pyhpctk.analysis.balance import rank_speeds, read_speeds
from pyhpctk.analysis.comm import Comm, SerialComm, on_all_shared, on_root
from pyhpctk.analysis.context import ContextBuilder
from pyhpctk.analysis.database import AggregateDatabase, ProfileResult
from pyhpctk.analysis.exchange import split_even
from pyhpctk.analysis.expand_plan import expand_early, expand_frames, read_share
from pyhpctk.analysis.gpu import WEIGHT_METRIC, node_weights, reconstruct_gpu_contexts
from pyhpctk.analysis.graft import graft_profile, plan_grafts
from pyhpctk.analysis.memory import check_profiles
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.planes import (
    ProfilePlane,
    open_spill,
    profile_block,
    profile_statistics,
    rewrite_trace,
)
from pyhpctk.analysis.runtimes import Roles
from pyhpctk.analysis.screening import (
    Loaded,
    ProfileError,
    briefs_of,
    id_tuples,
    load_profile,
    screen,
)
from pyhpctk.analysis.sources import Warrants, read_tables
from pyhpctk.analysis.state import (
    RAW_BYTES_PER_INPUT_BYTE,
    Analysis,
    Plan,
    ProfileOffsets,
    Progress,
    RunReport,
    no_progress,
    parallel_map,
    small_pages,
)
from pyhpctk.analysis.stats import SparseValues, TreeShape, metric_bases, summarize
from pyhpctk.analysis.structures import named_sources
from pyhpctk.analysis.timing import Laps, TimedComm, timed
from pyhpctk.analysis.unify import ProfileData, RawTree
from pyhpctk.analysis.worker_roles import roles_of
from pyhpctk.analysis.write import prepare_output
from pyhpctk.analysis.write_stages import (
    finish,
    join_profile_db,
    stage_files,
    write_cct_db,
    write_meta_db,
    write_profile_db,
)
from pyhpctk.errors import PyhpctkError
from pyhpctk.formats import profiledb, tracedb

T = TypeVar("T")

# --------------------------------------------------------------------------------------------
# Stage 1: read


def read(state: Analysis) -> None:
    """List the profiles (rank 0), read this rank's share, screen them all (every rank)."""
    options, comm = state.options, state.comm

    def discover() -> inputs.Listing:
        if options.output is not None and not state.in_memory:
            prepare_output(options.output, options.force)  # fail before the work, not after
        sources = inputs.discover(options.measurements)
        state.thread_names = inputs.thread_names(sources)  # rank 0 writes them (threads.txt)
        if options.copy_sources:
            loaded, tables = read_tables(sources.measurements)
            state.warrants = Warrants(loaded, tables=tables)
        return sources

    clock = Laps(state.timings, "read: ", state.comm)
    state.speeds = rank_speeds(comm)  # every rank's share follows its speed (.balance)
    clock.lap("speeds")
    state.sources = on_root(comm, discover)
    sizes = np.asarray(state.sources.sizes, dtype=np.int64)
    listing = state.sources
    check_profiles(sizes, lambda i: str(listing[i].profile), options.memory_limit)  # every rank
    clock.lap("list")
    # Rank 0 reads less: it expands its call paths while the others read (.expand_plan).
    bounds = split_even(sizes, comm.size, read_share(sizes, comm.size), state.speeds)
    mine = list(range(int(bounds[comm.rank]), int(bounds[comm.rank + 1])))
    # Under a memory cap, a rank whose share of the input would not fit reads it twice: once
    # for the call paths (values dropped at once, but for the GPU call-edge weights), once more
    # profile by profile for the statistics.
    share = int(sizes[mine].sum()) if mine else 0
    limit = options.memory_limit
    state.light = limit is not None and share * RAW_BYTES_PER_INPUT_BYTE > limit
    loaded: list[Loaded] = []
    started = time.perf_counter()
    with state.stage("reading profiles", len(mine)) as advance:
        for item in parallel_map(partial(_load, state), mine, options.jobs, advance):
            if item.data is not None:
                _fold(state, item.data)
            loaded.append(item)
    rate = share / max(time.perf_counter() - started, 1e-9)  # bytes a second, as it read
    clock.lap("load")
    if state.root and comm.size > 1:
        state.early = expand_early(options, state.tree, loaded, state.sources)
        clock.lap("expand early")
    parts = comm.allgather((briefs_of(loaded), rate))
    everyone = [b for part, _ in parts for b in part]
    # cct.db's shares follow how fast each rank read, a surer speed than the probe's (.balance)
    state.speeds = read_speeds(state.speeds, [r for _, r in parts], sizes.sum() / comm.size)
    clock.lap("briefs")
    state.screened = screened = screen(everyone, options.strict, warn=state.root)
    clock.lap("screen")
    position = screened.position()
    state.own = [
        (item.index, item.data)
        for item in loaded
        if item.data is not None and item.index in position
    ]
    if len(state.own) != sum(1 for item in loaded if item.data is not None):
        # Profiles were dropped for their metric tables after being folded in: fold again
        # without them (rare; they are read again rather than kept).
        state.tree = None
        again = parallel_map(partial(_load, state), [i for i, _ in state.own], options.jobs, _skip)
        state.own = []
        for item in again:
            if item.data is None:
                raise ProfileError(f"{item.problem} (changed while pyprof was running?)")
            _fold(state, item.data)
            state.own.append((item.index, item.data))


def _skip(n: int) -> None:
    return None


def _load(state: Analysis, index: int) -> Loaded:
    item = load_profile(index, state.sources[index])
    if item.data is not None and state.options.graft_workers != "off":
        item.data.roles = roles_of(item.data, str(state.sources.measurement(index)))
    if state.light and item.data is not None:
        _drop_values(item.data)
    return item


def _fold(state: Analysis, data: ProfileData) -> None:
    """Fold a profile into the rank's tree as it arrives, in index order (the tree a pairwise
    reduction gives, see RawTree.merge): only one tree is held, not one per profile."""
    if state.tree is None:
        state.tree = data.tree
    else:
        data.remap(state.tree.merge(data.tree))
        data.tree = state.tree


def _drop_values(data: ProfileData) -> None:
    """Keep a profile's tree and GPU call-edge weights only (it is read again for statistics)."""
    names = [m.name for m in data.metrics]
    keep = np.zeros(len(data.value_metric), dtype=bool)
    if WEIGHT_METRIC in names:
        keep = data.value_metric == names.index(WEIGHT_METRIC)
    data.value_node = data.value_node[keep]
    data.value_metric = data.value_metric[keep]
    data.value = data.value[keep]
    data.trace_time = data.trace_node = None


# --------------------------------------------------------------------------------------------
# Stage 2: unify


def unify(state: Analysis) -> None:
    """Reduce the ranks' trees onto rank 0, share the result, re-map every profile into it."""
    comm = state.comm
    assert state.screened is not None
    clock = Laps(state.timings, "unify: ", state.comm)
    with state.stage("unifying call paths", len(state.screened.usable)) as advance:
        state.merged = merged = _tree_reduce(comm, state.tree)
        clock.lap("reduce")
        if comm.size > 1:
            shared = comm.bcast(merged.wire() if merged is not None else None)
            clock.lap("bcast")
            assert shared is not None
            n_raw = len(shared[0])  # type: ignore[arg-type]
            if not state.root and state.tree is not None:
                everything = RawTree.from_wire(shared)
                mapping = everything.merge(state.tree)
                if len(everything) != n_raw:  # pragma: no cover - would be a bug
                    raise ProfileError("internal error: a rank's call paths are not in the tree")
                for _, data in state.own:
                    data.remap(mapping)
                state.tree = everything
            elif not state.root:
                state.tree = RawTree.from_wire(shared)
            clock.lap("remap")
        else:
            n_raw = len(merged) if merged is not None else 0
        advance(len(state.screened.usable))
    if any(WEIGHT_METRIC in {m.name for m in b.metrics} for b in state.screened.usable):
        assert state.tree is not None
        parts = comm.gather(node_weights(state.tree, state.own) if state.own else None)
        if parts is not None:
            state.weights = np.zeros(n_raw, dtype=np.float64)
            for part in parts:
                if part is not None:
                    state.weights += part[:n_raw]


def _tree_reduce(comm: Comm, tree: RawTree | None) -> RawTree | None:
    """Binomial reduction of the ranks' trees onto rank 0, lower ranks on the left."""
    step = 1
    while step < comm.size:
        if comm.rank % (2 * step) == 0:
            partner = comm.rank + step
            if partner < comm.size:
                other = comm.recv(partner)
                if other is not None:
                    incoming = RawTree.from_wire(other)
                    if tree is None:
                        tree = incoming
                    else:
                        tree.merge(incoming)
        else:
            comm.send(None if tree is None else tree.wire(), comm.rank - step)
            return None
        step *= 2
    return tree


# --------------------------------------------------------------------------------------------
# Stage 3: expand


def expand_contexts(state: Analysis) -> None:
    """Frames to contexts on rank 0; the placement and tree shape broadcast to every rank."""
    options = state.options
    screened = state.screened
    assert screened is not None

    clock = Laps(state.timings, "expand: ", state.comm)
    roles: list[tuple[int, Roles]] = []  # rank 0: every thread's (.graft)
    if options.graft_workers != "off":
        found = state.comm.gather([(i, d.roles) for i, d in state.own if d.roles is not None])
        if found is not None:
            roles = sorted((pair for part in found for pair in part), key=lambda p: p[0])
        clock.lap("roles")

    def expansion_plan() -> Plan:
        raw = state.merged
        assert raw is not None
        expansion, classifiers = expand_frames(
            options, raw, screened.usable, state.sources, screened.problems, state.early
        )
        state.early = None
        if options.copy_sources:
            structured = named_sources(classifiers)
            state.warrants = dataclasses.replace(state.warrants, structured=structured)
        expansion = reconstruct_gpu_contexts(
            raw, expansion, classifiers, [], state.weights, screened.problems
        )
        grafts = None
        if roles:
            n_metrics = len(screened.table.metrics)
            expansion, grafts = plan_grafts(
                raw,
                expansion,
                classifiers,
                roles,
                screened.mappings,
                n_metrics,
                options.graft_workers,
                screened.problems,
            )
            roles.clear()
        clock.lap("frames")
        state.expanded = tree = expansion.tree
        expansion.tree = ContextBuilder()  # the placement travels without the tree
        title = options.title or screened.usable[0].program or "database"
        output = options.output or default_output(options, title)
        plan = Plan(
            TreeShape.of(tree),
            tree.visible_ancestor(),
            expansion,
            title,
            output,
            os.path.lexists(output),
            grafts,
        )
        clock.lap("shape")
        return plan

    with state.stage("expanding contexts", 1) as advance:
        state.plan = on_root(state.comm, expansion_plan)
        advance(1)
    if state.root:
        clock.lap("bcast")
    graft_workers(state)


def graft_workers(state: Analysis) -> None:
    """Worker threads' values (and traces) moved under their dispatchers (:mod:`.graft`); in
    a light run the statistics do it as they read the values again."""
    plan, screened = state.plan, state.screened
    assert plan is not None and screened is not None
    for index, data in state.own:
        data.roles = None
        if not state.light:
            graft_profile(data, index, plan.grafts, screened.mappings[index])


# --------------------------------------------------------------------------------------------
# Stage 4: statistics and traces


def statistics(state: Analysis) -> None:
    """Every profile's values on final contexts, as a profile.db block, on the rank that read it;
    then the sizes of every block, all-gathered."""
    options, plan, screened = state.options, state.plan, state.screened
    assert plan is not None and screened is not None
    n_contexts = len(plan.shape)
    _, global_base, move = metric_bases(screened.table.metrics, state.partials)
    position = screened.position()
    local_counts = np.zeros(n_contexts, dtype=np.int64)
    count_lock = threading.Lock()
    merge_lock = threading.Lock()
    spill = state.spill

    def one(item: tuple[int, ProfileData]) -> ProfilePlane:
        index, data = item
        if state.light:  # read the profile again, now for its values and trace
            fresh = _read_again(state, index, merge_lock)
            data.value_node, data.value_metric = fresh.value_node, fresh.value_metric
            data.value, data.call_trace = fresh.value, fresh.call_trace
            data.trace_time, data.trace_node = fresh.trace_time, fresh.trace_node
            graft_profile(data, index, plan.grafts, screened.mappings[index])
        block, contexts, counts = profile_block(
            data, screened.mappings[index], plan.placement, plan.shape, global_base, move
        )
        with count_lock:
            local_counts[contexts] += counts
        # The value arrays are no longer needed: free them before the next profile.
        data.value_node = data.value_metric = np.zeros(0, dtype=np.int64)
        data.value = np.zeros(0, dtype=np.float64)
        at = spill.put(block) if spill is not None else -1
        keep = None if spill is not None else block
        return ProfilePlane(position[index], block.n_values, block.n_contexts, keep, at, None, None)

    with state.stage("computing statistics", len(state.own)) as advance:
        try:
            state.planes = list(parallel_map(one, list(state.own), options.jobs, advance))
        except (PyhpctkError, OSError) as error:
            state.failure = error  # raised on every rank by the sizes' allgather (_share_sizes)
    state.local_counts = local_counts


def _read_again(state: Analysis, index: int, lock: threading.Lock) -> ProfileData:
    """A profile read a second time (``light``), re-mapped into the unified tree."""
    again = load_profile(index, state.sources[index])
    if again.data is None:
        raise ProfileError(f"{again.problem} (changed while pyprof was running?)")
    tree = state.tree
    assert tree is not None
    with lock:
        before = len(tree)
        mapping = tree.merge(again.data.tree)
        if len(tree) != before:
            raise ProfileError(f"{again.data.name}: changed while pyprof was running")
    again.data.remap(mapping)
    return again.data


def rewrite_traces(state: Analysis) -> None:
    """Every trace on final contexts (formats.md §3.5); then every rank learns every size."""
    plan, screened = state.plan, state.screened
    assert plan is not None and screened is not None
    by_index = {index: data for index, data in state.own}
    placement = plan.placement

    def one(item: ProfilePlane) -> ProfilePlane:
        data = by_index[screened.usable[item.position].index]
        if data.trace_time is not None and data.trace_node is not None:
            trace = rewrite_trace(
                data.trace_time,
                data.trace_node,
                placement.call_ctx if data.call_trace else placement.leaf_ctx,
                plan.visible,
            )
            item.trace = tracedb.TraceLine.from_arrays(item.position + 1, trace.time, trace.ctx)
            if len(trace.time):
                item.trace_range = (int(trace.time[0]), int(trace.time[-1]))
        data.trace_time = data.trace_node = None
        return item

    clock = Laps(state.timings, "traces: ", state.comm)
    with state.stage("rewriting traces", len(state.planes)) as advance:
        if state.failure is None:
            list(parallel_map(one, state.planes, state.options.jobs, advance))
    state.own.clear()
    clock.lap("rewrite")
    _share_sizes(state)
    clock.lap("sizes")


def _share_sizes(state: Analysis) -> None:
    """Every profile's block and trace sizes on every rank (one allgather, which also stops
    every rank when the statistics failed on one)."""
    screened = state.screened
    assert screened is not None

    # Before the allgather: rank 0, which reads fewer profiles (.expand_plan.read_share), builds
    # the real infos while the others finish their statistics; the others need stand-ins only.
    raw = [b.id_tuple for b in screened.usable]
    summary = profiledb.ProfileInfo(is_summary=True, id_tuple=None)
    infos = [summary, *(_real_infos(raw) if state.root else _stand_ins(raw))]

    Span = tuple[int, int] | None

    def tallies() -> tuple[None, tuple[npt.NDArray[np.int64], Span]]:
        if state.failure is not None:
            raise state.failure
        # One row a profile (position, values, contexts, trace length or -1), as an array:
        # every rank reads every rank's rows. The rank's traces' time span travels beside it.
        mine = np.array(
            [
                (
                    m.position,
                    m.n_values,
                    m.n_contexts,
                    -1 if m.trace is None else len(m.trace.elements),
                )
                for m in state.planes
            ],
            dtype=np.int64,
        ).reshape(-1, 4)
        spans = [m.trace_range for m in state.planes if m.trace_range is not None]
        span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
        return None, (mine, span)

    _, shards = on_all_shared(state.comm, tallies)
    n_profiles = len(screened.usable)
    rows = np.concatenate([np.zeros((0, 4), dtype=np.int64), *(r for r, _ in shards)])
    where = rows[:, 0]
    n_values = np.zeros(n_profiles + 1, dtype=np.int64)
    n_ctxs = np.zeros(n_profiles + 1, dtype=np.int64)
    trace_counts = np.full(n_profiles, -1, dtype=np.int64)
    n_values[where + 1], n_ctxs[where + 1], trace_counts[where] = rows[:, 1], rows[:, 2], rows[:, 3]
    spans = [span for _, span in shards if span is not None]
    low = min(s[0] for s in spans) if spans else None
    high = max(s[1] for s in spans) if spans else None
    state.output.layout = ProfileOffsets(infos, n_values, n_ctxs, trace_counts, (low, high))


def _real_infos(raw: list[list[tuple[int, int, int]]]) -> list[profiledb.ProfileInfo]:
    """The profiles' infos with their id tuples (logical ids made dense by ``id_tuples``)."""
    return [
        profiledb.ProfileInfo(
            is_summary=False,
            id_tuple=tuple(
                profiledb.IdTupleElement(e.kind, e.is_physical, e.logical, e.physical)
                for e in elements
            ),
        )
        for elements in id_tuples(raw)
    ]


def _stand_ins(raw: list[list[tuple[int, int, int]]]) -> list[profiledb.ProfileInfo]:
    """Infos whose id tuples have the profiles' lengths, all zeros: where every block of
    profile.db goes depends on the tuples' lengths only, and only rank 0 writes their bytes
    (the head). One shared object a length: no per-profile work beyond a lookup."""
    blank: dict[int, profiledb.ProfileInfo] = {}
    out = []
    for elements in raw:
        n = len(elements)
        info = blank.get(n)
        if info is None:
            zero = profiledb.IdTupleElement(0, False, 0, 0)
            info = blank[n] = profiledb.ProfileInfo(is_summary=False, id_tuple=(zero,) * n)
        out.append(info)
    return out


# --------------------------------------------------------------------------------------------
# The driver


def _timed(state: Analysis, name: str, stage: Callable[[Analysis], T]) -> T:
    return timed(state.timings, name, state.comm, partial(stage, state))


def run(
    options: ProfOptions, progress: Progress | None = None, comm: Comm | None = None
) -> RunReport:
    """Aggregate ``options.measurements`` and write the database directory.

    ``comm``: the ranks to share the work with (default: this process alone). Every rank calls
    this with the same options; rank 0's report names the database, the other ranks' carry
    their own timings.
    """
    with small_pages():
        return _run(Analysis(options, TimedComm(comm or SerialComm()), progress or no_progress))


def _run(state: Analysis) -> RunReport:
    options = state.options
    _timed(state, "read", read)
    _timed(state, "unify", unify)
    _timed(state, "expand", expand_contexts)
    _timed(state, "staging", stage_files)
    finished = False
    try:
        # Blocks wait in a scratch file where some rank's share of the input did not fit.
        if options.memory_limit is not None and any(state.comm.allgather(state.light)):
            state.spill = open_spill(state.comm)
        _timed(state, "statistics", statistics)
        _timed(state, "traces", rewrite_traces)
        with state.stage("writing database", 3) as advance:
            _timed(state, "profile.db", write_profile_db)
            advance(1)
            _timed(state, "cct.db", write_cct_db)  # starts write_meta_db's thread on rank 0
            _timed(state, "profile.db: join", join_profile_db)
            advance(1)
            report = _timed(state, "finish", finish)
            advance(1)
        finished = True
    finally:
        if state.output.profile_thread is not None and state.output.profile_thread.is_alive():
            state.output.profile_thread.join()  # it reads the scratch file
        if state.output.cct_thread is not None and state.output.cct_thread.is_alive():
            state.output.cct_thread.join()
        if state.spill is not None:
            state.spill.close()
        if state.output.meta_thread is not None and state.output.meta_thread.is_alive():
            state.output.meta_thread.join()
        if state.root and not finished and state.output.staging is not None:
            shutil.rmtree(state.output.staging, ignore_errors=True)
    if not state.root:
        plan = state.plan
        assert plan is not None
        return RunReport(plan.output, 0, len(plan.shape), 0, 0, (), state.timings)
    return dataclasses.replace(report, timings=state.timings)  # rank 0's came through bcast


def aggregate(options: ProfOptions, progress: Progress | None = None) -> AggregateDatabase:
    """Read, unify, expand and summarise every profile of ``options.measurements`` in memory
    (stages 1-4 on this process; nothing is written)."""
    with small_pages():
        return _aggregate(Analysis(options, SerialComm(), progress or no_progress, in_memory=True))


def _aggregate(state: Analysis) -> AggregateDatabase:
    options = state.options
    read(state)
    unify(state)
    expand_contexts(state)
    plan, screened, tree = state.plan, state.screened, state.expanded
    assert plan is not None and screened is not None and tree is not None
    bases_by_name, global_base, move = metric_bases(screened.table.metrics, state.partials)
    tuples = id_tuples([b.id_tuple for b in screened.usable])

    def one(item: tuple[int, ProfileData]) -> SparseValues:
        index, data = item
        mapping = screened.mappings[index]
        return profile_statistics(data, mapping, plan.placement, plan.shape, global_base, move)

    with state.stage("computing statistics", len(state.own)) as advance:
        values = list(parallel_map(one, state.own, options.jobs, advance))
        summary = summarize(plan.shape, values, state.partials)
    profiles: list[ProfileResult] = []
    low: int | None = None
    high: int | None = None
    for (_, data), sparse, id_tuple in zip(state.own, values, tuples, strict=True):
        trace = None
        if data.trace_time is not None and data.trace_node is not None:
            where = plan.placement.call_ctx if data.call_trace else plan.placement.leaf_ctx
            trace = rewrite_trace(data.trace_time, data.trace_node, where, plan.visible)
            if len(trace.time):
                t0, t1 = int(trace.time[0]), int(trace.time[-1])
                low = t0 if low is None else min(low, t0)
                high = t1 if high is None else max(high, t1)
        profiles.append(ProfileResult(data.name, id_tuple, sparse, trace))
    return AggregateDatabase(
        title=plan.title,
        tree=tree,
        metrics=screened.table.metrics,
        bases=bases_by_name,
        partials=state.partials,
        profiles=profiles,
        summary=summary,
        trace_range=None if low is None or high is None else (low, high),
        formulas=screened.table.formulas,
        problems=screened.problems,
    )


def default_output(options: ProfOptions, title: str) -> Path:
    """The default database name, in the current directory: it follows the measured program.

    hpcprof's rule (``args.cpp``) names it after its one input: ``hpctoolkit-APP-measurements``
    (pyrun's and hpcrun's default, ``-N`` or a job or launch key after it) gives
    ``hpctoolkit-APP-database`` with the same tail, any other directory ``DIR-database``.
    Inputs that all name one APP give ``hpctoolkit-APP-database``; otherwise the title does,
    the program a measurement file names (``program-name``), unless that is only the Python
    interpreter every pyrun profile names. Only last path components are used, so neither a
    directory nor ``program-name=../../x`` can place the database elsewhere (issue #15).
    """
    here = Path(os.getcwd())
    names = [Path(os.path.abspath(m)).name for m in options.measurements]
    measured = [re.fullmatch(r"hpctoolkit-(.+)-measurements(-[^/]*)?", name) for name in names]
    if len(names) == 1 and measured[0] is not None:
        app, tail = measured[0].groups()
        return here / f"hpctoolkit-{app}-database{tail or ''}"
    if len(names) == 1 and names[0]:
        return here / f"{names[0]}-database"
    apps = {None if match is None else match.group(1) for match in measured}
    if len(apps) == 1 and None not in apps:
        return here / f"hpctoolkit-{apps.pop()}-database"
    program = title.replace("\0", "").rsplit("/", 1)[-1]
    if not program or re.fullmatch(r"python[0-9.]*[a-z]?", program):
        return here / "hpctoolkit-database"  # hpcprof's name when there is no one input
    return here / f"hpctoolkit-{program}-database"


__all__ = [
    "Analysis",
    "ProfileError",
    "Progress",
    "RunReport",
    "aggregate",
    "default_output",
    "expand_contexts",
    "finish",
    "parallel_map",
    "read",
    "rewrite_traces",
    "run",
    "statistics",
    "unify",
    "write_cct_db",
    "write_meta_db",
    "write_profile_db",
]

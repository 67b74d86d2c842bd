"""pyprof-mpi: the pyprof pipeline spread over MPI ranks, writing the very same database.

Every rank runs this module's :func:`run_distributed` with the same options (docs/pyprof.md,
"pyprof-mpi"); collectives go through a :class:`~.comm.Comm`. The stages:

1. *Inputs*: rank 0 lists the profiles; each rank takes a contiguous slice of them, balanced by
   bytes, and reads it (on ``-j`` threads). What every rank must know about every profile
   (metric table, identifier tuple, problems) is all-gathered, so all ranks take the same
   decisions about damaged profiles without further messages.
2. *Unification*: each rank folds its profiles into one tree as it reads them, then the ranks
   reduce their trees along a binomial tree, lower ranks on the left. :meth:`.unify.RawTree.merge`
   numbers nodes by (first profile, position in that profile), whatever the grouping, so the tree
   is the one serial pyprof builds. Rank 0 broadcasts it; every rank re-maps its profiles into it.
3. *Expansion* on rank 0 (structure files, symbols, GPU reconstruction with ``GINS`` weights
   summed over ranks); the arrays the statistics need are broadcast.
4. *Per-profile planes*: each rank computes its profiles' values and traces and writes their
   ``profile.db`` blocks and ``trace.db`` lines at offsets from the format modules' layouts
   (exclusive scans of the all-gathered block sizes), so ranks write disjoint slices of one file.
   The summary block goes last in profile.db (hpcprof's order), so the others' offsets do not
   depend on it.
5. *cct.db and the summary*: non-zero counts per context are summed over ranks; contexts are cut
   into windows (*rounds*) so that no rank handles more than ``memory_limit`` bytes of values at
   a time, and each window is split among ranks by those counts. Ranks send each owner the
   values of its contexts (``alltoall``); the owner sorts them context-major (formats.md §3.4),
   writes its blocks at the offset found by an exclusive scan, and computes the summary of its
   contexts exactly as :func:`.stats.summarize` does (a loop's summary ``lex_aware`` needs its
   children's ``function`` values, which are sent to the loop's owner too).
6. Rank 0 writes meta.db, ``metrics/default.yaml`` and ``src/`` on a thread started right after
   expansion, then the summary block, the heads and footers, and renames the database into place.

Under a memory cap (``--memory-limit``) a rank also sets its finished blocks aside in a scratch
file, and a rank whose share of the input would not fit reads it twice (docs/pyprof.md).

Floating-point sums run over the same values in the same order as in serial pyprof, so the
database is byte-for-byte the one ``pyprof`` writes, for any number of ranks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis import inputs
from pyhpctk.analysis.comm import Comm
from pyhpctk.analysis.database import AggregateDatabase
from pyhpctk.analysis.expand import Expansion, expand
from pyhpctk.analysis.gpu import WEIGHT_METRIC, reconstruct_gpu_contexts
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import (
    MetricTable,
    ProfileError,
    Progress,
    RunReport,
    _load_one,
    _Loaded,
    _no_progress,
    build_classifiers,
    default_output,
    id_tuples,
    load_structures,
    metric_bases,
    parallel_map,
    profile_statistics,
    rewrite_trace,
)
from pyhpctk.analysis.stats import SparseValues, TreeShape, summarize
from pyhpctk.analysis.taxonomy import EXTRA_ROOTS, default_yaml
from pyhpctk.analysis.unify import ProfileData, RawTree
from pyhpctk.analysis.write import (
    build_metadb,
    copy_sources,
    database_error,
    make_staging,
    prepare_output,
    write_taxonomy,
)
from pyhpctk.core.context import ContextTree
from pyhpctk.core.metrics import (
    N_SCOPES,
    PARTIALS_STATS,
    PARTIALS_SUM,
    SCOPE_FUNCTION,
    MetricInfo,
    Partial,
)
from pyhpctk.errors import FormatWarning, PyhpctkError
from pyhpctk.formats import cctdb, metadb, profiledb, tracedb
from pyhpctk.formats.output import OutputError, commit_directory

T = TypeVar("T")

BYTES_PER_VALUE = 192
"""Peak bytes one value costs a rank while cct.db is built (sent, received, sorted, written)."""

MAX_ROUND_VALUES = 1 << 25
"""Values per rank in one cct.db round at most, whatever the memory limit: a round's message
between two ranks (18 bytes a value, pickled) must stay under MPI's 2 GiB."""


class DistributedError(PyhpctkError):
    """An error one rank met, raised on every rank so that all of them stop together."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _agree(comm: Comm, error: BaseException | None) -> None:
    """Raise the first rank's error on every rank (a collective: every rank must call it)."""
    report = None
    if error is not None:
        report = (getattr(error, "exit_code", 2), str(error))
    reports = comm.allgather(report)
    first = next((r for r in reports if r is not None), None)
    if first is not None:
        if error is not None and reports.index(first) == comm.rank:
            raise error
        raise DistributedError(first[1], first[0])


def _on_all(comm: Comm, function: Callable[[], T]) -> T:
    """``function()`` on every rank; an error on any rank is raised on all of them."""
    try:
        result = function()
    except (PyhpctkError, OSError) as error:
        _agree(comm, error)
        raise  # not reached: _agree raises
    _agree(comm, None)
    return result


def _on_root(comm: Comm, function: Callable[[], T]) -> T:
    """``function()`` on rank 0, its result broadcast; its error is raised on every rank."""
    payload: tuple[T | None, tuple[int, str] | None] = (None, None)
    error: BaseException | None = None
    if comm.rank == 0:
        try:
            payload = (function(), None)
        except (PyhpctkError, OSError) as caught:
            error = caught
            payload = (None, (getattr(caught, "exit_code", 2), str(caught)))
    result, report = comm.bcast(payload)
    if report is not None:
        if error is not None:
            raise error
        raise DistributedError(report[1], report[0])
    return result  # type: ignore[return-value]


def split_even(
    weights: npt.NDArray[np.int64], parts: int, first_share: float = 1.0
) -> npt.NDArray[np.int64]:
    """``parts + 1`` bounds of contiguous ranges of ``weights`` with about equal sums.

    ``first_share`` scales the first range's target (rank 0 has serial work of its own).
    """
    cumulative = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
    total = int(cumulative[-1])
    if total == 0:
        inner = np.linspace(0, len(weights), parts + 1)[1:-1].astype(np.int64)
    else:
        capacity = np.ones(parts, dtype=np.float64)
        capacity[0] = first_share
        targets = total * np.cumsum(capacity)[:-1] / capacity.sum()
        inner = np.searchsorted(cumulative, targets, side="left").astype(np.int64)
    bounds = np.concatenate([[0], inner, [len(weights)]]).astype(np.int64)
    return np.maximum.accumulate(np.clip(bounds, 0, len(weights)))


def plan_rounds(
    counts: npt.NDArray[np.int64], ranks: int, memory_limit: int | None
) -> list[tuple[int, int]]:
    """Windows of contexts, each holding at most ``ranks * memory_limit`` bytes of values.

    Without a limit, a window holds at most :data:`MAX_ROUND_VALUES` values per rank (MPI
    messages count their bytes in a C ``int``). A context is never split, so one whose values
    alone exceed the budget gets a round of its own.
    """
    n = len(counts)
    if n == 0:
        return []
    per_rank = MAX_ROUND_VALUES
    if memory_limit is not None:
        per_rank = min(max(1, memory_limit // BYTES_PER_VALUE), MAX_ROUND_VALUES)
    budget = per_rank * ranks
    cumulative = np.cumsum(counts, dtype=np.int64)
    rounds = []
    start = 0
    while start < n:
        before = int(cumulative[start - 1]) if start else 0
        end = int(np.searchsorted(cumulative, before + budget, side="right"))
        end = max(end, start + 1)
        rounds.append((start, min(end, n)))
        start = end
    return rounds


@dataclass(slots=True)
class _Brief:
    """What every rank learns about every profile (all-gathered after reading)."""

    index: int
    problem: str | None
    warnings: list[str]
    notes: list[str]
    name: str = ""
    metrics: list[MetricInfo] = field(default_factory=list)
    id_tuple: list[tuple[int, int, int]] = field(default_factory=list)
    program: str = ""
    module_paths: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Plan:
    """What rank 0 broadcasts after expansion: everything the per-profile work needs."""

    shape: TreeShape
    visible: npt.NDArray[np.int64]
    call_ctx: npt.NDArray[np.int64]
    leaf_ctx: npt.NDArray[np.int64]
    splits: tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]
    ]
    title: str
    output: Path
    replacing: bool  # an old database holds the output's name (then it is kept on errors)


def _writing(plan: _Plan, function: Callable[[], T]) -> Callable[[], T]:
    """``function`` with an ``OSError`` (a full disk) turned into the database's one-line error,
    which names the output and what was left of it."""

    def guarded() -> T:
        try:
            return function()
        except OSError as error:
            raise database_error(plan.output, error, plan.replacing) from None

    return guarded


class _Spill:
    """This rank's finished profile.db blocks in a scratch file, when memory is capped.

    Blocks are appended as computed (values, then context indices) and read back one at a time
    when they are copied into profile.db and in each cct.db round, so a rank never holds more
    than one of them. The file lives in ``$TMPDIR`` (node-local on most clusters) and is removed
    by :meth:`close`.
    """

    def __init__(self) -> None:
        try:
            handle, name = tempfile.mkstemp(prefix="pyprof-mpi-blocks-")
        except OSError as error:
            raise self._error(tempfile.gettempdir(), error) from None
        self.fd = handle
        self.path = name
        self.end = 0
        self.lock = threading.Lock()

    def put(self, block: profiledb.ProfileValues) -> int:
        """Append ``block``; returns where it starts."""
        values = np.ascontiguousarray(block.values).view(np.uint8)
        index = np.ascontiguousarray(block.ctx_indices).view(np.uint8)
        with self.lock:
            at = self.end
            self.end += len(values) + len(index)
        try:
            _pwrite(self.fd, values, at)
            _pwrite(self.fd, index, at + len(values))
        except OSError as error:
            raise self._error(self.path, error) from None
        return at

    @staticmethod
    def _error(where: str, error: OSError) -> OutputError:
        return OutputError(
            f"{where}: cannot write pyprof-mpi's scratch file: {error.strerror or error} "
            "(--memory-limit keeps blocks in $TMPDIR: point TMPDIR at a larger file system)"
        )

    def get(self, at: int, n_values: int, n_contexts: int) -> profiledb.ProfileValues:
        """The block :meth:`put` stored at ``at``."""
        size_v = n_values * profiledb.PROFILE_VALUE_DTYPE.itemsize
        size_c = n_contexts * profiledb.PROFILE_CTX_INDEX_DTYPE.itemsize
        raw = _pread(self.fd, size_v + size_c, at)
        return profiledb.ProfileValues(
            np.frombuffer(raw, profiledb.PROFILE_CTX_INDEX_DTYPE, n_contexts, size_v),
            np.frombuffer(raw, profiledb.PROFILE_VALUE_DTYPE, n_values, 0),
        )

    def close(self) -> None:
        os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _open_spill(comm: Comm) -> _Spill:
    """A scratch file on every rank, or the first rank's error on all (none left open)."""
    spill: _Spill | None = None
    error: OutputError | None = None
    try:
        spill = _Spill()
    except OutputError as caught:
        error = caught
    try:
        _agree(comm, error)
    except BaseException:
        if spill is not None:
            spill.close()
        raise
    assert spill is not None
    return spill


def _pread(fd: int, size: int, offset: int) -> bytes:
    """Exactly ``size`` bytes at ``offset``."""
    parts = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise OSError(f"scratch file ended {size} bytes early")
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


@dataclass(slots=True)
class _Mine:
    """One of this rank's profiles after statistics: its block (or where it was spilled)."""

    position: int  # 0-based among usable profiles; profile.db index is position + 1
    n_values: int
    n_contexts: int
    block: profiledb.ProfileValues | None
    spilled_at: int
    trace: tracedb.TraceLine | None
    trace_range: tuple[int, int] | None

    def load(self, spill: _Spill | None) -> profiledb.ProfileValues:
        """The block, from memory or from the scratch file."""
        if self.block is not None:
            return self.block
        assert spill is not None
        return spill.get(self.spilled_at, self.n_values, self.n_contexts)


RAW_BYTES_PER_INPUT_BYTE = 3
"""Memory a rank's profiles take between reading and statistics, per byte of input files."""


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


def _block_of(values: SparseValues) -> profiledb.ProfileValues:
    """``ProfileValues.from_triples`` for values already sorted, unique and non-zero (as
    :func:`.stats.profile_scopes` returns them): no sort needed, the same bytes."""
    key = (values.ctx << 16) | values.metric
    if (len(key) > 1 and bool(np.any(key[1:] <= key[:-1]))) or bool(np.any(values.value == 0)):
        return profiledb.ProfileValues.from_triples(values.ctx, values.metric, values.value)
    out = np.empty(len(key), profiledb.PROFILE_VALUE_DTYPE)
    out["metric_id"] = values.metric
    out["value"] = values.value
    new_ctx = np.ones(len(key), dtype=bool)
    new_ctx[1:] = values.ctx[1:] != values.ctx[:-1]
    starts = np.flatnonzero(new_ctx)
    index = np.empty(len(starts), profiledb.PROFILE_CTX_INDEX_DTYPE)
    index["ctx_id"] = values.ctx[starts]
    index["start"] = starts
    return profiledb.ProfileValues(index, out)


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


def _local_weights(n_raw: int, profiles: list[tuple[int, ProfileData]]) -> npt.NDArray[np.float64]:
    """:func:`.gpu.node_weights` over this rank's profiles."""
    total = np.zeros(n_raw, dtype=np.float64)
    for _, data in profiles:
        names = [m.name for m in data.metrics]
        if WEIGHT_METRIC not in names:
            continue
        keep = data.value_metric == names.index(WEIGHT_METRIC)
        total += np.bincount(data.value_node[keep], weights=data.value[keep], minlength=n_raw)
    return total


def run_distributed(
    options: ProfOptions,
    comm: Comm,
    memory_limit: int | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Aggregate ``options.measurements`` on every rank of ``comm``; rank 0 finishes the files.

    Every rank must call this with the same arguments. ``memory_limit`` bounds the bytes of
    values a rank holds while cct.db is built (None: only :data:`MAX_ROUND_VALUES` does).
    """
    root = comm.rank == 0
    stage = progress if (progress is not None and root) else _no_progress

    # Stage 1: inputs.
    def discover() -> tuple[list[inputs.ProfileSource], npt.NDArray[np.int64]]:
        if options.output is not None:
            prepare_output(options.output, options.force)
        sources = inputs.discover(options.measurements)
        sizes = [
            s.profile.stat().st_size + (s.trace.stat().st_size if s.trace is not None else 0)
            for s in sources
        ]
        return sources, np.asarray(sizes, dtype=np.int64)

    sources, sizes = _on_root(comm, discover)
    bounds = split_even(sizes, comm.size)
    mine = list(range(int(bounds[comm.rank]), int(bounds[comm.rank + 1])))
    # Under a memory cap, a rank whose share of the input would not fit reads it twice: once
    # for the call paths (values dropped at once, but for the GPU call-edge weights), once more
    # profile by profile for the statistics.
    share = int(sizes[mine].sum()) if mine else 0
    light = memory_limit is not None and share * RAW_BYTES_PER_INPUT_BYTE > memory_limit

    def load(index: int) -> _Loaded:
        item = _load_one(index, sources[index])
        if light and item.data is not None:
            _drop_values(item.data)
        return item

    # Stage 2 begins while reading: profiles are folded into the rank's tree in index order as
    # they arrive (the tree is the one a pairwise reduction gives, see RawTree.merge), so only
    # one tree is held, not one per profile.
    local_tree: RawTree | None = None

    def fold(data: ProfileData) -> None:
        nonlocal local_tree
        if local_tree is None:
            local_tree = data.tree
        else:
            data.remap(local_tree.merge(data.tree))
            data.tree = local_tree

    loaded: list[_Loaded] = []
    with stage("reading profiles", len(mine)) as advance:
        for item in parallel_map(load, mine, options.jobs, advance):
            if item.data is not None:
                fold(item.data)
            loaded.append(item)
    briefs = []
    for item in loaded:
        brief = _Brief(item.index, item.problem, item.warnings, item.notes)
        if item.data is not None:
            brief.name = item.data.name
            brief.metrics = item.data.metrics
            brief.id_tuple = item.data.id_tuple
            brief.program = item.data.header.get("program-name", "")
            brief.module_paths = item.data.module_paths
        briefs.append(brief)
    everyone = [b for part in comm.allgather(briefs) for b in part]

    # The serial pipeline's decisions, taken identically on every rank.
    problems: list[str] = []
    good: list[_Brief] = []
    for brief in everyone:
        if root:
            for message in brief.warnings:
                warnings.warn(message, FormatWarning, stacklevel=2)
        if options.strict and brief.notes:
            raise ProfileError(f"{brief.notes[0]} (--strict)")
        problems.extend(brief.notes)
        if brief.problem is not None:
            if options.strict:
                raise ProfileError(f"{brief.problem} (--strict)")
            problems.append(f"skipped: {brief.problem}")
        else:
            good.append(brief)
    table = MetricTable()
    usable: list[_Brief] = []
    mappings: dict[int, npt.NDArray[np.int64]] = {}
    for brief in good:
        try:
            mappings[brief.index] = table.add_table(brief.name, brief.metrics)
        except ProfileError as error:
            if options.strict:
                raise
            problems.append(f"skipped: {error}")
            continue
        usable.append(brief)
    if not usable:
        raise ProfileError(
            "no usable profile: " + "; ".join(problems) if problems else "no usable profile"
        )
    position = {brief.index: p for p, brief in enumerate(usable)}
    own = [
        (item.index, item.data)
        for item in loaded
        if item.data is not None and item.index in position
    ]
    if len(own) != sum(1 for item in loaded if item.data is not None):
        # Profiles were dropped for their metric tables after being folded in: fold again
        # without them (rare; they are read again rather than kept).
        local_tree = None
        again = list(parallel_map(load, [i for i, _ in own], options.jobs, lambda n: None))
        own = []
        for item in again:
            if item.data is None:
                raise ProfileError(f"{item.problem} (changed while pyprof-mpi was running?)")
            fold(item.data)
            own.append((item.index, item.data))
    del loaded

    # Stage 2: unification across ranks.
    with stage("unifying call paths", len(usable)) as advance:
        merged = _tree_reduce(comm, local_tree)
        shared: tuple[object, ...] | None = None
        if root:
            assert merged is not None
            shared = merged.wire()
        shared = comm.bcast(shared)
        assert shared is not None
        n_raw = len(shared[0])  # type: ignore[arg-type]
        everything: RawTree | None = merged
        if not root and local_tree is not None:
            everything = RawTree.from_wire(shared)
            mapping = everything.merge(local_tree)
            if len(everything) != n_raw:  # pragma: no cover - would be a bug
                raise ProfileError("internal error: a rank's call paths are not in the tree")
            for _, data in own:
                data.remap(mapping)
        advance(len(usable))

    weights: npt.NDArray[np.float64] | None = None
    if any(WEIGHT_METRIC in {m.name for m in b.metrics} for b in usable):
        parts = comm.gather(_local_weights(n_raw, own))
        if parts is not None:
            weights = np.zeros(n_raw, dtype=np.float64)
            for part in parts:
                weights += part

    # Stage 3: expansion on rank 0.
    partials = PARTIALS_STATS if options.metrics == "stats" else PARTIALS_SUM
    holder: list[ContextTree] = []

    def expansion_plan() -> _Plan:
        assert merged is not None
        raw = merged
        used_modules = {key[0] for key in raw.keys if key[0] is not None}
        module_dirs: dict[str, Path] = {}
        for brief in usable:
            for module, measurement in brief.module_paths.items():
                if module in used_modules:
                    module_dirs.setdefault(module, Path(measurement))
        explicit, found = load_structures(options, [sources[b.index] for b in usable], used_modules)
        classifiers = build_classifiers(
            module_dirs.items(), explicit, found, problems, not options.ignore_structs
        )
        expansion = expand(raw, classifiers)
        expansion = reconstruct_gpu_contexts(raw, expansion, classifiers, [], weights, problems)
        tree = expansion.tree
        holder.append(tree)
        title = options.title or usable[0].program or "database"
        output = options.output or default_output(options, title)
        return _Plan(
            shape=TreeShape.of(tree),
            visible=tree.visible_ancestor(),
            call_ctx=expansion.call_ctx,
            leaf_ctx=expansion.leaf_ctx,
            splits=(
                expansion.split_node,
                expansion.split_leaf,
                expansion.split_call,
                expansion.split_fraction,
            ),
            title=title,
            output=output,
            replacing=os.path.lexists(output),
        )

    with stage("expanding contexts", 1) as advance:
        plan = _on_root(comm, expansion_plan)
        advance(1)
    placement = Expansion(ContextTree(), plan.call_ctx, plan.leaf_ctx, *plan.splits)
    n_contexts = len(plan.shape)

    # The staging directory, made by rank 0, where rank 0 starts writing meta.db,
    # metrics/default.yaml and src/ on a thread while every rank goes on with its profiles.
    def stage_files() -> Path:
        prepare_output(plan.output, options.force)
        staging = make_staging(plan.output)
        for name in ("profile.db", "cct.db"):
            os.close(os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))
        return staging

    staging = _on_root(comm, _writing(plan, stage_files))
    meta_errors: list[BaseException] = []

    def write_meta() -> None:
        try:
            db = AggregateDatabase(
                title=plan.title,
                tree=holder[0],
                metrics=table.metrics,
                bases=bases_by_name,
                partials=partials,
                profiles=[],
                summary=SparseValues.empty(),
                formulas=table.formulas,
            )
            if options.copy_sources:
                db.copied_files |= copy_sources(db.files(), staging)
            metadb.write(build_metadb(db), staging / "meta.db")
            write_taxonomy(
                staging,
                default_yaml(
                    table.metrics,
                    table.formulas,
                    partials,
                    EXTRA_ROOTS if options.derived else (),
                ),
            )
        except BaseException as error:  # re-raised by finish()
            meta_errors.append(error)

    bases_by_name, global_base, move = metric_bases(table.metrics, partials)
    meta_thread = threading.Thread(target=write_meta, name="pyprof-mpi-meta", daemon=True)
    if root:
        meta_thread.start()
    finished = False
    spill: _Spill | None = None
    try:
        # Stage 4: per-profile statistics and traces on their ranks.
        tuples = id_tuples([b.id_tuple for b in usable])

        spill = _open_spill(comm) if memory_limit is not None else None
        local_counts = np.zeros(n_contexts, dtype=np.int64)
        count_lock = threading.Lock()

        merge_lock = threading.Lock()

        def statistics(item: tuple[int, ProfileData]) -> _Mine:
            index, data = item
            if light:  # read the profile again, now for its values and trace
                again = _load_one(index, sources[index])
                if again.data is None:
                    raise ProfileError(f"{again.problem} (changed while pyprof-mpi was running?)")
                assert everything is not None
                with merge_lock:
                    before = len(everything)
                    mapping = everything.merge(again.data.tree)
                    if len(everything) != before:
                        raise ProfileError(
                            f"{again.data.name}: changed while pyprof-mpi was running"
                        )
                data = again.data
                data.remap(mapping)
            values = profile_statistics(
                data, mappings[index], placement, plan.shape, global_base, move
            )
            block = _block_of(values)
            per_context = np.bincount(values.ctx, minlength=n_contexts)
            with count_lock:
                local_counts[:] += per_context
            del values, per_context
            line = None
            span = None
            if data.trace_time is not None and data.trace_node is not None:
                trace = rewrite_trace(
                    data.trace_time,
                    data.trace_node,
                    placement.call_ctx if data.call_trace else placement.leaf_ctx,
                    plan.visible,
                )
                line = tracedb.TraceLine.from_arrays(position[index] + 1, trace.time, trace.ctx)
                if len(trace.time):
                    span = (int(trace.time[0]), int(trace.time[-1]))
            # The raw arrays are no longer needed: free them before the next profile.
            data.value_node = data.value_metric = np.zeros(0, dtype=np.int64)
            data.value = np.zeros(0, dtype=np.float64)
            data.trace_time = data.trace_node = None
            at = spill.put(block) if spill is not None else -1
            return _Mine(
                position[index],
                block.n_values,
                block.n_contexts,
                None if spill is not None else block,
                at,
                line,
                span,
            )

        with stage("computing statistics", len(own)) as advance:
            done = _on_all(comm, lambda: list(parallel_map(statistics, own, options.jobs, advance)))
        own.clear()

        tallies = [
            (
                m.position,
                m.n_values,
                m.n_contexts,
                -1 if m.trace is None else len(m.trace.elements),
                m.trace_range,
            )
            for m in done
        ]
        n_profiles = len(usable)
        n_values = np.zeros(n_profiles + 1, dtype=np.int64)
        n_ctxs = np.zeros(n_profiles + 1, dtype=np.int64)
        trace_counts = np.full(n_profiles, -1, dtype=np.int64)
        low: int | None = None
        high: int | None = None
        for shard in comm.allgather(tallies):
            for where, nv, nc, nt, span in shard:
                n_values[where + 1], n_ctxs[where + 1], trace_counts[where] = nv, nc, nt
                if span is not None:
                    low = span[0] if low is None else min(low, span[0])
                    high = span[1] if high is None else max(high, span[1])
        infos = [profiledb.ProfileInfo(is_summary=True, id_tuple=None)] + [
            profiledb.ProfileInfo(
                is_summary=False,
                id_tuple=tuple(
                    profiledb.IdTupleElement(e.kind, e.is_physical, e.logical, e.physical)
                    for e in elements
                ),
            )
            for elements in tuples
        ]

        report = _write_all(
            comm,
            plan,
            staging,
            done,
            spill,
            local_counts,
            infos,
            n_values,
            n_ctxs,
            trace_counts,
            (low, high),
            n_contexts,
            partials,
            memory_limit,
            stage,
        )

        def finish() -> RunReport:
            meta_thread.join()
            if meta_errors:
                raise meta_errors[0]
            commit_directory(staging, plan.output)
            return RunReport(
                output=plan.output,
                profiles=n_profiles,
                contexts=n_contexts,
                metrics=sum(1 for m in table.metrics if not m.is_derived),
                traces=report,
                problems=tuple(problems),
            )

        result = _on_root(comm, _writing(plan, finish))
        finished = True
        return result
    finally:
        if spill is not None:
            spill.close()
        if root and meta_thread.is_alive():
            meta_thread.join()
        if root and not finished:
            shutil.rmtree(staging, ignore_errors=True)


def _write_all(
    comm: Comm,
    plan: _Plan,
    staging: Path,
    done: list[_Mine],
    spill: _Spill | None,
    local_counts: npt.NDArray[np.int64],
    infos: list[profiledb.ProfileInfo],
    n_values: npt.NDArray[np.int64],
    n_ctxs: npt.NDArray[np.int64],
    trace_counts: npt.NDArray[np.int64],
    span: tuple[int | None, int | None],
    n_contexts: int,
    partials: tuple[Partial, ...],
    memory_limit: int | None,
    stage: Progress,
) -> int:
    """Stages 4-5 on every rank: profile.db, trace.db and cct.db; the number of traces."""
    profile_plan = profiledb.layout(infos, n_values, n_ctxs)  # summary (0) sized later

    def write_planes() -> None:
        fd = os.open(staging / "profile.db", os.O_WRONLY)
        try:
            for m in done:
                profiledb.write_block(fd, profile_plan, m.position + 1, m.load(spill))
        finally:
            os.close(fd)
        if trace_counts.size and np.any(trace_counts >= 0):
            fd = os.open(staging / "trace.db", os.O_WRONLY | os.O_CREAT, 0o666)
            try:
                for m in done:
                    if m.trace is not None:
                        tracedb.write_line(fd, trace_plan, m.position, m.trace.elements)
            finally:
                os.close(fd)

    lines = np.maximum(trace_counts, 0)
    low, high = span
    trace_plan = tracedb.layout(
        list(range(1, len(trace_counts) + 1)),
        lines,
        lines,
        0 if low is None else low,
        0 if high is None else high,
    )
    with stage("writing profiles", len(done)) as advance:
        _on_all(comm, _writing(plan, write_planes))
        advance(len(done))

    # Stage 5: cct.db in rounds, and the summary.
    nnz = comm.allreduce_sum(local_counts)
    rounds = plan_rounds(nnz, comm.size, memory_limit)
    shape = plan.shape
    eligible = np.zeros(n_contexts, dtype=bool)
    if n_contexts:
        parent = shape.parent
        has_parent = parent >= 0
        eligible = shape.lexical & ~shape.loop & has_parent
        eligible &= shape.loop[np.maximum(parent, 0)]
    loop_children = np.flatnonzero(eligible).astype(np.int64)
    loop_parents = shape.parent[loop_children] if n_contexts else loop_children

    empty_cct = cctdb.layout(np.zeros(n_contexts, np.int64), np.zeros(n_contexts, np.int64))
    cursor = empty_cct.footer_at
    summary_parts: list[SparseValues] = []
    n_metrics = np.zeros(n_contexts, dtype=np.int64)
    with stage("writing cct.db", len(rounds)) as advance:
        for start, stop in rounds:
            owners = split_even(nnz[start:stop], comm.size) + start
            outgoing = _outgoing(comm.size, done, spill, owners, loop_children, loop_parents)
            incoming = cast(list[_Payload], comm.alltoall_arrays(list(outgoing)))
            del outgoing
            lo, hi = int(owners[comm.rank]), int(owners[comm.rank + 1])
            piece = _on_all(comm, partial(_own_window, incoming, lo, hi, shape, partials))
            del incoming
            sizes = comm.allgather(piece.size)
            at = cursor + sum(sizes[: comm.rank])
            _on_all(comm, _writing(plan, partial(_pwritev, staging / "cct.db", piece.pieces, at)))
            del piece.pieces[:]
            cursor += sum(sizes)
            gathered = comm.gather((lo, piece.n_metrics, piece.summary))
            if gathered is not None:
                for where, metrics_here, summary in gathered:
                    n_metrics[where : where + len(metrics_here)] = metrics_here
                    summary_parts.append(summary)
            advance(1)

    def finish_files() -> int:
        cct_plan = cctdb.layout(nnz, n_metrics)
        if cct_plan.footer_at != cursor:
            raise ProfileError("internal error: cct.db blocks do not add up to the layout")
        fd = os.open(staging / "cct.db", os.O_WRONLY)
        try:
            cctdb.write_head(fd, cct_plan)
            cctdb.write_footer(fd, cct_plan)
        finally:
            os.close(fd)
        summary = SparseValues(
            np.concatenate([p.ctx for p in summary_parts] or [np.zeros(0, np.int64)]),
            np.concatenate([p.metric for p in summary_parts] or [np.zeros(0, np.int64)]),
            np.concatenate([p.value for p in summary_parts] or [np.zeros(0, np.float64)]),
        )
        block = profiledb.ProfileValues.from_triples(summary.ctx, summary.metric, summary.value)
        n_values[0], n_ctxs[0] = block.n_values, block.n_contexts
        final = profiledb.layout(infos, n_values, n_ctxs)
        fd = os.open(staging / "profile.db", os.O_WRONLY)
        try:
            profiledb.write_head(fd, final)
            profiledb.write_block(fd, final, 0, block)
            profiledb.write_footer(fd, final)
        finally:
            os.close(fd)
        if np.any(trace_counts >= 0):
            fd = os.open(staging / "trace.db", os.O_WRONLY)
            try:
                tracedb.write_head(fd, trace_plan)
                tracedb.write_footer(fd, trace_plan)
            finally:
                os.close(fd)
        return int(np.count_nonzero(trace_counts > 0))

    return _on_root(comm, _writing(plan, finish_files))


@dataclass(slots=True)
class _Window:
    """One rank's share of a round: its cct.db bytes, metric counts and summary values."""

    pieces: list[memoryview]
    size: int
    n_metrics: npt.NDArray[np.int64]
    summary: SparseValues


_Payload = tuple[
    npt.NDArray[np.int32],
    npt.NDArray[np.uint16],
    npt.NDArray[np.int32],
    npt.NDArray[np.float64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
]
"""(ctx, metric, profile index, value) of the owner's contexts, then (ctx, metric, value) of
``function``-scope values of loop children the owner needs for its loops' summary."""


def _pwritev(path: Path, pieces: list[memoryview], offset: int) -> None:
    """Write ``pieces`` back to back at ``offset`` of ``path`` (``os.pwritev``, 1024 at a time)."""
    if not pieces:
        return
    fd = os.open(path, os.O_WRONLY)
    try:
        for start in range(0, len(pieces), 1024):
            batch = pieces[start : start + 1024]
            want = sum(len(p) for p in batch)
            done = os.pwritev(fd, batch, offset)
            if done != want:  # a short write: finish piece by piece
                for piece in batch:
                    _pwrite(fd, np.frombuffer(piece, np.uint8), offset)
                    offset += len(piece)
            else:
                offset += done
    finally:
        os.close(fd)


def _pwrite(fd: int, image: npt.NDArray[np.uint8], offset: int) -> None:
    """``os.pwrite`` all of ``image`` at ``offset``."""
    view = memoryview(np.ascontiguousarray(image).data).cast("B")
    while len(view):
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _joined(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _joined_float(parts: list[npt.NDArray[np.float64]]) -> npt.NDArray[np.float64]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


def _outgoing(
    ranks: int,
    done: list[_Mine],
    spill: _Spill | None,
    owners: npt.NDArray[np.int64],
    loop_children: npt.NDArray[np.int64],
    loop_parents: npt.NDArray[np.int64],
) -> list[_Payload]:
    """What this rank sends each owner in one round, profile by profile in index order."""
    start, stop = int(owners[0]), int(owners[-1])
    # Per owner: lists of (ctx, metric, profile index, value) slices, profile by profile.
    parts: list[
        tuple[
            list[npt.NDArray[np.int32]],
            list[npt.NDArray[np.uint16]],
            list[npt.NDArray[np.int32]],
            list[npt.NDArray[np.float64]],
        ]
    ] = [([], [], [], []) for _ in range(ranks)]
    # Loop children outside their parent's owner's range, per owner.
    in_window = (loop_parents >= start) & (loop_parents < stop)
    children = loop_children[in_window]
    child_owner = np.searchsorted(owners, loop_parents[in_window], side="right") - 1
    foreign = (children < owners[child_owner]) | (children >= owners[child_owner + 1])
    children, child_owner = children[foreign], child_owner[foreign]
    order = np.argsort(children, kind="stable")
    children, child_owner = children[order], child_owner[order]
    extra_ctx: list[npt.NDArray[np.int64]] = []
    extra_metric: list[npt.NDArray[np.int64]] = []
    extra_value: list[npt.NDArray[np.float64]] = []
    extra_owner: list[npt.NDArray[np.int64]] = []
    for m in done:
        block = m.load(spill)
        ids = block.ctx_ids().astype(np.int64)
        bounds = block.bounds().astype(np.int64)
        # Blocks are sorted by context and owners hold contiguous ranges: one search cuts
        # the block into the owners' slices.
        cut = np.searchsorted(ids, owners)
        if cut[-1] > cut[0]:
            at = bounds[cut].tolist()
            cuts = cut.tolist()
            ids32 = ids.astype(np.int32)
            counts = np.diff(bounds)
            metric_ids = block.values["metric_id"]
            values = block.values["value"]
            for r in range(ranks):
                c0, c1 = cuts[r], cuts[r + 1]
                if c1 > c0:
                    v0, v1 = at[r], at[r + 1]
                    ctx_r, metric_r, prof_r, value_r = parts[r]
                    ctx_r.append(np.repeat(ids32[c0:c1], counts[c0:c1]))
                    metric_r.append(metric_ids[v0:v1].astype(np.uint16))  # copies
                    prof_r.append(np.full(v1 - v0, m.position + 1, dtype=np.int32))
                    value_r.append(values[v0:v1].astype(np.float64))
        if len(children) and len(ids):
            at_child = np.minimum(np.searchsorted(ids, children), len(ids) - 1)
            present = ids[at_child] == children
            if np.any(present):
                rows = at_child[present]
                count = bounds[rows + 1] - bounds[rows]
                index = np.repeat(bounds[rows], count) + (
                    np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
                )
                metric = block.values["metric_id"][index].astype(np.int64)
                keep = metric % N_SCOPES == SCOPE_FUNCTION
                extra_ctx.append(np.repeat(children[present], count)[keep])
                extra_metric.append(metric[keep])
                extra_value.append(np.asarray(block.values["value"][index][keep], np.float64))
                extra_owner.append(np.repeat(child_owner[present], count)[keep])

    e_ctx = _joined(extra_ctx)
    e_metric = _joined(extra_metric)
    e_value = _joined_float(extra_value)
    e_owner = _joined(extra_owner)
    e_by = np.argsort(e_owner, kind="stable")
    e_cuts = np.searchsorted(e_owner[e_by], np.arange(ranks + 1))
    result: list[_Payload] = []
    for r in range(ranks):
        extra = e_by[e_cuts[r] : e_cuts[r + 1]]
        ctx_r, metric_r, prof_r, value_r = parts[r]
        result.append(
            (
                np.concatenate(ctx_r) if ctx_r else np.zeros(0, np.int32),
                np.concatenate(metric_r) if metric_r else np.zeros(0, np.uint16),
                np.concatenate(prof_r) if prof_r else np.zeros(0, np.int32),
                np.concatenate(value_r) if value_r else np.zeros(0, np.float64),
                e_ctx[extra],
                e_metric[extra],
                e_value[extra],
            )
        )
        parts[r] = ([], [], [], [])
    return result


def _own_window(
    incoming: list[_Payload], lo: int, hi: int, shape: TreeShape, partials: tuple[Partial, ...]
) -> _Window:
    """cct.db blocks of contexts ``lo..hi-1`` (slices to write in order), their summary values."""
    ctx = np.concatenate([p[0] for p in incoming]).astype(np.int64)
    metric = np.concatenate([p[1] for p in incoming]).astype(np.int64)
    prof = np.concatenate([p[2] for p in incoming])
    value = np.concatenate([p[3] for p in incoming])
    key = (ctx << 16) | metric
    order = np.argsort(key, kind="stable")
    key, prof_sorted, value_sorted = key[order], prof[order], value[order]
    del order
    span = hi - lo
    local = (key >> 16) - lo
    n_values = np.bincount(local, minlength=span).astype(np.int64)
    new_metric = np.ones(len(key), dtype=bool)
    new_metric[1:] = key[1:] != key[:-1]
    first = np.flatnonzero(new_metric)
    n_metrics = np.bincount(local[first], minlength=span).astype(np.int64)
    value_bounds = np.concatenate([[0], np.cumsum(n_values)])
    sizes = n_values * cctdb.CCT_VALUE_DTYPE.itemsize + (
        (n_metrics * cctdb.CCT_METRIC_INDEX_DTYPE.itemsize + 3) // 4 * 4
    )
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    pieces: list[memoryview] = []
    if len(key):
        records = np.empty(len(key), cctdb.CCT_VALUE_DTYPE)
        records["prof_index"] = prof_sorted
        records["value"] = value_sorted
        index = np.empty(len(first), cctdb.CCT_METRIC_INDEX_DTYPE)
        index["metric_id"] = (key[first] & 0xFFFF).astype(np.uint16)
        index["start"] = first - value_bounds[local[first]]
        # Each block is [values][metric indices][padding]: the values and indices of all
        # blocks are two sorted arrays, so the file bytes are alternating slices of them,
        # written with one pwritev per 1024 slices (no image of the window is built).
        value_bytes = (n_values * cctdb.CCT_VALUE_DTYPE.itemsize).tolist()
        index_bytes = (n_metrics * cctdb.CCT_METRIC_INDEX_DTYPE.itemsize).tolist()
        pads = (sizes.astype(np.int64) - n_values * 12 - n_metrics * 10).tolist()
        values_view = memoryview(records.view(np.uint8).data).cast("B")
        index_view = memoryview(index.view(np.uint8).data).cast("B")
        zeros = memoryview(bytes(4))
        v = i = 0
        for nv, ni, pad in zip(value_bytes, index_bytes, pads, strict=True):
            if nv:
                pieces.append(values_view[v : v + nv])
                v += nv
            if ni:
                pieces.append(index_view[i : i + ni])
                i += ni
            if pad:
                pieces.append(zeros[:pad])
    # The summary from the sorted rows (summarize's stable sort then finds them in order).
    extra = [p for p in incoming if len(p[4])]
    del ctx, metric, prof, value
    summary_input = SparseValues(
        np.concatenate([key >> 16] + [p[4] for p in extra]),
        np.concatenate([key & 0xFFFF] + [p[5] for p in extra]),
        np.concatenate([value_sorted] + [p[6] for p in extra]),
    )
    del key, prof_sorted, value_sorted
    summary = summarize(shape, [summary_input], partials)
    inside = (summary.ctx >= lo) & (summary.ctx < hi)
    return _Window(
        pieces,
        int(offsets[-1]),
        n_metrics,
        SparseValues(summary.ctx[inside], summary.metric[inside], summary.value[inside]),
    )


__all__ = [
    "BYTES_PER_VALUE",
    "MAX_ROUND_VALUES",
    "DistributedError",
    "plan_rounds",
    "run_distributed",
    "split_even",
]

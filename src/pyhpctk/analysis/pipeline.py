"""pyprof's streaming aggregation, stage by stage (architecture.md, "Analysis").

1. *Input acquisition*: list the profiles of every measurement directory and read them on ``-j``
   worker threads; each worker takes the next profile as soon as it is free (dynamic balance).
   A damaged profile is reported and skipped (``strict`` makes it fatal).
2. *Call path unification*: every profile's CCT becomes a :class:`~.unify.RawTree`; the trees are
   merged by a pairwise reduction (associative, so any split of profiles over workers or ranks
   gives the same tree).
3. *Calling context expansion*: frames become contexts through structure files, ELF symbols,
   logical (Python) metadata or as raw instructions (:mod:`.expand`).
4. *Statistic generation*: per-profile scopes (:func:`.stats.propagate`) on the workers, then the
   summary profile (:func:`.stats.summarize`).
5. *Traces*: records rewritten to final contexts, sorted when out of order.

Nothing here writes files; :mod:`.write` does that with the format modules.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis import inputs, kernel_symbols
from pyhpctk.analysis.database import AggregateDatabase, IdElement, ProfileResult, Trace
from pyhpctk.analysis.expand import Expansion, LogicalFunction, ModuleClassifiers, expand
from pyhpctk.analysis.gpu import reconstruct_gpu_contexts
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.python_loops import PythonLoops
from pyhpctk.analysis.stats import SparseValues, TreeShape, profile_scopes, summarize
from pyhpctk.analysis.structmap import StructureIndex, index_structure
from pyhpctk.analysis.symbols import read_symbols
from pyhpctk.analysis.unify import ProfileData, Unified, combine, extract, leaf
from pyhpctk.core.context import ROOT
from pyhpctk.core.metrics import N_SCOPES, PARTIALS_STATS, PARTIALS_SUM, MetricInfo, Partial
from pyhpctk.errors import FormatError, FormatWarning, PyhpctkError
from pyhpctk.formats.hpcrun_model import (
    INTERP_BOTH_VALID,
    INTERP_LOGIC_GLOBAL,
    INTERP_LOGIC_LOCAL,
    id_interpretation,
    id_kind,
)

T = TypeVar("T")
R = TypeVar("R")


class ProfileError(PyhpctkError):
    """A profile cannot be used (damaged, or its metric table disagrees with the others)."""

    exit_code = 2


Progress = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]
"""``progress(stage label, total)`` gives a context manager whose value advances the bar."""


def _no_progress(label: str, total: int) -> AbstractContextManager[Callable[[int], None]]:
    return nullcontext(lambda n: None)


@dataclass(slots=True)
class _Loaded:
    index: int
    data: ProfileData | None
    problem: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _load_one(index: int, source: inputs.ProfileSource) -> _Loaded:
    """Read and extract one profile; a damaged trace costs only the trace (and is reported)."""
    from pyhpctk.formats import hpcrun, hpctrace

    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FormatWarning)
        try:
            profile = hpcrun.read(source.profile)
            trace = None
            if source.trace is not None:
                try:
                    trace = hpctrace.read(source.trace)
                except PyhpctkError as error:
                    notes.append(f"trace dropped: {error}")
            try:
                data = extract(
                    profile, trace, source.name, str(source.profile), str(source.measurement)
                )
            except PyhpctkError as error:
                if trace is None or error.__class__ is not FormatError or "trace" not in str(error):
                    raise
                notes.append(f"trace dropped: {error}")
                data = extract(
                    profile, None, source.name, str(source.profile), str(source.measurement)
                )
        except PyhpctkError as error:
            return _Loaded(index, None, str(error))
        except (OSError, ValueError, IndexError, KeyError) as error:  # defensive: never a traceback
            return _Loaded(index, None, f"{source.profile}: cannot read: {error}")
    return _Loaded(index, data, None, [str(w.message) for w in caught], notes)


def parallel_map(
    function: Callable[[T], R], items: Sequence[T], jobs: int, advance: Callable[[int], None]
) -> Iterator[R]:
    """``function`` over ``items`` on ``jobs`` threads, yielding results in input order.

    Work is handed out one item at a time as workers free up, so a few large profiles do not
    leave other workers idle (dynamic load balance).
    """
    if jobs <= 1 or len(items) <= 1:
        for item in items:
            result = function(item)
            advance(1)
            yield result
        return
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures: list[Future[R]] = [pool.submit(function, item) for item in items]
        for future in futures:
            result = future.result()
            advance(1)
            yield result


def reduce_pairwise(parts: list[Unified], jobs: int) -> Unified:
    """Merge partial unifications pairwise (a tree reduction of depth log2 n)."""
    if not parts:
        raise ProfileError("no profile could be read")
    while len(parts) > 1:
        pairs = [(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        odd = [parts[-1]] if len(parts) % 2 else []
        if jobs > 1 and len(pairs) > 1:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                merged = list(pool.map(lambda p: combine(*p), pairs))
        else:
            merged = [combine(a, b) for a, b in pairs]
        parts = merged + odd
    return parts[0]


# --------------------------------------------------------------------------------------------
# Metrics


@dataclass(slots=True)
class MetricTable:
    """The union of the profiles' metric tables, by name, in first-seen order."""

    metrics: list[MetricInfo] = field(default_factory=list)
    by_name: dict[str, int] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)

    def add(self, data: ProfileData) -> npt.NDArray[np.int64]:
        """Map a profile's metric indices to global ones; ProfileError on a disagreement."""
        return self.add_table(data.name, data.metrics)

    def add_table(self, name: str, table: list[MetricInfo]) -> npt.NDArray[np.int64]:
        """:meth:`add` for profile ``name`` whose metric table is ``table``."""
        mapping = np.empty(len(table), dtype=np.int64)
        for local, metric in enumerate(table):
            found = self.by_name.get(metric.name)
            if found is None:
                found = len(self.metrics)
                self.by_name[metric.name] = found
                self.metrics.append(metric)
                self.origin[metric.name] = name
                if metric.formula:
                    self.formulas[metric.name] = _named_formula(metric.formula, table)
            else:
                known = self.metrics[found]
                for attr in ("is_real", "period", "move_to_proc", "formula"):
                    if getattr(known, attr) != getattr(metric, attr):
                        raise ProfileError(
                            f"{name}: metric table disagrees with "
                            f"{self.origin[metric.name]}: metric {metric.name!r} has "
                            f"{attr}={getattr(metric, attr)!r} here and "
                            f"{getattr(known, attr)!r} there"
                        )
            mapping[local] = found
        return mapping


def _named_formula(formula: str, metrics: list[MetricInfo]) -> str:
    """Replace ``#N`` references (0-based table indices) by ``#{name}`` placeholders."""
    import re

    def name(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return "#{" + metrics[index].name + "}" if index < len(metrics) else match.group(0)

    return re.sub(r"#(\d+)", name, formula)


# --------------------------------------------------------------------------------------------
# Identifier tuples (formats.md §1.8 -> §3.3)


def id_tuples(raw: list[list[tuple[int, int, int]]]) -> list[tuple[IdElement, ...]]:
    """profile.db identifier tuples, generating dense logical ids where hpcrun left them to us.

    LOGIC_LOCAL: dense among profiles with the same tuple prefix; LOGIC_GLOBAL: dense among all
    values of that kind; LOGIC_ONLY and BOTH_VALID keep the stored logical id. Physical flags are
    set for everything but LOGIC_ONLY.
    """
    local: dict[tuple[object, ...], set[int]] = {}
    global_: dict[int, set[int]] = {}
    for elements in raw:
        for depth, (kind_word, physical, _logical) in enumerate(elements):
            interp = id_interpretation(kind_word)
            kind = id_kind(kind_word)
            if interp == INTERP_LOGIC_LOCAL:
                prefix = (kind, *[(id_kind(k), p) for k, p, _ in elements[:depth]])
                local.setdefault(prefix, set()).add(physical)
            elif interp == INTERP_LOGIC_GLOBAL:
                global_.setdefault(kind, set()).add(physical)
    local_rank = {k: {v: i for i, v in enumerate(sorted(s))} for k, s in local.items()}
    global_rank = {k: {v: i for i, v in enumerate(sorted(s))} for k, s in global_.items()}
    result = []
    for elements in raw:
        out = []
        for depth, (kind_word, physical, logical) in enumerate(elements):
            interp = id_interpretation(kind_word)
            kind = id_kind(kind_word)
            if interp == INTERP_LOGIC_LOCAL:
                prefix = (kind, *[(id_kind(k), p) for k, p, _ in elements[:depth]])
                logical = local_rank[prefix][physical]
            elif interp == INTERP_LOGIC_GLOBAL:
                logical = global_rank[kind][physical]
            physical_flag = interp in (INTERP_LOGIC_LOCAL, INTERP_LOGIC_GLOBAL, INTERP_BOTH_VALID)
            out.append(IdElement(kind, physical_flag, logical, physical))
        result.append(tuple(out))
    return result


# --------------------------------------------------------------------------------------------
# Structure, symbols, logical metadata


PYTHON_SUFFIXES = (".py", ".pyw")


def _is_relative(path: str) -> bool:
    return not path.startswith("/")


def structure_binary(path: Path) -> str | None:
    """The ``LM n`` of a structure file, read from its head without parsing the whole file.

    Structure files of big libraries run to megabytes; pyprof only parses those describing a
    binary the profiles use. None when no ``<LM`` element appears in the first megabyte.
    """
    import html
    import re

    try:
        with open(path, "rb") as stream:
            head = stream.read(1 << 20)
    except OSError:
        return None
    match = re.search(rb"<LM\b[^>]*?\sn=\"([^\"]*)\"", head)
    if match is None:
        return None
    return html.unescape(match.group(1).decode("utf-8", errors="replace"))


def load_structures(
    options: ProfOptions,
    sources: Iterable[inputs.ProfileSource],
    used_modules: Iterable[str] = (),
) -> tuple[list[StructureIndex], list[StructureIndex]]:
    """(``-S`` indexes, ``MEAS/structs`` indexes), each file parsed with formats.hpcstruct.

    Files in ``MEAS/structs`` whose binary no profile uses are skipped unparsed; ``-S`` files
    are always parsed (an unused one is reported as a problem).
    """
    if options.ignore_structs:
        return [], []
    from pyhpctk.formats import hpcstruct

    used = list(used_modules)
    explicit: list[StructureIndex] = []
    for path in options.structs:
        if not path.is_file():
            raise inputs.InputError(f"{path}: no such structure file")
        explicit += index_structure(hpcstruct.read(path))
    found: list[StructureIndex] = []
    for measurement in dict.fromkeys(s.measurement for s in sources):
        for path in inputs.structure_files(measurement):
            binary = structure_binary(path)
            # Python sources are kept: logical frames name them by file, not as load modules.
            if (
                binary is not None
                and used
                and not binary.endswith(PYTHON_SUFFIXES)
                and not any(_same_binary(m, binary) for m in used)
            ):
                continue
            found += index_structure(hpcstruct.read(path))
    return explicit, found


def _same_binary(module: str, described: str) -> bool:
    if module == described:
        return True
    if _is_relative(described) and module.endswith("/" + described):
        return True
    return _is_relative(module) and described.endswith("/" + module)


def build_classifiers(
    module_paths: Iterable[tuple[str, Path]],
    explicit: list[StructureIndex],
    found: list[StructureIndex],
    problems: list[str],
    line_maps: bool = True,
) -> ModuleClassifiers:
    """Choose, for every load module the profiles use, how its frames are classified.

    ``line_maps``: captured binaries without a structure file get their DWARF line map (off
    under ``--ignore-structs``, which asks for hpcrun's raw frames).
    """
    classifiers = ModuleClassifiers()
    used_explicit: set[int] = set()
    for module, measurement in module_paths:
        kernel = kernel_symbols.load(module, measurement, problems)  # perf events' kernel frames
        if kernel is not None:
            classifiers.symbols[module] = kernel
            continue
        if module.startswith("<"):  # pseudo-modules (GPU range trees) have no file
            continue
        stem = Path(module).name
        if module.startswith("logical/") or "/logical/" in module:
            where = measurement / module if _is_relative(module) else Path(module)
            stanzas = _read_logical(where)
            if stanzas is not None:
                classifiers.logical[module] = stanzas
                generator = stem.split(".", 1)[0]
                classifiers.presented_path[module] = f"<logical {generator}>"
                continue
            problems.append(f"{where}: unreadable logical metadata; its frames stay raw")
        match = None
        for number, index in enumerate(explicit):
            if _same_binary(module, index.path):
                match = index
                used_explicit.add(number)
                break
        if match is None:
            match = next((index for index in found if _same_binary(module, index.path)), None)
        if match is not None:
            classifiers.structures[module] = match
            continue
        captured = captured_binary(module, measurement)
        if captured is not None and line_maps:
            # A binary captured in the measurement directory (gpubins/, vdso/) is the very one
            # that ran: without a structure file, its DWARF line map still gives functions and
            # lines. Binaries found elsewhere by path are not used: the analysis machine's copy
            # may not be the one measured (pystruct MEAS analyzes them on purpose).
            fallback = line_map_structure(captured, module)
            if fallback is not None:
                classifiers.structures[module] = fallback
                problems.append(
                    f"{module}: no structure file; used its DWARF line map "
                    "(run pystruct on the measurements for loops, inlined code and call sites)"
                )
                continue
        if _is_relative(module):
            table = read_symbols(measurement / module)
            if table is not None and table[0]:
                classifiers.symbols[module] = table
    # Python sources' structure (pystruct): loops for the logical frames of those files.
    sources = {
        stanza.file
        for stanzas in classifiers.logical.values()
        for stanza in stanzas.values()
        if stanza.file
    }
    for number, index in [*enumerate(explicit), *((-1, index) for index in found)]:
        if index.path.endswith(PYTHON_SUFFIXES) and index.path in sources:
            classifiers.python_loops.setdefault(index.path, PythonLoops(index.module))
            used_explicit.add(number)
    for number, index in enumerate(explicit):
        if number not in used_explicit:
            problems.append(
                f"structure file for {index.path} was not used: no profile has frames in it "
                "(a structure file for another binary?)"
            )
    return classifiers


def captured_binary(module: str, measurement: Path) -> Path | None:
    """The copy in the measurement directory of a binary the profiles name, if there is one.

    hpcrun and pyrun copy GPU binaries and the vDSO into the measurement (``gpubins/``,
    ``vdso/``) and name them relative to it or by the absolute path they had when measured;
    both lead here (formats.md §1.4).
    """
    if _is_relative(module):
        path = measurement / module
    else:
        where = Path(module)
        path = measurement / where.parent.name / where.name
        if where.parent.name not in CAPTURED_DIRECTORIES:
            return None
    return path if path.is_file() else None


CAPTURED_DIRECTORIES = ("gpubins", "vdso", "cpubins")


def line_map_structure(path: Path, module: str) -> StructureIndex | None:
    """Functions and lines of a captured binary from its DWARF line map, or None without one.

    pystruct's own analysis (``--gpucfg no``), so the contexts are those ``pystruct`` would give;
    a cubin's functions come from its symbols even without line information.
    """
    try:
        from pyhpctk.structure.driver import StructOptions, analyze_target
        from pyhpctk.structure.dwarf import read_debug_info
        from pyhpctk.structure.elfimage import open_image

        image = open_image(path)
        if not image.is_cuda and not read_debug_info(image).has_lines:
            return None
        structure = analyze_target(path, StructOptions(gpucfg=False), lm_name=module)
    except (ImportError, PyhpctkError, OSError):
        return None
    indexes = index_structure(structure)
    return indexes[0] if indexes else None


def _read_logical(path: Path) -> dict[int, LogicalFunction] | None:
    """The stanzas of a logical metadata file (formats.md §1.10), via formats.logical."""
    from pyhpctk.formats import logical

    try:
        metadata = logical.read(path)
    except (PyhpctkError, OSError):
        return None
    return {
        fid: LogicalFunction(
            name=stanza.funcname or None, file=stanza.filename or None, line=stanza.lineno
        )
        for fid, stanza in metadata.by_fid().items()
    }


# --------------------------------------------------------------------------------------------
# The whole aggregation


def aggregate(options: ProfOptions, progress: Progress | None = None) -> AggregateDatabase:
    """Read, unify, expand and summarise every profile of ``options.measurements``."""
    progress = progress or _no_progress
    sources = inputs.discover(options.measurements)
    problems: list[str] = []

    # Stages 1-2: read and extract on the workers.
    with progress("reading profiles", len(sources)) as advance:
        loaded = list(
            parallel_map(
                lambda pair: _load_one(*pair),
                list(enumerate(sources)),
                options.jobs,
                advance,
            )
        )
    good: list[tuple[int, ProfileData]] = []
    for item in loaded:
        for message in item.warnings:
            warnings.warn(message, FormatWarning, stacklevel=2)
        if options.strict and item.notes:
            raise ProfileError(f"{item.notes[0]} (--strict)")
        problems.extend(item.notes)
        if item.data is None:
            if options.strict:
                raise ProfileError(f"{item.problem} (--strict)")
            problems.append(f"skipped: {item.problem}")
        else:
            good.append((item.index, item.data))

    table = MetricTable()
    usable: list[tuple[int, ProfileData, npt.NDArray[np.int64]]] = []
    for index, data in good:
        try:
            usable.append((index, data, table.add(data)))
        except ProfileError as error:
            if options.strict:
                raise
            problems.append(f"skipped: {error}")
    if not usable:
        raise ProfileError(
            "no usable profile: " + "; ".join(problems) if problems else "no usable profile"
        )

    with progress("unifying call paths", len(usable)) as advance:
        unified = reduce_pairwise([leaf(i, d) for i, d, _ in usable], options.jobs)
        advance(len(usable))
    raw = unified.tree

    # Stage 3: expansion.
    used_modules = {key[0] for key in raw.keys if key[0] is not None}
    module_dirs: dict[str, Path] = {}
    for _, data, _ in usable:
        for module, measurement in data.module_paths.items():
            if module in used_modules:
                module_dirs.setdefault(module, Path(measurement))
    explicit, found = load_structures(options, [sources[i] for i, _, _ in usable], used_modules)
    classifiers = build_classifiers(
        module_dirs.items(), explicit, found, problems, not options.ignore_structs
    )
    with progress("expanding contexts", len(raw)) as advance:
        expansion = expand(raw, classifiers)
        expansion = reconstruct_gpu_contexts(
            raw, expansion, classifiers, unified.profiles, problems=problems
        )
        advance(len(raw))
    tree = expansion.tree

    # Stage 4: statistics.
    partials = PARTIALS_STATS if options.metrics == "stats" else PARTIALS_SUM
    bases_by_name, global_base, move = metric_bases(table.metrics, partials)
    shape = TreeShape.of(tree)
    visible = tree.visible_ancestor()
    tuples = id_tuples([d.id_tuple for _, d, _ in usable])

    def statistics(item: tuple[int, ProfileData, npt.NDArray[np.int64]]) -> SparseValues:
        _, data, mapping = item
        return profile_statistics(data, mapping, expansion, shape, global_base, move)

    with progress("computing statistics", len(usable)) as advance:
        values = list(parallel_map(statistics, usable, options.jobs, advance))
        summary = summarize(shape, values, partials)

    # Stage 5: traces.
    profiles: list[ProfileResult] = []
    low: int | None = None
    high: int | None = None
    with progress("rewriting traces", len(usable)) as advance:
        for (_, data, _), sparse, id_tuple in zip(usable, values, tuples, strict=True):
            trace = None
            if data.trace_time is not None and data.trace_node is not None:
                trace = rewrite_trace(
                    data.trace_time,
                    data.trace_node,
                    expansion.call_ctx if data.call_trace else expansion.leaf_ctx,
                    visible,
                )
                if len(trace.time):
                    t0, t1 = int(trace.time[0]), int(trace.time[-1])
                    low = t0 if low is None else min(low, t0)
                    high = t1 if high is None else max(high, t1)
            profiles.append(ProfileResult(data.name, id_tuple, sparse, trace))
            advance(1)

    title = options.title or usable[0][1].header.get("program-name", "") or "database"
    return AggregateDatabase(
        title=title,
        tree=tree,
        metrics=table.metrics,
        bases=bases_by_name,
        partials=partials,
        profiles=profiles,
        summary=summary,
        trace_range=None if low is None or high is None else (low, high),
        formulas=table.formulas,
        problems=problems,
    )


def metric_bases(
    metrics: list[MetricInfo], partials: tuple[Partial, ...]
) -> tuple[dict[str, int], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """(base id by stored metric name, base per global metric index or -1, move-to-proc flags)."""
    stored = [m for m in metrics if not m.is_derived]
    bases_by_name = {m.name: N_SCOPES * len(partials) * i for i, m in enumerate(stored)}
    global_base = np.asarray(
        [bases_by_name.get(m.name, -1) for m in metrics] or [0], dtype=np.int64
    )
    move = np.asarray([m.move_to_proc for m in metrics] or [False], dtype=bool)
    return bases_by_name, global_base, move


def profile_statistics(
    data: ProfileData,
    mapping: npt.NDArray[np.int64],
    expansion: Expansion,
    shape: TreeShape,
    global_base: npt.NDArray[np.int64],
    move: npt.NDArray[np.bool_],
) -> SparseValues:
    """Stage 4 for one profile: its point values placed on final contexts, then its scopes."""
    metric = mapping[data.value_metric] if len(data.value_metric) else data.value_metric
    keep = global_base[metric] >= 0 if len(metric) else np.zeros(0, dtype=bool)
    nodes = data.value_node[keep]
    metric = metric[keep]
    rows, ctx, value = expansion.place(nodes, move[metric], data.value[keep])
    return profile_scopes(shape, ctx, metric[rows], value, global_base)


def rewrite_trace(
    time: npt.NDArray[np.uint64],
    node: npt.NDArray[np.int64],
    node_ctx: npt.NDArray[np.int64],
    visible: npt.NDArray[np.int64],
) -> Trace:
    """formats.md §3.5: records to final (visible) contexts, time-sorted, no repeated idles."""
    ctx = visible[node_ctx[node]]
    if len(time) > 1 and np.any(time[1:] < time[:-1]):
        order = np.argsort(time, kind="stable")
        time, ctx = time[order], ctx[order]
    if len(ctx) > 1:
        repeated_idle = np.zeros(len(ctx), dtype=bool)
        repeated_idle[1:] = (ctx[1:] == ROOT) & (ctx[:-1] == ROOT)
        time, ctx = time[~repeated_idle], ctx[~repeated_idle]
    return Trace(time.astype(np.uint64), ctx.astype(np.int64))


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
    "Expansion",
    "FormatError",
    "ProfileError",
    "aggregate",
    "default_output",
    "id_tuples",
    "parallel_map",
    "reduce_pairwise",
    "rewrite_trace",
]


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a pyprof run did: where the database went and what it skipped."""

    output: Path
    profiles: int
    contexts: int
    metrics: int
    traces: int
    problems: tuple[str, ...]

    def summary(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"wrote {self.output}: {self.profiles} profiles, {self.contexts} contexts, "
            f"{self.metrics} metrics, {self.traces} traces"
        ]
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s):")
            lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


def run(options: ProfOptions, progress: Progress | None = None) -> RunReport:
    """Aggregate ``options.measurements`` and write the database directory."""
    from pyhpctk.analysis.write import prepare_output, write_database

    if options.output is not None:
        prepare_output(options.output, options.force)  # fail before the work, not after
    db = aggregate(options, progress)
    output = options.output or default_output(options, db.title)
    with (progress or _no_progress)("writing database", 1) as advance:
        write_database(
            db, output, force=options.force, copy=options.copy_sources, derived=options.derived
        )
        advance(1)
    return RunReport(
        output=output,
        profiles=len(db.profiles),
        contexts=len(db.tree),
        metrics=len(db.stored_metrics),
        traces=sum(1 for p in db.profiles if p.trace is not None and len(p.trace.time)),
        problems=tuple(db.problems),
    )

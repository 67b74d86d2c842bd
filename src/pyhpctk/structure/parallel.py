"""Run the functions of one large binary over several worker processes.

Workers are forked, so they inherit the opened image, DWARF tables and skeleton without pickling
them; each worker analyzes a contiguous slice of the procedure list and sends back plain
:class:`~pyhpctk.formats.hpcstruct_model.Scope` trees, which the parent reassembles in address
order — the output is identical to the serial path's. Where ``fork`` is unavailable the serial
path runs instead.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Protocol, TypeVar

from pyhpctk.formats.hpcstruct_model import Scope

Result = tuple[Scope, set[int]]


class AddressRange(Protocol):
    """What slicing needs of a procedure: its address range (the host's ``Procedure``)."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


Proc = TypeVar("Proc", bound=AddressRange)
ProcIn = TypeVar("ProcIn", bound=AddressRange, contravariant=True)


class Analyzer(Protocol[ProcIn]):
    """What a worker runs on each procedure (the host's ``FunctionAnalyzer``): its ``P`` scope
    and the call targets it found."""

    def analyze_with_calls(self, proc: ProcIn, /) -> Result: ...


_ANALYZER: Analyzer[Any] | None = None
_PROCS: Sequence[Any] = ()


def _serial(
    analyzer: Analyzer[Proc],
    procs: Sequence[Proc],
    progress: Callable[[int], None] | None = None,
) -> list[Result]:
    out = []
    for proc in procs:
        out.append(analyzer.analyze_with_calls(proc))
        if progress is not None:
            progress(1)
    return out


def _work(bounds: tuple[int, int]) -> tuple[int, list[Result]]:
    assert _ANALYZER is not None
    lo, hi = bounds
    return lo, _serial(_ANALYZER, _PROCS[lo:hi])


def slices(procs: Sequence[AddressRange], parts: int) -> list[tuple[int, int]]:
    """Split the procedure list into about ``parts`` slices of similar code size."""
    if not procs:
        return []
    sizes = [max(1, p.end - p.start) for p in procs]
    total = sum(sizes)
    target = max(1, total // max(1, parts))
    out: list[tuple[int, int]] = []
    lo = 0
    acc = 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= target and i + 1 < len(procs):
            out.append((lo, i + 1))
            lo = i + 1
            acc = 0
    out.append((lo, len(procs)))
    return out


def map_functions(
    analyzer: Analyzer[Proc],
    procs: Sequence[Proc],
    jobs: int,
    progress: Callable[[int], None] | None = None,
) -> list[Result]:
    """``(P scope, call targets)`` of each of ``procs`` (in order), from ``jobs`` forked workers."""
    global _ANALYZER, _PROCS
    if "fork" not in multiprocessing.get_all_start_methods() or jobs <= 1:
        return _serial(analyzer, procs, progress)
    _ANALYZER, _PROCS = analyzer, procs
    try:
        parts = slices(procs, jobs * 8)
        results: dict[int, list[Result]] = {}
        context = multiprocessing.get_context("fork")
        # Never more workers than slices: with fork every worker is started up front.
        with ProcessPoolExecutor(max_workers=min(jobs, len(parts)), mp_context=context) as pool:
            futures = {pool.submit(_work, part): part for part in parts}
            for future in as_completed(futures):
                lo, scopes = future.result()
                results[lo] = scopes
                if progress is not None:
                    progress(len(scopes))
        out: list[Result] = []
        for lo, _ in parts:
            out.extend(results[lo])
        return out
    finally:
        _ANALYZER, _PROCS = None, ()

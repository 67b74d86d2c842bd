"""What ``verify`` checks in an ``.hpcrun`` profile beyond its structure: the header nv-pairs
and the values (formats.md §1.3, §1.8).

The reader (:mod:`pyhpctk.formats.hpcrun`) refuses what hpcprof cannot use; these checks find
what no measurement writes though the file parses: a header number that is no number
(``mpi-rank = %``), a trace span that ends before it starts, a NaN or infinite value, a
negative time. Pure functions of the model; no I/O.
"""

from __future__ import annotations

import re

import numpy as np

from pyhpctk.formats.hpcrun_model import VALFMT_REAL, HpcrunProfile, is_time_metric

# formats.md §1.3: the nv-pairs hpcrun writes as numbers (``%d``, ``%lx``, ``%ld``).
_SIGNED, _UNSIGNED = re.compile(r"-?[0-9]+"), re.compile(r"[0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]+")
NUMERIC_NVPAIRS: dict[str, tuple[re.Pattern[str], str]] = {
    "mpi-rank": (_SIGNED, "a decimal integer"),
    "thread-id": (_SIGNED, "a decimal integer"),
    "host-id": (_HEX, "a hexadecimal number"),
    "process-id": (_UNSIGNED, "a decimal number"),
    "trace-min-time": (_UNSIGNED, "a decimal number of nanoseconds"),
    "trace-max-time": (_UNSIGNED, "a decimal number of nanoseconds"),
    "trace-disorder": (_UNSIGNED, "a decimal number"),
}
REQUIRED_NVPAIRS = ("program-name", "mpi-rank", "thread-id", "host-id", "process-id")
_U64_MAX = 2**64 - 1


def _show(text: str) -> str:
    return text if text.isprintable() else repr(text)


def header_problems(profile: HpcrunProfile) -> list[str]:
    """Missing nv-pairs, nv-pairs that must be numbers but are not, and a trace span that ends
    before it starts (formats.md §1.3)."""
    problems = []
    present = {key for key, _ in profile.nvpairs}
    for name in REQUIRED_NVPAIRS:
        if name not in present:
            problems.append(f"header: nv-pair {name!r} is missing")
    for key, value in profile.nvpairs:
        rule = NUMERIC_NVPAIRS.get(key)
        if rule is not None and rule[0].fullmatch(value) is None:
            problems.append(f"header: nv-pair {key!r} is {_show(value)!r}, not {rule[1]}")
    span = trace_span(profile)
    if span is None and all(
        _UNSIGNED.fullmatch(profile.header(key)) for key in ("trace-min-time", "trace-max-time")
    ):
        problems.append("header: trace-min-time or trace-max-time does not fit in 64 bits")
    if span is not None and span[0] > span[1]:
        problems.append(f"header: trace-min-time {span[0]} is after trace-max-time {span[1]}")
    return problems


def trace_span(profile: HpcrunProfile) -> tuple[int, int] | None:
    """``(trace-min-time, trace-max-time)`` from the header, or None when either is missing or
    not a 64-bit number; ``(0, 0)`` means the thread recorded no trace (formats.md §1.3)."""
    low, high = profile.header("trace-min-time"), profile.header("trace-max-time")
    if _UNSIGNED.fullmatch(low) is None or _UNSIGNED.fullmatch(high) is None:
        return None
    if max(len(low), len(high)) > 20 or max(int(low), int(high)) > _U64_MAX:
        return None
    return int(low), int(high)


def value_problems(profile: HpcrunProfile) -> list[str]:
    """Values no measurement can produce: a real value that is NaN or infinite, a negative
    time (a metric named ``... (sec)``, :func:`~pyhpctk.formats.hpcrun_model.is_time_metric`).

    The profile's sparse section must be sound (no metric index past the table).
    """
    if not len(profile.values):
        return []
    node_ids, metric, decoded = profile.decoded_values()
    problems = []
    real = np.array([m.value_format == VALFMT_REAL for m in profile.metrics], dtype=bool)
    time = np.array([is_time_metric(m.name) for m in profile.metrics], dtype=bool)
    with np.errstate(invalid="ignore"):
        negative = decoded < 0
    for bad, what in (
        (real[metric] & ~np.isfinite(decoded), "a value that is not a finite number"),
        (time[metric] & negative, "a negative time"),
    ):
        if bad.any():
            i = int(np.argmax(bad))
            m, node, value = int(metric[i]), int(node_ids[i]), float(decoded[i])
            problems.append(
                f"sparse metrics: node {node} has {what}, {value!r}, for metric {m} "
                f"({_show(profile.metrics[m].name)}) ({int(bad.sum())} such values)"
            )
    return problems

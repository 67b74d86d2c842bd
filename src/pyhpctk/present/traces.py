"""Traces: a textual summary per trace line, a Perfetto / Chrome trace export, GPU idleness blame.

A trace.db line (formats.md §3.5) says which context a thread or GPU stream was in from each
timestamp on; ctxId 0 means idle. Here an element lasts until the next element of its line, and a
line's last element only closes the line (it has no duration), so a trace that ends in a busy
context ends at its last timestamp.

* :func:`summarize` — per line: samples, time span, busy time and the contexts it spent most time
  in.
* :func:`to_perfetto` — the Chrome trace-event JSON that ui.perfetto.dev and chrome://tracing load:
  a process per measured process (named by its program and pid where pyrun recorded them, else
  by node and rank) and, only when there are GPU streams, one for them; one track per line,
  named by the thread's name (``MainThread``, ``ThreadPoolExecutor-0_1``) where pyrun recorded
  it; and the calling context at each instant as nested begin/end slices (entry point,
  functions, inlined functions, loops), so call-stack depth is slice depth.
* :func:`gpu_idle_blame` — the GPU idleness analysis of Zhou et al. (SC'21): over the time when
  every GPU stream is idle and at least one CPU thread is busy, the idle time is shared equally
  among the busy CPU threads and charged to the CPU function each is running; functions are then
  ranked by blame. With several ranks each rank is taken alone (its streams, its threads) and
  the blames are added; :mod:`.waits` adds the waits across ranks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError, UsageError
from pyhpctk.formats.vocabulary import LexicalType, Relation
from pyhpctk.present import memory
from pyhpctk.present.labels import context_label
from pyhpctk.present.model import (
    LEX_ENTRY,
    Experiment,
    Profile,
    ProfileList,
    ThreadName,
    Timeline,
)

IDLE = 0


class NoTraceError(UsageError):
    """The database has no trace.db (or no lines the analysis needs)."""


def _lines(exp: Experiment) -> Sequence[Timeline]:
    if exp.traces is None:
        raise NoTraceError(f"{exp.path}: no trace.db: measure with tracing on (pyrun -t)")
    return exp.traces.lines()


def _profile(exp: Experiment, index: int) -> Profile:
    """The profile of a trace line (a bare one where the database has none of that index); a
    search, not a walk over all profiles: a GPU trace has a line per warp slot."""
    if isinstance(exp.profiles, ProfileList):
        found = exp.profiles.find(index)
        return Profile(index, ()) if found is None else found
    return next((p for p in exp.profiles if p.index == index), Profile(index, ()))


def durations(line: Timeline) -> npt.NDArray[np.int64]:
    """How long each element lasts (the last element: 0)."""
    t = line.timestamps.astype(np.int64)
    out = np.zeros(len(t), dtype=np.int64)
    if len(t) > 1:
        out[:-1] = np.diff(t)
    return out


def context_frames(exp: Experiment, ctx_id: int) -> list[tuple[int, str]]:
    """The stack shown for a context: (ctxId, label) of its entry point, functions, inlined
    functions, call frames and loops, outermost first; the context itself is always last."""
    tree = exp.tree
    node = tree.node_of(ctx_id)
    if node < 0:
        return [(ctx_id, f"<context {ctx_id}>")]
    chain: list[int] = []
    cur = node
    while cur > 0:
        lex = int(tree.lexical_type[cur])
        framed = lex in (LEX_ENTRY, LexicalType.FUNCTION, LexicalType.LOOP) or (
            lex == LexicalType.INSTRUCTION and int(tree.relation[cur]) == Relation.CALL
        )
        if framed or cur == node:
            chain.append(cur)
        cur = int(tree.parent[cur])
    return [(int(tree.ctx_id[n]), context_label(tree, n)[0]) for n in reversed(chain)]


def function_of(exp: Experiment, ctx_id: int) -> str:
    """The label of the innermost function (or call frame) enclosing a context."""
    for ident, label in reversed(context_frames(exp, ctx_id)):
        node = exp.tree.node_of(ident)
        if node < 0:
            return label
        lex = int(exp.tree.lexical_type[node])
        if lex in (LexicalType.FUNCTION, LexicalType.INSTRUCTION, LEX_ENTRY):
            return label
    return f"<context {ctx_id}>"


# -- summary -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LineSummary:
    """What one trace line did."""

    profile: str
    is_gpu: bool  # a GPU stream or a warp line
    samples: int
    start_ns: int
    end_ns: int
    busy_ns: int
    top: tuple[tuple[str, int], ...]  # (function label, time ns), longest first
    cpu_ns: int | None = None  # CPU time the profile measured (CPUTIME), None without it
    thread: str | None = None  # the thread's name pyrun recorded (threads.txt), None without
    is_warp: bool = False  # an SM's warp slot (traced kernels' warps, issue #34)

    @property
    def title(self) -> str:
        """How the summary names the line (as :meth:`.Experiment.profile_title` does)."""
        return self.profile if self.thread is None else f"{self.thread} ({self.profile})"

    @property
    def span_ns(self) -> int:
        return self.end_ns - self.start_ns


#: The metric whose per-profile total is a thread's CPU time (pyrun's and hpcrun's CPU timer).
CPU_TIME_METRIC = "CPUTIME (sec)"


def _cpu_ns(exp: Experiment, profile: int) -> int | None:
    """The CPU time a profile measured (its CPUTIME at the root), in ns; None without it."""
    try:
        metric = exp.metric(CPU_TIME_METRIC)
    except FormatError:  # no such metric in this database
        return None
    prop = metric.prop_id("execution")
    if prop is None:
        return None
    column = exp.values.profile_column(profile, prop)
    return round(float(column[0]) * 1e9) if len(column) else 0


def summarize(exp: Experiment, top: int = 3) -> list[LineSummary]:
    """What each trace line did: samples, span (wall time), time in a context ("sampled"),
    the CPU time its profile measured, and where the time went."""
    out = []
    for line in _lines(exp):
        prof = _profile(exp, line.profile)
        named = exp.thread_names.get(line.profile)
        dur = durations(line)
        busy = line.ctx_ids != IDLE
        by_fn: dict[str, int] = {}
        ids, inverse = np.unique(line.ctx_ids[busy], return_inverse=True)
        per_ctx = np.bincount(inverse, weights=dur[busy], minlength=len(ids))
        for ctx, spent in zip(ids.tolist(), per_ctx.tolist(), strict=True):
            name = function_of(exp, int(ctx))
            by_fn[name] = by_fn.get(name, 0) + int(spent)
        ranked = sorted(by_fn.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        ts = line.timestamps
        out.append(
            LineSummary(
                prof.label,
                prof.is_gpu,
                len(ts),
                int(ts[0]) if len(ts) else 0,
                int(ts[-1]) if len(ts) else 0,
                int(dur[busy].sum()),
                tuple(ranked),
                None if prof.is_gpu else _cpu_ns(exp, line.profile),
                None if named is None else named.name,
                prof.is_warp,
            )
        )
    return out


def _seconds(ns: int | float) -> str:
    return f"{ns / 1e9:.6f}s"


def render_summary(summaries: Sequence[LineSummary], out: TextIO) -> None:
    """One entry per line; traced kernels' warp lines (thousands: an SM's every slot) are one
    line pointing to ``pyview --warps``."""
    out.write("Trace lines\n")
    warps = [s for s in summaries if s.is_warp]
    for s in summaries:
        if s.is_warp:
            continue
        kind = "GPU stream" if s.is_gpu else "CPU thread"
        if s.samples == 0:
            out.write(f"  {s.title} ({kind}): empty\n")
            continue
        share = 100.0 * s.busy_ns / s.span_ns if s.span_ns else 0.0
        # A sampled instant says what the thread was in, not that it ran: on a loaded machine
        # a thread is "in" its code far longer than it gets a CPU, so CPU time is its own.
        cpu = ""
        if s.cpu_ns is not None:
            cpu_share = 100.0 * s.cpu_ns / s.span_ns if s.span_ns else 0.0
            cpu = f"; CPU time {_seconds(s.cpu_ns)} ({cpu_share:.1f}% of the wall time)"
        out.write(
            f"  {s.title} ({kind}): {s.samples} samples over {_seconds(s.span_ns)} of wall "
            f"time, in a calling context {_seconds(s.busy_ns)} ({share:.1f}%){cpu}\n"
        )
        for name, spent in s.top:
            out.write(f"      {_seconds(spent)}  {name}\n")
    if warps:
        sms = len({s.profile.rsplit(" / ", 1)[0] for s in warps})  # its device and SM
        out.write(f"  {len(warps)} warp slots on {sms} SMs of traced kernels: see pyview --warps\n")


# -- Perfetto / Chrome trace events --------------------------------------------------------------
CPU_PID, GPU_PID = 1, 2


def to_perfetto(exp: Experiment) -> dict[str, Any]:
    """Chrome trace-event JSON (``{"traceEvents": [...]}``); times in microseconds."""
    memory_files = memory.timelines(exp.path)  # GPU memory counters (pyrun's gpu=...,memory)
    lines = _lines(exp) if exp.traces is not None or not memory_files else []
    starts = [int(line.timestamps[0]) for line in lines if len(line.timestamps)]
    first_memory = memory.first_time(memory_files)
    starts += [first_memory] if first_memory is not None else []
    origin = min(starts) if starts else 0
    events: list[dict[str, Any]] = []
    frames_of: dict[int, list[tuple[int, str]]] = {}
    processes = _Processes(events)
    for line in lines:
        prof = _profile(exp, line.profile)
        named = None if prof.is_gpu else exp.thread_names.get(line.profile)
        pid = processes.pid_of(prof, named)
        tid = line.profile
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": tid,
                "args": {"name": _line_name(exp, prof, line) if named is None else named.name},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
        stack: list[tuple[int, str]] = []
        times = line.timestamps.astype(np.int64)
        ctxs = line.ctx_ids.astype(np.int64)
        for i in range(len(times)):
            ts = (int(times[i]) - origin) / 1000.0
            ctx = int(ctxs[i])
            last = i == len(times) - 1
            if ctx == IDLE or last:
                want: list[tuple[int, str]] = []
            else:
                if ctx not in frames_of:
                    frames_of[ctx] = context_frames(exp, ctx)
                want = frames_of[ctx]
            keep = 0
            while keep < min(len(stack), len(want)) and stack[keep] == want[keep]:
                keep += 1
            for ident, name in reversed(stack[keep:]):
                events.append(
                    {
                        "ph": "E",
                        "pid": pid,
                        "tid": tid,
                        "ts": ts,
                        "name": name,
                        "args": {"ctx_id": ident},
                    }
                )
            for ident, name in want[keep:]:
                events.append(
                    {
                        "ph": "B",
                        "pid": pid,
                        "tid": tid,
                        "ts": ts,
                        "name": name,
                        "cat": "gpu" if prof.is_gpu else "cpu",
                        "args": {"ctx_id": ident},
                    }
                )
            stack = want
    events += memory.counter_events(memory_files, origin)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"title": exp.title, "database": exp.path, "origin_ns": origin},
    }


#: Identifier kinds that name a line within its process (formats.md §3.2, id tuples).
_LINE_KINDS = ("THREAD", "GPUSTREAM", "GPUCONTEXT", "CORE")


class _Processes:
    """The export's processes: one per measured process whose threads pyrun named (its program
    and pid), else one per (node, rank); the GPU streams of each (node, rank) in a process of
    their own, made only when there are some. Each is announced by a ``process_name`` event."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.ids: dict[tuple[tuple[tuple[str, int], ...], bool, int | None], int] = {}

    def pid_of(self, prof: Profile, named: ThreadName | None) -> int:
        where = tuple(e for e in prof.identifier if e[0] not in _LINE_KINDS)
        key = (where, prof.is_gpu, None if named is None else named.pid)
        if prof.is_warp:
            key = (where, prof.is_gpu, -1)
        pid = self.ids.get(key)
        if pid is None:
            pid = self.ids[key] = len(self.ids) + 1
            place = " / ".join(f"{kind} {ident}" for kind, ident in where if not prof.is_warp
                               or kind != "GPUDEVICE")  # fmt: skip
            if prof.is_warp:  # traced kernels' warps, a track per SM and warp slot
                name = f"GPU {prof.element('GPUDEVICE')} warps" + (f" ({place})" if place else "")
            elif named is not None:  # the node shows in the pid's uniqueness, not in the name
                ranks = ", ".join(f"{kind} {ident}" for kind, ident in where if kind != "NODE")
                name = f"{named.program} (pid {named.pid}" + (f", {ranks})" if ranks else ")")
            else:
                name = "GPU streams" if prof.is_gpu else "CPU threads"
                name += f" ({place})" if place else ""
            self.events.append(
                {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
            )
        return pid


def _line_name(exp: Experiment, prof: Profile, line: Timeline) -> str:
    """A track's name: its thread or stream number, and for a CPU thread the entry point its
    samples are under (``main thread``, ``application thread``)."""
    if prof.is_warp:
        return prof.warp_label
    own = [f"{kind} {ident}" for kind, ident in prof.identifier if kind in _LINE_KINDS]
    label = " / ".join(own) or prof.label
    if prof.is_gpu:
        return label
    for ctx in line.ctx_ids[:64].tolist():
        if ctx == IDLE:
            continue
        frames = context_frames(exp, int(ctx))
        node = exp.tree.node_of(frames[0][0]) if frames else -1
        if node >= 0 and int(exp.tree.lexical_type[node]) == LEX_ENTRY:
            return f"{frames[0][1]} ({label})"
    return label


def write_perfetto(exp: Experiment, out: TextIO) -> None:
    json.dump(to_perfetto(exp), out, separators=(",", ":"))
    out.write("\n")


# -- GPU idleness blame --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Blame:
    """Result of :func:`gpu_idle_blame`."""

    gpu_idle_ns: int  # time every GPU stream was idle, within the traced span
    blamed_ns: int  # the part of it during which at least one CPU thread was busy
    by_function: tuple[tuple[str, float], ...]  # (function, blamed ns), largest first
    by_context: tuple[tuple[int, float], ...]  # (ctxId, blamed ns), largest first


def _states(line: Timeline, cuts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The context of ``line`` during each segment ``[cuts[k], cuts[k+1])`` (0 = idle/absent)."""
    times = line.timestamps.astype(np.int64)
    where = np.searchsorted(times, cuts[:-1], side="right") - 1
    valid = (where >= 0) & (where < len(times) - 1)
    out = np.zeros(len(cuts) - 1, dtype=np.int64)
    out[valid] = line.ctx_ids.astype(np.int64)[where[valid]]
    return out


def gpu_idle_blame(exp: Experiment) -> Blame:
    """Share GPU idle time among the CPU functions running while every GPU stream is idle.

    Each rank (the ``RANK`` of the id tuples) is taken alone: its GPU is idle when all of its
    own streams are, and only its own threads are blamed; the ranks' blames are added.
    """
    streams = [line for line in _lines(exp) if not _profile(exp, line.profile).is_warp]
    lines = [line for line in streams if len(line.timestamps)]
    if not any(_profile(exp, line.profile).is_gpu for line in streams):
        raise NoTraceError(f"{exp.path}: no GPU stream in the traces: nothing to blame")
    ranks: dict[int | None, list[Timeline]] = {}
    for line in lines:
        ranks.setdefault(_profile(exp, line.profile).rank, []).append(line)
    idle_ns = blamed_ns = 0
    per_ctx: dict[int, float] = {}
    for group in ranks.values():
        gpu = [line for line in group if _profile(exp, line.profile).is_gpu]
        cpu = [line for line in group if not _profile(exp, line.profile).is_gpu]
        idle, blamed = _rank_idle_blame(gpu, cpu, per_ctx)
        idle_ns, blamed_ns = idle_ns + idle, blamed_ns + blamed
    per_fn: dict[str, float] = {}
    for ctx, value in per_ctx.items():
        name = function_of(exp, ctx)
        per_fn[name] = per_fn.get(name, 0.0) + value
    return Blame(
        idle_ns,
        blamed_ns,
        tuple(sorted(per_fn.items(), key=lambda kv: (-kv[1], kv[0]))),
        tuple(sorted(per_ctx.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def _rank_idle_blame(
    gpu: list[Timeline], cpu: list[Timeline], per_ctx: dict[int, float]
) -> tuple[int, int]:
    """One rank's (GPU idle ns, blamed ns); its blame by context is added to ``per_ctx``."""
    lines = gpu + cpu
    if not gpu:  # a rank without a traced GPU stream has no GPU idleness to blame
        return 0, 0
    cuts = np.unique(np.concatenate([line.timestamps.astype(np.int64) for line in lines]))
    if len(cuts) < 2:
        return 0, 0
    length = np.diff(cuts).astype(np.float64)
    gpu_busy = np.zeros(len(length), dtype=bool)
    for line in gpu:
        gpu_busy |= _states(line, cuts) != IDLE
    idle = ~gpu_busy
    cpu_states = (
        np.vstack([_states(line, cuts) for line in cpu]) if cpu else np.zeros((0, len(length)), int)
    )
    active = (cpu_states != IDLE).sum(axis=0)
    blamed = idle & (active > 0)
    share = np.where(blamed, length / np.maximum(active, 1), 0.0)
    for row in cpu_states:
        hit = blamed & (row != IDLE)
        if not np.any(hit):
            continue
        ids, inverse = np.unique(row[hit], return_inverse=True)
        sums = np.bincount(inverse, weights=share[hit], minlength=len(ids))
        for ctx, value in zip(ids.tolist(), sums.tolist(), strict=True):
            per_ctx[int(ctx)] = per_ctx.get(int(ctx), 0.0) + float(value)
    return int(length[idle].sum()), int(length[blamed].sum())


def render_blame(blame: Blame, out: TextIO, top: int = 20) -> None:
    out.write(
        f"GPU idle time: {_seconds(blame.gpu_idle_ns)}; while CPU threads were busy: "
        f"{_seconds(blame.blamed_ns)}\n"
    )
    if not blame.by_function:
        out.write("  no CPU function to blame\n")
        return
    out.write("  blame (s)   share  CPU function\n")
    for name, value in blame.by_function[:top]:
        share = 100.0 * value / blame.blamed_ns if blame.blamed_ns else 0.0
        out.write(f"  {value / 1e9:9.6f}  {share:5.1f}%  {name}\n")

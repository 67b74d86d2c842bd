"""The warps of traced kernels (issue #34 item 4): what ``pyview --warps`` prints.

pyrun writes a traced kernel's warps on trace lines of their own, one per SM and warp slot
(docs/formats.md, "Warp traces"). A line holds the warps that ran in its slot one after another,
idle between them; each of a warp's records is at the context of the PTX block it entered
(``block N``, below the source line it starts with, below the kernel and the Python call that
launched it) and lasts until its next record. From those lines, per kernel calling context:

* the warp time per block and per source line (the time warps spent from entering a block to
  their next record, summed over every warp);
* the imbalance across warps (each warp's time from its first record to its end) and across
  SMs (the warp time each SM ran), as max / mean;
* the longest warp: where it ran, how long, and its path of blocks, a repeated run of blocks
  written once with its count (``(block 3 → block 2) ×3``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from pyhpctk.formats.vocabulary import LexicalType
from pyhpctk.present.labels import context_label
from pyhpctk.present.model import Experiment, Profile
from pyhpctk.present.traces import IDLE, NoTraceError

KERNEL_PLACEHOLDER = "<gpu kernel>"
MAX_PERIOD = 12  # the longest run of blocks :func:`compress` looks for repeats of


@dataclass
class Warp:
    """One warp, as its line shows it."""

    sm: int
    slot: int
    start: int  # ns
    end: int
    blocks: list[str] = field(default_factory=list)

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclass
class KernelWarps:
    """The warps of one kernel calling context, and what their traces say."""

    kernel: str
    called_from: str  # the launching frames, outermost first, joined by ' > '
    warps: list[Warp] = field(default_factory=list)
    per_block: dict[str, int] = field(default_factory=dict)  # warp time, ns
    per_line: dict[str, int] = field(default_factory=dict)
    per_sm: dict[int, int] = field(default_factory=dict)

    @property
    def warp_time(self) -> int:
        return sum(self.per_block.values())

    def longest(self) -> Warp:
        return max(self.warps, key=lambda w: (w.duration, -w.start))

    def warp_imbalance(self) -> tuple[int, float, int]:
        """(longest, mean, shortest) warp duration, ns."""
        durations = [w.duration for w in self.warps]
        return max(durations), sum(durations) / len(durations), min(durations)

    def sm_imbalance(self) -> tuple[int, int, float]:
        """(busiest SM, its warp time, the mean over the SMs that ran warps), ns."""
        busiest = max(self.per_sm, key=lambda sm: (self.per_sm[sm], -sm))
        return busiest, self.per_sm[busiest], sum(self.per_sm.values()) / len(self.per_sm)


class _Contexts:
    """What a record's context says: its block, its line and its kernel calling context."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.known: dict[int, tuple[str, str, int, str, str]] = {}

    def __call__(self, ctx: int) -> tuple[str, str, int, str, str]:
        """(block, line, kernel node, kernel, called from)."""
        found = self.known.get(ctx)
        if found is None:
            found = self.known[ctx] = self._walk(ctx)
        return found

    def _walk(self, ctx: int) -> tuple[str, str, int, str, str]:
        tree = self.exp.tree
        chain: list[int] = []
        node = tree.node_of(ctx)
        while node > 0:
            chain.append(node)
            node = int(tree.parent[node])
        labels = [context_label(tree, n)[0] for n in chain]
        block = labels[0] if labels else f"<context {ctx}>"
        line = next((labels[i] for i, n in enumerate(chain)
                     if int(tree.lexical_type[n]) == LexicalType.LINE), "<no line>")  # fmt: skip
        if KERNEL_PLACEHOLDER not in labels:
            return block, line, -1, "<kernel>", ""
        at = labels.index(KERNEL_PLACEHOLDER)
        kernel = chain[at - 1] if at > 0 else chain[at]
        callers = [
            labels[i]
            for i in range(len(chain) - 1, at, -1)
            if int(tree.lexical_type[chain[i]]) in (LexicalType.FUNCTION, LexicalType.LINE)
        ]
        return block, line, kernel, labels[at - 1] if at > 0 else block, " > ".join(callers[-2:])


def _warp_profiles(exp: Experiment) -> dict[int, Profile]:
    return {p.index: p for p in exp.profiles if p.is_warp}


def warp_summary(exp: Experiment) -> list[KernelWarps]:
    """Every kernel calling context whose warps were traced, the most warp time first."""
    if exp.traces is None:
        raise NoTraceError(f"{exp.path}: no trace.db: trace kernels with pyrun -e gpu=...,trace")
    profiles = _warp_profiles(exp)
    lines = [line for line in exp.traces.lines() if line.profile in profiles]
    if not lines:
        raise NoTraceError(f"{exp.path}: no warp traces: trace kernels with pyrun -e gpu=...,trace")
    where = _Contexts(exp)
    kernels: dict[int, KernelWarps] = {}
    for line in lines:
        prof = profiles[line.profile]
        sm, slot = int(prof.element("CORE") or 0), int(prof.element("THREAD") or 0)
        stamps = line.timestamps.astype(np.int64).tolist()
        ctxs = line.ctx_ids.tolist()
        warp: Warp | None = None
        for i, ctx in enumerate(ctxs):
            if warp is not None:
                warp.end = stamps[i]
            if ctx == IDLE or i == len(ctxs) - 1:
                warp = None
                continue
            block, source, node, kernel, caller = where(int(ctx))
            group = kernels.get(node)
            if group is None:
                group = kernels[node] = KernelWarps(kernel, caller)
            if warp is None:
                warp = Warp(sm, slot, stamps[i], stamps[i])
                group.warps.append(warp)
            spent = stamps[i + 1] - stamps[i]
            warp.blocks.append(block)
            group.per_block[block] = group.per_block.get(block, 0) + spent
            group.per_line[source] = group.per_line.get(source, 0) + spent
            group.per_sm[sm] = group.per_sm.get(sm, 0) + spent
    return sorted(kernels.values(), key=lambda k: (-k.warp_time, k.kernel))


def compress(path: Sequence[str]) -> str:
    """A path of blocks, each run of blocks repeated back to back written once with its count:
    ``block 0 → (block 1 → block 2) ×3 → block 3``."""
    out: list[str] = []
    i = 0
    while i < len(path):
        best = (1, 1)  # (period, repeats)
        for period in range(1, min(MAX_PERIOD, (len(path) - i) // 2) + 1):
            unit = list(path[i : i + period])
            repeats = 1
            while list(path[i + repeats * period : i + (repeats + 1) * period]) == unit:
                repeats += 1
            if repeats > 1 and period * repeats > best[0] * best[1]:
                best = (period, repeats)
        period, repeats = best
        unit_text = " → ".join(path[i : i + period])
        out.append(unit_text if repeats == 1 else f"({unit_text}) ×{repeats}")
        i += period * repeats
    return " → ".join(out)


def _us(ns: float) -> str:
    return f"{ns / 1e3:.3f} µs"


def _table(out: TextIO, title: str, spent: dict[str, int], total: int, top: int) -> None:
    out.write(f"    {title}\n")
    ranked = sorted(spent.items(), key=lambda kv: (-kv[1], kv[0]))
    for name, ns in ranked[:top]:
        out.write(f"      {_us(ns):>14}  {100 * ns / total if total else 0:5.1f}%  {name}\n")
    if len(ranked) > top:
        out.write(f"      … {len(ranked) - top} more\n")


def render_warp_summary(kernels: Sequence[KernelWarps], out: TextIO, top: int = 10) -> None:
    out.write("Warps of traced kernels (time from each warp's records, summed over warps)\n")
    for k in kernels:
        total = k.warp_time
        sms = len(k.per_sm)
        plural = "s" if sms != 1 else ""
        out.write(f"  {k.kernel} called from {k.called_from or '<unknown>'}: {len(k.warps)} "
                  f"warps on {sms} SM{plural}, {_us(total)} of warp time\n")  # fmt: skip
        _table(out, "time per block", k.per_block, total, top)
        _table(out, "time per line", k.per_line, total, top)
        longest, mean, shortest = k.warp_imbalance()
        ratio = longest / mean if mean else 0.0
        out.write(f"    imbalance across warps: longest {_us(longest)}, mean {_us(mean)}, "
                  f"shortest {_us(shortest)} (max/mean {ratio:.2f})\n")  # fmt: skip
        sm, busiest, sm_mean = k.sm_imbalance()
        ratio = busiest / sm_mean if sm_mean else 0.0
        out.write(f"    imbalance across SMs: busiest SM {sm} {_us(busiest)}, "
                  f"mean {_us(sm_mean)} (max/mean {ratio:.2f})\n")  # fmt: skip
        w = k.longest()
        out.write(f"    longest warp: SM {w.sm} / warp slot {w.slot}, {_us(w.duration)}: "
                  f"{compress(w.blocks)}\n")  # fmt: skip

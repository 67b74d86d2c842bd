"""Raw trace buffers into events per warp, and the times to give them.

A buffer holds 32-byte events (:data:`pyhpctk.instrument.ptx.traces.EVENT_DTYPE`); a slot never
written is all zero (the host zeroes the buffer), so a zero ``time`` marks it. The exact
strategy's buffer is cut by its table (warp ``g`` owns ``[start, end)``, in event order); the
chunk strategy's pool is cut into chunks, each one warp's events in order, a warp's chunks in
the order it took them (the pool's cursor only grows) and its identity read from its events
(CTA, SM, hardware warp slot: the warps of one CTA are resident together, so no two hold the
same slot). :class:`WarpEvents` is the result either way: one row per event, grouped by warp,
in the order the warp wrote them.

Times. ``%globaltimer`` is the same clock on every SM, but some GPUs advance it only every
microsecond; ``%clock64`` counts the SM's cycles exactly but each SM has its own. ``times``
gives each event its globaltimer time unless the warp's clock says better: within a warp (one
SM), the time from its first event is its cycles divided by the SM's rate, the rate measured
over that SM's events in the launch (the least-squares slope of its cycles against its timer,
which averages the timer's steps out), when that span is long enough for the steps not to
matter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyhpctk.instrument.ptx.traces import EVENT_DTYPE

WARP_EVENT_DTYPE = np.dtype(
    [
        ("time", "<u8"),
        ("clock", "<u8"),
        ("mask", "<u4"),
        ("cta_x", "<u4"),
        ("cta_y", "<u2"),
        ("cta_z", "<u2"),
        ("sm", "<u2"),
        ("slot", "<u1"),  # %warpid: the warp slot of its SM
        ("site", "<u2"),
        ("warp", "<u4"),  # the warp's index in the launch
    ]
)
_MIN_SPAN_NS = 20_000  # an SM's events must span this long for its clock rate to be trusted
_RATES_GHZ = (0.2, 5.0)  # a rate outside this is no SM clock: keep the timer


@dataclass(frozen=True)
class WarpEvents:
    """A launch's decoded events: ``rows`` grouped by warp, each warp's in its order; ``lost``
    events that found no room (counted on the device)."""

    rows: np.ndarray  # WARP_EVENT_DTYPE
    lost: int = 0

    @property
    def warps(self) -> int:
        return int(self.rows["warp"].max()) + 1 if len(self.rows) else 0

    def of_warp(self, warp: int) -> np.ndarray:
        mine: np.ndarray = self.rows[self.rows["warp"] == warp]
        return mine


def as_events(raw: bytes | np.ndarray) -> np.ndarray:
    """A buffer's bytes as events (EVENT_DTYPE); a size that is no whole number of events is
    a ValueError."""
    data = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, bytes) else np.asarray(raw)
    data = data.reshape(-1).view(np.uint8)
    if data.size % EVENT_DTYPE.itemsize:
        raise ValueError(f"{data.size} bytes are no whole number of {EVENT_DTYPE.itemsize}-byte "
                         "events")  # fmt: skip
    events: np.ndarray = data.view(EVENT_DTYPE)
    return events


def _rows(events: np.ndarray, warp: np.ndarray) -> np.ndarray:
    out = np.zeros(len(events), dtype=WARP_EVENT_DTYPE)
    for name in ("time", "clock", "mask", "cta_x"):
        out[name] = events[name]
    out["cta_y"] = events["cta_yz"] & 0xFFFF
    out["cta_z"] = events["cta_yz"] >> 16
    out["site"] = events["where"] & 0xFFFF
    out["sm"] = (events["where"] >> 16) & 0x3FF
    out["slot"] = events["where"] >> 26
    out["warp"] = warp
    return out


def decode_exact(raw: bytes | np.ndarray, table: np.ndarray, lost: int = 0) -> WarpEvents:
    """The exact strategy's buffer: warp ``g``'s events in ``table[g]``'s slots."""
    events = as_events(raw)
    table = np.asarray(table, dtype=np.uint64).reshape(-1, 2)
    if len(table) and int(table[-1, 1]) > len(events):
        raise ValueError(f"the table reaches slot {int(table[-1, 1])}, the buffer holds "
                         f"{len(events)} events")  # fmt: skip
    sizes = (table[:, 1] - table[:, 0]).astype(np.int64)
    warp = np.repeat(np.arange(len(table), dtype=np.uint32), sizes)
    ranges = [np.arange(int(a), int(b), dtype=np.int64) for a, b in table.tolist()]
    picked = events[np.concatenate(ranges) if ranges else np.zeros(0, np.int64)]
    written = picked["time"] != 0
    return WarpEvents(_rows(picked[written], warp[written]), lost)


def decode_chunks(
    raw: bytes | np.ndarray, chunk_events: int, taken: int | None = None, lost: int = 0
) -> WarpEvents:
    """The chunk strategy's pool of ``chunk_events``-slot chunks (``taken``: how many the
    cursor handed out, if known)."""
    events = as_events(raw)
    chunks = len(events) // chunk_events
    pool = events[: chunks * chunk_events].reshape(chunks, chunk_events)
    if taken is not None:
        pool = pool[: min(taken, chunks)]
    used = np.flatnonzero(pool["time"][:, 0] != 0)
    if not len(used):
        return WarpEvents(np.zeros(0, WARP_EVENT_DTYPE), lost)
    first = pool[used, 0]
    keys = np.stack([first["cta_yz"], first["cta_x"], first["where"] >> 16], axis=1)
    _, owner = np.unique(keys.astype(np.uint64), axis=0, return_inverse=True)
    owner = owner.reshape(-1).astype(np.uint32)
    order = np.lexsort((used, owner))  # by warp, then the order its chunks were taken
    parts, warps = [], []
    for c in order.tolist():
        chunk = pool[used[c]]
        chunk = chunk[chunk["time"] != 0]
        parts.append(chunk)
        warps.append(np.full(len(chunk), owner[c], dtype=np.uint32))
    return WarpEvents(_rows(np.concatenate(parts), np.concatenate(warps)), lost)


def sm_rates(rows: np.ndarray) -> dict[int, float]:
    """Each SM's clock rate (cycles per ns) where it can be trusted: the least-squares slope of
    its cycles against its timer, its events spanning at least ``_MIN_SPAN_NS`` (all SMs in one
    pass over the events, sorted by SM)."""
    if not len(rows):
        return {}
    sm = rows["sm"].astype(np.int64)
    order = np.argsort(sm, kind="stable")
    sm = sm[order]
    t, c = rows["time"].astype(np.int64)[order], rows["clock"].astype(np.int64)[order]
    starts = np.flatnonzero(np.r_[True, sm[1:] != sm[:-1]])
    n = np.diff(np.r_[starts, len(sm)]).astype(np.float64)
    t0, c0 = np.minimum.reduceat(t, starts), np.minimum.reduceat(c, starts)
    group = np.repeat(np.arange(len(starts)), n.astype(np.int64))
    x, y = (t - t0[group]).astype(np.float64), (c - c0[group]).astype(np.float64)
    x -= (np.add.reduceat(x, starts) / n)[group]  # centred: no cancellation in the sums
    y -= (np.add.reduceat(y, starts) / n)[group]
    spread = np.add.reduceat(x * x, starts)
    span = np.maximum.reduceat(t, starts) - t0
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.add.reduceat(x * y, starts) / spread
    ok = (span >= _MIN_SPAN_NS) & (spread > 0) & (rate >= _RATES_GHZ[0]) & (rate <= _RATES_GHZ[1])
    return {int(sm[starts[i]]): float(rate[i]) for i in np.flatnonzero(ok).tolist()}


def times(rows: np.ndarray) -> np.ndarray:
    """Each event's time in ns (the module docstring): the warp's first event's globaltimer,
    plus its cycles since then at its SM's measured rate where that rate can be trusted.
    ``rows`` are grouped by warp (as the decoders give them)."""
    out = rows["time"].astype(np.int64)  # ns since the epoch: no float holds them to the ns
    rates = sm_rates(rows)
    if not len(rows) or not rates:
        return out
    warp = rows["warp"].astype(np.int64)
    first = np.flatnonzero(np.r_[True, warp[1:] != warp[:-1]])  # each warp's first event
    own = first[np.cumsum(np.r_[True, warp[1:] != warp[:-1]]) - 1]  # each event's warp's first
    rate = np.zeros(int(rows["sm"].max()) + 1)
    rate[list(rates)] = list(rates.values())
    per_event = rate[rows["sm"].astype(np.int64)]
    clocked = per_event > 0
    cycles = rows["clock"].astype(np.int64) - rows["clock"].astype(np.int64)[own]
    shift = np.rint(cycles[clocked] / per_event[clocked]).astype(np.int64)
    out[clocked] = out[own[clocked]] + shift
    return out

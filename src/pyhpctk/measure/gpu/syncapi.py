"""Synchronizations timed by the C hook at the API (``gpu=nvidia,sync=api``), not by CUPTI.

CUPTI's ``SYNCHRONIZATION`` activity kind made PyTorch training steps 1.26-1.37x slower on the
H200 with no pyhpctk code running at all, against 0.90-1.07x for every other kind together
(``benchmarks/cupti_knobs.py``, GPT-2). The C hook already sees every synchronization call in
CUPTI's callback API, so with ``sync=api`` (the default, :data:`.spec.DEFAULT_SYNC`) it times each
one there, a CUPTI timestamp at API entry and another at exit, and makes the row CUPTI's
record gave (``_cuptihook_syncs.c``); the SYNCHRONIZATION kind is never enabled. The monitor
gets the rows with CUPTI's next buffer, so matching, GSYNC metrics, traces and idleness blame
see what they saw before.

Which API gives which row is declared once here (:data:`SYNC_TYPES`); this module never talks
to CUPTI and imports nothing of the backends.

``sync=activity``: CUPTI's records, as before; also what the Python hook (``hook=python``) and
PC sampling or instruction counting (every call goes to Python there) always use.
``sync=both`` (diagnosis, the device test): CUPTI's records go to the monitor and the hook's
rows are kept aside (:attr:`ApiSyncs.kept`) to compare.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.spec import DEFAULT_SYNC, SYNC_MODES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyhpctk.measure.gpu.backend import NativeHook

SYNC_API, SYNC_ACTIVITY, SYNC_BOTH = SYNC_MODES
__all__ = ["DEFAULT_SYNC", "SYNC_MODES", "ApiSyncs", "activity_rows", "sync_entries"]

#: A synchronization API's name (CUPTI's callback-id names) → the type of the row CUPTI gives
#: it; first match wins, None: CUPTI gives none. Event and stream *queries* give a record for
#: every call by default (``cuptiActivityEnableAllSyncRecords``, cupti_activity.h), as the
#: H200 fixtures show (an EVENT record at each call of the sites that have any);
#: ``cudaEventRecord`` gives a CUDA_EVENT record, never a synchronization.
SYNC_TYPES: tuple[tuple[str, int | None], ...] = (
    (r"EventRecord", None),
    (r"WaitEvent", act.SYNC_STREAM_WAIT),  # cuCtxWaitEvent, cuGreenCtxWaitEvent: no stream
    (r"StreamSynchronize|StreamQuery", act.SYNC_STREAM),
    (r"EventSynchronize|EventQuery", act.SYNC_EVENT),
    (r"Synchronize", act.SYNC_CONTEXT),  # cudaDeviceSynchronize, cuCtxSynchronize(_v2)...
)
_COMPILED = tuple((re.compile(pattern), kind) for pattern, kind in SYNC_TYPES)
_STREAM_FIRST = re.compile(r"^cu(da)?Stream")  # the call's first parameter is the stream
_PER_THREAD = re.compile(r"_pt(sz|ds)(_|$)")  # the NULL stream is the thread's own

#: One row of the hook's ``take_syncs()`` (``SyncRow`` in _cuptihook_syncs.c; 40 bytes).
SYNC_ROW_DTYPE = np.dtype(
    {
        "names": ["correlation", "start", "end", "context", "stream", "sync_kind"],
        "formats": ["<u8", "<u8", "<u8", "<u4", "<u4", "<u4"],
        "offsets": [0, 8, 16, 24, 28, 32],
        "itemsize": 40,
    }
)


def sync_row_type(name: str) -> tuple[int, bool, bool] | None:
    """The row an API gives: (sync type, first parameter is a stream, per-thread); None: none."""
    for pattern, kind in _COMPILED:
        if pattern.search(name):
            if kind is None:
                return None
            stream = _STREAM_FIRST.match(name) is not None
            return kind, stream, _PER_THREAD.search(name) is not None
    return None


def sync_entries(
    names: Mapping[tuple[int, int], str], kinds: Mapping[tuple[int, int], int]
) -> list[tuple[int, int, int, int, int]]:
    """The hook's ``sync_apis()`` entries: each (domain, cbid) of kind SYNC that gives a row."""
    entries = []
    for key, kind in kinds.items():
        found = sync_row_type(names.get(key, "")) if kind == act.SYNC else None
        if found is not None:
            entries.append((key[0], key[1], found[0], int(found[1]), int(found[2])))
    return entries


def timed_at_api(mode: str, hooked: bool, fine: bool) -> bool:
    """Whether the C hook times synchronizations: ``sync=api|both``, the C hook, and no PC
    sampling or instruction counting (those see every call in Python and keep CUPTI's)."""
    return mode != SYNC_ACTIVITY and hooked and not fine


def activity_rows(raw: bytes) -> np.ndarray:
    """The hook's rows as :data:`~pyhpctk.measure.gpu.activity.ACTIVITY_DTYPE` SYNC rows."""
    if len(raw) % SYNC_ROW_DTYPE.itemsize:
        raise ValueError(f"sync rows: {len(raw)} bytes is no whole number of rows")
    rows = np.frombuffer(raw, dtype=SYNC_ROW_DTYPE)
    out = act.empty_activities(len(rows))
    out["kind"] = act.SYNC
    out["sync_kind"] = rows["sync_kind"]
    for name in ("correlation", "start", "end", "context", "stream"):
        out[name] = rows[name]
    return out


class ApiSyncs:
    """A backend's synchronizations timed by the hook: configured, taken, joined to buffers."""

    def __init__(self, native: NativeHook, mode: str = SYNC_API) -> None:
        if mode not in (SYNC_API, SYNC_BOTH):
            raise ValueError(f"sync={mode!r}: the hook times synchronizations with api or both")
        self.native = native
        self.mode = mode
        self.rows = 0  # rows taken so far
        self.kept: list[np.ndarray] = []  # sync=both: the rows, kept here instead

    def configure(self, entries: list[tuple[int, int, int, int, int]]) -> None:
        """Tell the hook which APIs give rows (after its ``configure()``, before subscribing)."""
        self.native.sync_apis(entries)

    def take(self) -> np.ndarray:
        """The rows timed since the last call (ACTIVITY_DTYPE); with ``both``, kept instead."""
        rows = activity_rows(self.native.take_syncs())
        self.rows += len(rows)
        if self.mode == SYNC_BOTH:
            if len(rows):
                self.kept.append(rows)
            return rows[:0]
        return rows

    def joined(self, records: np.ndarray) -> np.ndarray:
        """A buffer's records with the rows timed since the last buffer after them."""
        rows = self.take()
        return np.concatenate([records, rows]) if len(rows) else records

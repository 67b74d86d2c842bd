"""Attribution: the monitor thread puts each thread's matched activities into that thread's CCT.

Activities are grouped by (CCT, node, kind, kernel or copy direction) with numpy; the CCT is
consulted once per group, and the metrics are summed per node with ``np.bincount``. Kernels go
below their placeholder as ``GPUKernl → gpubin@entry`` (hpcrun's shape).

Kernels whose names say they are communication (NCCL's collectives,
:mod:`pyhpctk.core.communication`) also get ``GCOMM (sec)`` and ``GCOMM:COUNT`` at the same node,
in a metric kind the session is given at the first such kernel (issue #22).

An activity that ran as a node of a CUDA graph goes below its launch's ``GPUGraph``
placeholder, into a copy of the call path that made the node (the capture), then under the
usual placeholder: ``replay line → GPUGraph → capture path → GPUKernl → kernel``
(docs/gpu.md, "CUDA graphs").

Everything here runs with the session lock held.
"""

from __future__ import annotations

import threading
from typing import TypeAlias

import numpy as np

from pyhpctk.core.communication import is_communication
from pyhpctk.measure.cct import MAIN_FENCE, THREAD_FENCE, KindValues, ThreadCCT, placeholder_ip
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.operations import (
    OP_CALL,
    OP_CCT,
    OP_KIND,
    OP_PLACEHOLDER,
    OP_THREAD,
    placeholder_name,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyhpctk.measure.cct import MetricKind
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.matching import SiteTable
    from pyhpctk.measure.gpu.operations import GpuThread, Operation


#: What the C hook's ``activity_sums()`` adds up (the order of _cuptihook_records.c's enums): the
#: metric indices, then the activity kinds.
SUM_LAYOUT = np.array(
    [
        gm.GPUOP,
        gm.GKER,
        gm.GKER_COUNT,
        gm.GKER_STMEM_ACUMU,
        gm.GKER_DYMEM_ACUMU,
        gm.GKER_LMEM_ACUMU,
        gm.GKER_FGP_ACT_ACUMU,
        gm.GKER_FGP_MAX_ACUMU,
        gm.GKER_THR_REG_ACUMU,
        gm.GKER_BLK_THR_ACUMU,
        gm.GKER_BLK_SM_ACUMU,
        gm.GKER_BLKS_ACUMU,
        gm.GXCOPY,
        gm.GXCOPY_BYTES,
        gm.GXCOPY_COUNT,
        gm.GMSET,
        gm.GMSET_BYTES,
        gm.GMSET_COUNT,
        gm.GMEM,
        gm.GMEM_BYTES,
        gm.GMEM_COUNT,
        gm.GSYNC,
        gm.GSYNC_TIME,
        gm.GSYNC_COUNT,
        *(act.KERNEL, act.COPY, act.MEMSET, act.ALLOC, act.FREE, act.SYNC),
    ],
    dtype=np.int64,
).tobytes()


def native_sums() -> Callable[..., bytes] | None:
    """The C hook's ``activity_sums`` (None where the hook is not built)."""
    from pyhpctk.measure.gpu.cupti.lib import load_hook

    return getattr(load_hook(), "activity_sums", None)


#: (call, placeholder, kind, kernel or copy direction) → the node metric_node gave.
NodeCache: TypeAlias = "dict[tuple[int, int, int, int], int]"


class KernelTable:
    """Kernel name → (load module of its gpubin, file offset of its entry); any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, tuple[int, int]] = {}

    def add(self, lm_id: int, entries: dict[str, int]) -> None:
        with self.lock:
            for name, offset in entries.items():
                self.entries.setdefault(name, (lm_id, offset))

    def prefer(self, lm_id: int, entries: dict[str, int]) -> None:
        """Kernels named by a load module of their own (the PTX pyrun counts them in, issue
        #34): their launches go to it even where a gpubin of theirs was loaded first."""
        with self.lock:
            self.entries.update((name, (lm_id, offset)) for name, offset in entries.items())

    def get(self, name: str) -> tuple[int, int] | None:
        return self.entries.get(name)

    def of_module(self, lm_id: int) -> dict[str, int]:
        with self.lock:
            return {n: off for n, (m, off) in self.entries.items() if m == lm_id}


class Attributor:
    """Puts activities into CCTs (see the module docstring)."""

    def __init__(
        self, host: Host, kind: MetricKind, kernels: KernelTable, limits: act.DeviceLimits
    ) -> None:
        self.host = host
        self.kind = kind
        self.kernels = kernels
        self.limits = limits
        self.trace = False
        self.outside: ThreadCCT | None = None  # the monitor's CCT for work outside the window
        self.table: Callable[[], SiteTable] | None = None
        #: Called after kernels were attributed: (cct, rows, target nodes, names) (PC, inst).
        self.kernels_attributed: Callable[[ThreadCCT, np.ndarray, np.ndarray, list[str]], None]
        self.kernels_attributed = _nothing
        self._mirrors: dict[tuple[int, int, int, int], int] = {}
        # Per CCT (held, so its id stays its own): (call, placeholder, kind, detail) → the node
        # metric_node gives; a CCT never loses a node, so an answer stays right.
        self._nodes: dict[int, tuple[ThreadCCT, NodeCache, NodeCache]] = {}
        self._kernels_seen = 0  # the kernel table's size when the provisional answers were given
        self.communication = CommunicationKernels(host)
        #: The metrics' sums in one C pass (None: with numpy, one pass per metric).
        self.sums = native_sums()

    def _limit_values(self) -> bytes:
        """The device limits as ``activity_sums()`` reads them."""
        limits = self.limits
        return np.array(
            [
                limits.warp_size,
                limits.max_threads_per_sm,
                limits.max_blocks_per_sm,
                limits.registers_per_sm,
                limits.shared_per_sm,
            ],
            dtype=np.int64,
        ).tobytes()

    def live_cct(
        self, operation: Operation, call: int, placeholder: int
    ) -> tuple[ThreadCCT, int, int]:
        """The CCT, call node and placeholder to attribute ``operation`` to now.

        When the session has retired the thread's CCT since the operation (the thread left
        Python for a while and was written out), the call path is copied into the thread's
        current CCT so the values land in a profile that will still be written.
        """
        cct: ThreadCCT = operation[OP_CCT]
        state: GpuThread = operation[OP_THREAD]
        if state.ident < 0 or state.own or cct is self.outside:
            return cct, call, placeholder
        live = self.host.live_thread(state.ident)
        if live is None or live[0] is cct:
            return cct, call, placeholder
        if live[1] is not None and live[1] is not state.thread:
            return cct, call, placeholder  # the ident now belongs to another thread
        return live[0], transplant(cct, call, live[0], state.main), -1

    def attribute(
        self,
        rows: np.ndarray,
        ops: Sequence[Operation],
        names: list[str],
        tokens: np.ndarray | None = None,
        captures: Sequence[Operation | None] | None = None,
    ) -> None:
        """Add the metrics of ``rows`` to their operations' CCTs.

        ``tokens`` (the C hook's, -1 where a Python path recorded the operation) let the
        columns come from the site table instead of one tuple per activity; ``captures`` (per
        activity, the operation that made its graph node) put graph nodes' activities under
        their capture paths.
        """
        if not len(ops):
            return
        table = self.table() if self.table is not None and tokens is not None else None
        if (
            table is not None
            and tokens is not None
            and ((tokens < 0).any() or tokens.max() >= len(table.objects))
        ):
            table = None  # some operations have no token: read them all from their tuples
        if table is not None and tokens is not None:
            cct_numbers = table.cct[tokens]
            several = bool((cct_numbers != cct_numbers[0]).any())
        else:
            first_cct = ops[0][OP_CCT]
            several = not all(operation[OP_CCT] is first_cct for operation in ops)
        if several:  # rare: several CCTs
            groups: dict[int, list[int]] = {}
            for index, operation in enumerate(ops):
                groups.setdefault(id(operation[OP_CCT]), []).append(index)
            for indices in groups.values():
                part = None if tokens is None else tokens[indices]
                mine = None if captures is None else [captures[i] for i in indices]
                self.attribute(rows[indices], [ops[i] for i in indices], names, part, mine)
            return
        if table is not None and tokens is not None:
            placeholders = table.placeholder[tokens]
            calls = table.call[tokens]
            launches = table.kind[tokens] == act.GRAPH
        else:
            columns = np.array(
                [(op[OP_PLACEHOLDER], op[OP_CALL], op[OP_KIND]) for op in ops], dtype=np.int64
            ).reshape(-1, 3)
            placeholders, calls = columns[:, 0].copy(), columns[:, 1].copy()
            launches = columns[:, 2] == act.GRAPH
        if launches.any():
            self._graph_anchors(ops, captures, launches, calls, placeholders)
        # One int64 key per activity: the placeholder (or, where it is placed now, the call
        # node), then the kind and the kernel / copy direction (a placeholder is its call
        # node's child, so the call node adds nothing once the placeholder is known).
        copies = placeholders < 0
        anchor = np.where(copies, calls, placeholders)
        detail = np.where(rows["kind"] == act.KERNEL, rows["function"], rows["copy_kind"])
        keys = (
            (anchor << 24)
            | (copies.astype(np.int64) << 23)
            | (rows["kind"].astype(np.int64) << 20)
            | ((detail.astype(np.int64) + 1) & 0xFFFFF)
        )
        _, where, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        kinds = rows["kind"][where].tolist()
        details = detail[where].tolist()
        firsts = where.tolist()
        calls_of, placeholders_of = calls[where].tolist(), placeholders[where].tolist()
        first = ops[firsts[0]]
        cct, _, _ = self.live_cct(first, calls_of[0], placeholders_of[0])
        nodes = np.empty(len(firsts), dtype=np.int64)
        if cct is first[OP_CCT]:  # the CCT the operations were unwound into is live
            known, provisional = self._node_cache(cct)
            for group, key in enumerate(
                zip(calls_of, placeholders_of, kinds, details, strict=True)
            ):
                node = known.get(key)
                if node is None:
                    node = provisional.get(key)
                if node is None:
                    node = self.metric_node(cct, *key, names)
                    if key[2] != act.KERNEL or self._entry(key[3], names) is not None:
                        known[key] = node
                    else:  # a kernel whose gpubin entry is not known yet
                        provisional[key] = node
                nodes[group] = node
        else:  # a retired CCT: each path is copied into the live one
            for group, index in enumerate(firsts):
                cct, call, placeholder = self.live_cct(
                    ops[index], calls_of[group], placeholders_of[group]
                )
                nodes[group] = self.metric_node(
                    cct, call, placeholder, kinds[group], details[group], names
                )
        targets = nodes[inverse]
        self.add_metrics(cct, rows, targets, (nodes, inverse))
        self.communication.attribute(cct, rows, targets, names)
        self.kernels_attributed(cct, rows, targets, names)

    def _node_cache(self, cct: ThreadCCT) -> tuple[NodeCache, NodeCache]:
        """``cct``'s answers of :meth:`metric_node`: those that hold for good, and those for
        kernels whose gpubin entry is not known (they hold until the kernel table grows; then
        the kernel's node moves below its entry)."""
        size = len(self.kernels.entries)
        if size != self._kernels_seen:
            self._kernels_seen = size
            for _, _, provisional in self._nodes.values():
                provisional.clear()
        found = self._nodes.get(id(cct))
        if found is None or found[0] is not cct:
            if len(self._nodes) >= 64:  # CCTs of threads long gone: let them go
                self._nodes.clear()
            found = self._nodes[id(cct)] = (cct, {}, {})
        return found[1], found[2]

    def _graph_anchors(
        self,
        ops: Sequence[Operation],
        captures: Sequence[Operation | None] | None,
        launches: np.ndarray,
        calls: np.ndarray,
        placeholders: np.ndarray,
    ) -> None:
        """Activities of a graph launch hang below its ``GPUGraph`` placeholder: below the copy
        of the call path that made their node where it is known, else right below it (their
        own placeholder is placed there when the group is attributed)."""
        graph = act.PLACEHOLDER_OF_KIND[act.GRAPH]
        graph_ip = placeholder_ip(graph)
        for index in np.flatnonzero(launches).tolist():
            cct: ThreadCCT = ops[index][OP_CCT]
            launch = int(placeholders[index])
            if launch < 0 or cct.ip[launch] != graph_ip:
                launch = cct.placeholder(int(calls[index]), graph)
            capture = captures[index] if captures is not None else None
            calls[index] = launch if capture is None else self.mirror(cct, launch, capture)
            placeholders[index] = -1

    def mirror(self, cct: ThreadCCT, under: int, capture: Operation) -> int:
        """The node below ``under`` in ``cct`` for the call path that made a graph node."""
        source: ThreadCCT = capture[OP_CCT]
        call: int = capture[OP_CALL]
        key = (id(cct), under, id(source), call)
        found = self._mirrors.get(key)
        if found is not None:
            return found
        path: list[tuple[int, int]] = []
        parent = source.parent
        walk = call
        while walk >= 0 and walk != source.fence and parent[walk] >= 0:
            path.append((source.lm[walk], source.ip[walk]))
            walk = parent[walk]
        node = under
        for lm, ip in reversed(path):
            node = cct.child(node, lm, ip)
        self._mirrors[key] = node
        return node

    def metric_node(
        self, cct: ThreadCCT, call: int, placeholder: int, kind: int, detail: int, names: list[str]
    ) -> int:
        """The node an activity's metrics go to: ``GPUKernl → gpubin@entry`` for kernels."""
        name = placeholder_name(kind, detail)
        if placeholder < 0 or cct.ip[placeholder] != placeholder_ip(name):
            placeholder = cct.placeholder(call, name)
        if kind != act.KERNEL:
            return placeholder
        entry = self._entry(detail, names)
        if entry is None:
            return placeholder
        kernel = cct.child(placeholder, *entry)
        if self.trace:  # hpcrun also keeps the traced twin GPUTrace → gpubin@entry, retained
            traced = cct.child(cct.placeholder(call, act.TRACE_PLACEHOLDER), *entry)
            cct.retain(traced)
        return kernel

    def _entry(self, detail: int, names: list[str]) -> tuple[int, int] | None:
        """The gpubin entry of kernel ``names[detail]`` (None: not known, or yet)."""
        return self.kernels.get(names[detail]) if 0 <= detail < len(names) else None

    def add_metrics(
        self,
        cct: ThreadCCT,
        rows: np.ndarray,
        targets: np.ndarray,
        grouped: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Sum each metric per target node and add the sums to ``cct``.

        ``grouped``: ``targets`` as (a node per group, each row's group), when known. With the
        C hook built the sums take one pass in C (:data:`SUM_LAYOUT`); else, or with
        :attr:`sums` None, one numpy pass per metric, which gives the same values.
        """
        if grouped is not None and len(grouped[0]) > 1:
            nodes, first = np.unique(grouped[0], return_inverse=True)
            inverse = first.reshape(-1)[grouped[1]]
        elif grouped is not None:
            nodes, inverse = grouped[0], np.zeros(len(rows), dtype=np.int64)
        else:
            nodes, inverse = np.unique(targets, return_inverse=True)
            inverse = inverse.reshape(-1)
        sums = self.sums
        if sums is not None and rows.dtype == act.ACTIVITY_DTYPE and self.limits.warp_size > 0:
            store = cct.values_of(self.kind)
            width = store.kind.width
            matrix = sums(
                np.ascontiguousarray(rows),
                np.ascontiguousarray(inverse, dtype=np.int64),
                len(nodes),
                width,
                SUM_LAYOUT,
                self._limit_values(),
            )
            add_rows(store, nodes.tolist(), np.frombuffer(matrix).reshape(len(nodes), width))
            return
        width = len(nodes)
        columns: dict[int, np.ndarray] = {}

        def add(metric: int, selected: np.ndarray, values: np.ndarray | None = None) -> None:
            """Per node, the sum of ``values`` (None: the count) of the selected activities."""
            weights = None if values is None else values.astype(np.float64)
            sums = np.bincount(selected, weights=weights, minlength=width).astype(np.float64)
            previous = columns.get(metric)
            columns[metric] = sums if previous is None else previous + sums

        kinds = rows["kind"]
        duration = (rows["end"].astype(np.int64) - rows["start"].astype(np.int64)).clip(0) / 1e9
        add(gm.GPUOP, inverse, duration)
        is_kernel = kinds == act.KERNEL
        launched = int(is_kernel.sum())
        if launched:
            every = launched == len(rows)  # the common buffer: kernels only, no mask needed
            kernels = rows if every else rows[is_kernel]
            selected = inverse if every else inverse[is_kernel]
            add(gm.GKER, selected, duration if every else duration[is_kernel])
            add(gm.GKER_COUNT, selected)
            add(gm.GKER_STMEM_ACUMU, selected, kernels["static_smem"])
            add(gm.GKER_DYMEM_ACUMU, selected, kernels["dynamic_smem"])
            add(gm.GKER_LMEM_ACUMU, selected, kernels["local_mem"])
            active, maximum = act.occupancy(kernels, self.limits)
            add(gm.GKER_FGP_ACT_ACUMU, selected, active)
            add(gm.GKER_FGP_MAX_ACUMU, selected, maximum)
            add(gm.GKER_THR_REG_ACUMU, selected, kernels["registers"])
            add(gm.GKER_BLK_THR_ACUMU, selected, kernels["block_threads"])
            shared = kernels["static_smem"].astype(np.int64) + kernels["dynamic_smem"]
            add(gm.GKER_BLK_SM_ACUMU, selected, shared)
            add(gm.GKER_BLKS_ACUMU, selected, kernels["grid_blocks"])
        if launched == len(rows):
            add_columns(cct.values_of(self.kind), nodes.tolist(), columns)
            return
        for kind, time_metric, bytes_metric, count_metric, field, limit in (
            (act.COPY, gm.GXCOPY, gm.GXCOPY_BYTES, gm.GXCOPY_COUNT, "copy_kind", 11),
            (act.MEMSET, gm.GMSET, gm.GMSET_BYTES, gm.GMSET_COUNT, "memory_kind", 8),
            (act.ALLOC, gm.GMEM, gm.GMEM_BYTES, gm.GMEM_COUNT, "memory_kind", 8),
            (act.FREE, gm.GMEM, gm.GMEM_BYTES, gm.GMEM_COUNT, "memory_kind", 8),
        ):
            mask = kinds == kind
            if not mask.any():
                continue
            selected = inverse[mask]
            add(time_metric, selected, duration[mask])
            add(count_metric, selected)
            sub = np.where(rows[field][mask] < limit, rows[field][mask], 0)
            moved = rows["bytes"][mask]
            for value in np.unique(sub).tolist():
                part = sub == value
                add(bytes_metric + int(value), selected[part], moved[part])
        is_sync = kinds == act.SYNC
        if is_sync.any():
            selected = inverse[is_sync]
            waited = duration[is_sync]
            add(gm.GSYNC, selected, waited)
            add(gm.GSYNC_COUNT, selected)
            sub = np.where(rows["sync_kind"][is_sync] < 5, rows["sync_kind"][is_sync], 0)
            for value in np.unique(sub).tolist():
                part = sub == value
                add(gm.GSYNC_TIME + int(value), selected[part], waited[part])
        add_columns(cct.values_of(self.kind), nodes.tolist(), columns)


class CommunicationKernels:
    """``GCOMM`` for the kernels whose names say they are communication (issue #22).

    Names are classified once each (a buffer's function table only grows); the metric kind is
    added to the session at the first communication kernel, so a program without any writes
    the same profiles as before.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.kind: MetricKind | None = None
        self._known: dict[str, bool] = {}
        self._flags: tuple[int, int, np.ndarray] = (0, 0, np.zeros(0, dtype=bool))

    def flags(self, names: list[str]) -> np.ndarray:
        """One bool per name of ``names``: is it a communication kernel."""
        ident, length, flags = self._flags
        if ident != id(names) or length != len(names):
            known = self._known
            flags = np.array([known.setdefault(n, is_communication(n)) for n in names], dtype=bool)
            self._flags = (id(names), len(names), flags)
        return flags

    def attribute(
        self, cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]
    ) -> None:
        """Add ``GCOMM`` and ``GCOMM:COUNT`` of the communication kernels among ``rows``."""
        flags = self.flags(names)
        if not flags.any():
            return
        function = rows["function"].astype(np.int64)
        known = (rows["kind"] == act.KERNEL) & (function >= 0) & (function < len(flags))
        mask = np.zeros(len(rows), dtype=bool)
        mask[known] = flags[function[known]]
        if not mask.any():
            return
        if self.kind is None:
            self.kind = self.host.add_metric_kind(gm.comm_metric_kind())
        nodes, inverse = np.unique(targets[mask], return_inverse=True)
        inverse = inverse.reshape(-1)
        chosen = rows[mask]
        duration = (chosen["end"].astype(np.int64) - chosen["start"].astype(np.int64)).clip(0)
        width = len(nodes)
        columns = {
            gm.GCOMM: np.bincount(inverse, weights=duration / 1e9, minlength=width),
            gm.GCOMM_COUNT: np.bincount(inverse, minlength=width).astype(np.float64),
        }
        add_columns(cct.values_of(self.kind), nodes.tolist(), columns)


def add_columns(store: KindValues, nodes: list[int], columns: dict[int, np.ndarray]) -> None:
    """``store`` += ``columns`` (metric → one sum per node of ``nodes``), in a few numpy steps.

    The store's flat ``array('d')`` is viewed in place (it is not resized while the view
    lives); nodes new to the store get their slots first, as :meth:`KindValues.add` gives them.
    """
    slots = _slots(store, nodes)
    width = store.kind.width
    if not columns or not slots:
        return
    base = np.asarray(slots, dtype=np.int64) * width
    values = np.frombuffer(store.values, dtype=np.float64)
    try:
        for metric, sums in columns.items():
            values[base + metric] += sums
    finally:
        del values  # the array may grow again


def _slots(store: KindValues, nodes: list[int]) -> list[int]:
    """The slot of each node in ``store`` (nodes new to it get theirs, zeroed, in order)."""
    slot_of = store.slot_of
    slots = []
    fresh = 0
    for node in nodes:
        slot = slot_of.get(node)
        if slot is None:
            slot = slot_of[node] = len(slot_of)
            fresh += 1
        slots.append(slot)
    if fresh:
        store.values.frombytes(bytes(8 * store.kind.width * fresh))
    return slots


def add_rows(store: KindValues, nodes: list[int], matrix: np.ndarray) -> None:
    """``store`` += ``matrix`` (one row of the kind's whole width per node of ``nodes``)."""
    slots = _slots(store, nodes)
    if not slots:
        return
    values = np.frombuffer(store.values, dtype=np.float64).reshape(-1, store.kind.width)
    try:
        values[np.asarray(slots, dtype=np.int64)] += matrix
    finally:
        del values  # the array may grow again


def _nothing(cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]) -> None:
    """No fine-grained (PC, instruction) attribution in this run."""


def transplant(source: ThreadCCT, node: int, target: ThreadCCT, main: bool) -> int:
    """The node in ``target`` for ``source``'s call path ending at ``node`` (created as needed).

    The path below the fence is copied frame by frame; it hangs from ``target``'s fence of the
    same kind (``| Main`` or ``| Thread``).
    """
    path: list[tuple[int, int]] = []
    parent = source.parent
    walk = node
    while walk >= 0 and walk != source.fence and parent[walk] >= 0:
        path.append((source.lm[walk], source.ip[walk]))
        walk = parent[walk]
    fence_ip = placeholder_ip(MAIN_FENCE if main else THREAD_FENCE)
    into = target.fence if target.ip[target.fence] == fence_ip else None
    if into is None:
        into = target.placeholder(target.root, MAIN_FENCE if main else THREAD_FENCE)
    for lm, ip in reversed(path):
        into = target.child(into, lm, ip)
    return into

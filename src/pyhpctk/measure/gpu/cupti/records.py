"""CUPTI activity records to :data:`~pyhpctk.measure.gpu.activity.ACTIVITY_DTYPE` rows.

Which field of a CUPTI record (cupti-python's ``activity_*_dtype`` layouts, any version) becomes
which field of an activity row is declared once here, as data (:data:`FIELDS`, :data:`PRODUCTS`).
Two readers follow it:

- :func:`convert`: numpy, one column at a time (the slow, obvious path, and the tests' oracle);
- :class:`Converter`: a *plan* made once per record layout (byte offsets and sizes), followed
  by the C hook's ``convert_records()`` in one pass over the records without the GIL (issue
  #18: the numpy path's passes cost about 0.3 µs per record on the buffer thread, mostly with
  the GIL, which the program's launching thread waits for).

Nothing here talks to CUPTI: the caller says where the records of one kind lie in a buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pyhpctk.measure.gpu import activity as act

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyhpctk.measure.gpu.backend import NativeHook

#: Activity row field ← the first of these record fields the layout has (any spelling: see
#: :func:`key`), by activity kind (None: every kind).
FIELDS: dict[int | None, tuple[tuple[str, tuple[str, ...]], ...]] = {
    None: (
        ("correlation", ("correlationId",)),
        ("device", ("deviceId",)),
        ("context", ("contextId",)),
        ("stream", ("streamId",)),
        ("start", ("start", "timestamp")),
        ("end", ("end", "timestamp")),
        ("bytes", ("bytes",)),
        ("graph", ("graphId",)),
        ("graph_node", ("graphNodeId",)),
    ),
    act.KERNEL: (
        ("registers", ("registersPerThread",)),
        ("static_smem", ("staticSharedMemory",)),
        ("dynamic_smem", ("dynamicSharedMemory",)),
        ("local_mem", ("localMemoryTotal",)),
    ),
    act.COPY: (("copy_kind", ("copyKind",)),),
    act.MEMSET: (("memory_kind", ("memoryKind",)),),
    act.SYNC: (("sync_kind", ("type",)),),
    act.ALLOC: (("memory_kind", ("memoryKind",)), (act.ADDRESS, ("address",))),
}
#: Kernel row fields that are the product of three record fields (the launch's dimensions).
PRODUCTS = (
    ("block_threads", ("blockX", "blockY", "blockZ")),
    ("grid_blocks", ("gridX", "gridY", "gridZ")),
)
KERNEL_NAME = "name"  # the kernel's name: a pointer to a C string, valid while CUPTI runs
MEMORY_OPERATION = "memoryOperationType"  # ALLOC records: 2 (RELEASE) makes it a FREE
_RELEASE = 2


def key(name: str) -> str:
    """A field name as compared: ``correlation_id`` and ``correlationId`` are the same."""
    return name.replace("_", "").lower()


_FIELD_KEYS: dict[np.dtype, dict[str, str]] = {}  # a record layout's fields by key()


def field_name(dtype: np.dtype, *names: str) -> str | None:
    """The layout's spelling of the first of ``names`` it has (None: none)."""
    keys = _FIELD_KEYS.get(dtype)
    if keys is None:
        keys = _FIELD_KEYS[dtype] = {key(name): name for name in dtype.names or ()}
    for name in names:
        found = keys.get(key(name))
        if found is not None:
            return found
    return None


def field(rows: np.ndarray, *names: str) -> np.ndarray | None:
    """The column of ``rows`` for the first of ``names`` its layout has."""
    found = field_name(rows.dtype, *names)
    return None if found is None else rows[found]


def convert(kind: int, rows: np.ndarray, name_index: Callable[[int], int]) -> np.ndarray:
    """Records of one kind as activity rows, with numpy (``name_index``: kernel name pointer →
    index into the function table)."""
    out = act.empty_activities(len(rows))
    out["kind"] = kind
    for target, names in FIELDS[None] + FIELDS.get(kind, ()):
        column = field(rows, *names)
        if column is not None:
            out[target] = column
    if kind == act.KERNEL:
        for target, axes in PRODUCTS:
            columns = [c for c in (field(rows, n) for n in axes) if c is not None]
            if len(columns) == 3:
                out[target] = np.prod(np.stack(columns).astype(np.int64), axis=0)
        pointers = field(rows, KERNEL_NAME)
        if pointers is not None:  # a few distinct names: look each up once
            unique, inverse = np.unique(pointers.astype(np.uint64), return_inverse=True)
            known = np.array([name_index(int(p)) for p in unique.tolist()], np.int64)
            out["function"] = known[inverse.reshape(-1)]
    elif kind == act.ALLOC:
        operation = field(rows, MEMORY_OPERATION)
        if operation is not None:
            out["kind"] = np.where(operation == _RELEASE, act.FREE, act.ALLOC)
    return out


# The plan's steps (_cuptihook_records.c): (op, row offset, row size, record offset, record
# size, record field signed).
_COPY, _MUL, _STORE, _NAME, _FREE = 0, 1, 2, 3, 4


def plan(kind: int, dtype: np.dtype) -> np.ndarray | None:
    """The steps ``convert_records()`` takes for records of ``dtype`` (None: a field that is not
    a plain integer of at most 8 bytes; :func:`convert` reads those)."""
    record: Mapping[str, tuple[Any, ...]] = dtype.fields or {}
    row: Mapping[str, tuple[Any, ...]] = act.ACTIVITY_DTYPE.fields or {}
    steps: list[tuple[int, int, int, int, int, int]] = []

    def step(op: int, target: str, source: str) -> bool:
        field_type, offset = record[source][0], int(record[source][1])
        if field_type.kind not in "iu" or field_type.itemsize > 8 or field_type.shape:
            return False
        row_type, row_offset = row[target][0], int(row[target][1])
        signed = int(field_type.kind == "i")
        steps.append((op, row_offset, row_type.itemsize, offset, field_type.itemsize, signed))
        return True

    for target, names in FIELDS[None] + FIELDS.get(kind, ()):
        found = field_name(dtype, *names)
        if found is not None and not step(_COPY, target, found):
            return None
    if kind == act.KERNEL:
        for target, axes in PRODUCTS:
            found_axes = [field_name(dtype, axis) for axis in axes]
            if None in found_axes:
                continue
            ops = (_MUL, _MUL, _STORE)
            if not all(step(op, target, str(a)) for op, a in zip(ops, found_axes, strict=True)):
                return None
        found = field_name(dtype, KERNEL_NAME)
        if found is not None and not step(_NAME, "function", found):
            return None
    elif kind == act.ALLOC:
        found = field_name(dtype, MEMORY_OPERATION)
        if found is not None and not step(_FREE, "kind", found):
            return None
    return np.array(steps, dtype=np.int64).reshape(-1, 6)


class Converter:
    """Records to rows with the C hook's ``convert_records()`` (one plan per layout)."""

    def __init__(self, native: NativeHook | None) -> None:
        self.native = native if hasattr(native, "convert_records") else None
        self._plans: dict[tuple[int, np.dtype], np.ndarray | None] = {}
        self._pointers = np.zeros(0, np.uint64)  # the kernel names known: sorted pointers
        self._indices = np.zeros(0, np.int32)  # and their function indices

    def rows(
        self,
        kind: int,
        dtype: np.dtype,
        buffer: int,
        valid: int,
        offsets: np.ndarray,
        name_index: Callable[[int], int],
        out: np.ndarray,
    ) -> bool:
        """Write into ``out`` the activity rows of the records of ``dtype`` at ``offsets`` of the
        buffer at address ``buffer``; False (nothing written): no C hook, or a layout it cannot
        follow (use :func:`convert`)."""
        native = self.native
        if native is None:
            return False
        key_ = (kind, dtype)
        steps = self._plans[key_] if key_ in self._plans else self._plan(key_)
        if steps is None:
            return False
        where = np.ascontiguousarray(offsets, dtype=np.int64)
        for _ in range(2):  # kernel names met for the first time: learned, then converted again
            missing = native.convert_records(
                buffer,
                valid,
                where,
                dtype.itemsize,
                steps,
                kind,
                act.FREE,
                self._pointers,
                self._indices,
                out,
            )
            if not missing:
                return True
            self._learn(np.frombuffer(missing, dtype=np.uint64).tolist(), name_index)
        return False  # more new names than one call reports (256): numpy reads this buffer

    def _plan(self, key_: tuple[int, np.dtype]) -> np.ndarray | None:
        found = self._plans[key_] = plan(*key_)
        return found

    def _learn(self, pointers: list[int], name_index: Callable[[int], int]) -> None:
        known = dict(zip(self._pointers.tolist(), self._indices.tolist(), strict=True))
        for pointer in pointers:
            known[pointer] = name_index(pointer)
        ordered = sorted(known)
        self._pointers = np.array(ordered, dtype=np.uint64)
        self._indices = np.array([known[p] for p in ordered], dtype=np.int32)

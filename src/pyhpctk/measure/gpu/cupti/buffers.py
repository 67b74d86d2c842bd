"""The CUPTI backend's activity buffers: completed buffers read into activity rows.

Two ways to read a completed buffer: ``raw`` (default) through libcupti's own
``cuptiActivityRegisterCallbacks`` (ctypes, or the C hook's callbacks and buffer thread), the
buffer cut into runs of one record kind and each kind converted in one pass (:meth:`parse_raw`);
``objects``, cupti-python's documented callback with one Python object per record (the fallback,
and the oracle the raw path is checked against on the device). Either way the rows go to the
monitor (:meth:`BufferReader._deliver`).

Nothing here raises into CUPTI: a bad buffer is reported and the others are still read.
"""

from __future__ import annotations

import _thread
import ctypes
import importlib
import re
import sys
import threading

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import syncapi
from pyhpctk.measure.gpu.cupti.lib import (
    BUFFER_COMPLETED,
    BUFFER_REQUESTED,
    load_hook,
    loaded_library,
)
from pyhpctk.measure.gpu.cupti.records import Converter, convert
from pyhpctk.measure.thread_names import name_own_thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from pyhpctk.measure.gpu.backend import MonitorPort, NativeHook


class Gather:
    """Pull records of one activity kind out of a raw buffer with one numpy gather.

    CUPTI's record versions of a kind (``CUpti_ActivityKernel9`` ... ``13``) only ever append
    fields, so any version no longer than the records' stride reads the fields used here.
    """

    def __init__(self, candidates: list[np.dtype]) -> None:
        self.candidates = sorted(candidates, key=lambda dtype: dtype.itemsize)
        self._padded: dict[int, np.dtype | None] = {}

    def rows(self, raw: np.ndarray, offsets: np.ndarray, strides: np.ndarray) -> np.ndarray | None:
        stride = int(strides.min()) if len(strides) else 0
        fitting = [d for d in self.candidates if d.itemsize <= stride]
        if not fitting:
            return None
        dtype = fitting[-1]
        index = offsets[:, None] + np.arange(dtype.itemsize)[None, :]
        return np.ascontiguousarray(raw[index]).view(dtype).reshape(-1)

    def padded(self, stride: int) -> np.dtype | None:
        """The longest version fitting ``stride``, padded to it (a strided view's dtype)."""
        if stride not in self._padded:
            fitting = [d for d in self.candidates if d.itemsize <= stride]
            padded = None
            if fitting:
                fields: Mapping[str, tuple[Any, ...]] = fitting[-1].fields or {}
                padded = np.dtype(
                    {
                        "names": list(fields),
                        "formats": [fields[n][0] for n in fields],
                        "offsets": [int(fields[n][1]) for n in fields],
                        "itemsize": stride,
                    }
                )
            self._padded[stride] = padded
        return self._padded[stride]


_LOOKAHEAD = 4096  # at most, records checked per numpy step of the numpy walk
_CHECKED = 256  # records of the first buffer also walked with CUPTI


def record_dtype_names(cupti: Any) -> dict[int, list[str]]:
    """The names of cupti-python's record dtypes (``activity_kernel9_dtype``...) of each kind
    pyrun reads, every version this CUPTI has (``cupti`` is the ``cupti.cupti`` module)."""
    names = [name for name in dir(cupti) if name.endswith("_dtype")]
    return {
        kind: [name for name in names if re.fullmatch(pattern, name)]
        for kind, pattern in (
            (act.KERNEL, r"activity_kernel\d*_dtype"),
            (act.COPY, r"activity_memcpy\d*_dtype"),
            (act.MEMSET, r"activity_memset\d*_dtype"),
            (act.SYNC, r"activity_synchronization\d*_dtype"),
            (act.ALLOC, r"activity_memory\d+_dtype"),
        )
    }


class BufferReader:
    """Reads CUPTI's activity buffers and hands their rows to the monitor (module docstring)."""

    def __init__(self, buffer_bytes: int = 8 << 20) -> None:
        self.buffer_bytes = buffer_bytes
        self.monitor: MonitorPort | None = None
        self.native: NativeHook | None = None  # the C hook, when CUPTI's buffers go through it
        self.api_syncs: syncapi.ApiSyncs | None = None  # sync=api: the hook's rows join buffers
        self.functions: list[str] = []
        self.record_counts: dict[str, int] = {}
        self.record_sizes: dict[int, int] = {}  # CUPTI activity kind → record size in buffers
        self.fast_walk = True
        # The C walk of a buffer's records (record_offsets), where the hook is built; the numpy
        # walk run by run otherwise.
        built = load_hook()  # (a hook built from older sources has no record_offsets)
        self.walker: NativeHook | None = built if hasattr(built, "record_offsets") else None
        self.converter = Converter(built)  # records to rows in C, where built
        self.checks_left = 1  # buffers walked both ways before the fast walk is trusted alone
        self.walk_mismatches = 0
        #: The device's occupancy limits, once the first kernel's device is known.
        self.learned_limits: act.DeviceLimits | None = None
        self._cupti: Any = None  # cupti-python's module (untyped), once started
        self._kinds: dict[int, int] = {}  # CUPTI activity kind enabled → ours
        self._gathers: dict[int, Gather] = {}
        self._lib: ctypes.CDLL | None = None
        self._buffers: dict[int, ctypes.Array[ctypes.c_uint8]] = {}
        self._callbacks: tuple[object, ...] = ()
        #: "off", "running" (the C hook's callbacks and buffer thread), "stopping"
        self._thread_state = "off"
        self._buffer_done = threading.Event()
        self._delivering = threading.Lock()  # one reader of taken buffers at a time
        self._names: dict[int, int] = {}  # kernel name pointer → index in self.functions
        self._excluded: set[int] = set()
        # record_sizes as record_offsets() reads them, and the sizes it was made from
        self._size_table: tuple[bytes, tuple[tuple[int, int], ...]] = (b"", ())

    def start(
        self,
        cupti: Any,
        monitor: MonitorPort,
        kinds: dict[int, int],
        raw: bool = True,
        native: NativeHook | None = None,
        api_syncs: syncapi.ApiSyncs | None = None,
    ) -> None:
        """Register for CUPTI's buffers (``raw``: libcupti's own callbacks, through the C hook
        where given) and enable the activity ``kinds`` (CUPTI's kind → ours)."""
        self._cupti, self.monitor = cupti, monitor
        self.native, self.api_syncs = native, api_syncs
        if raw:
            self._register_raw(cupti)
        else:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self._kinds = kinds
        for kind in kinds:
            cupti.activity_enable(kind)

    def stop(self) -> None:
        """Flush, disable the kinds, end the buffer thread (CUDA may already be torn down)."""
        cupti = self._cupti
        if cupti is None:
            return
        try:
            self.flush()
        except Exception as error:  # CUDA may already be torn down
            if self.monitor is not None:
                self.monitor.errors.append(f"pyrun: gpu: final CUPTI flush failed: {error!r}")
        for kind in self._kinds:
            try:
                cupti.activity_disable(kind)
            except Exception:  # already disabled, or CUDA torn down
                continue
        self._stop_buffer_thread()

    def finished(self) -> None:
        """No more buffers: :meth:`flush` does nothing from now on."""
        self._cupti = None

    def flush(self) -> None:
        """Every activity buffer CUPTI holds, to the monitor; the GIL released meanwhile.

        CUPTI's thread holds its own lock while it completes a buffer, and
        ``cuptiActivityFlushAll`` waits for that lock: flushing with the GIL held deadlocked
        with a completion callback that needed the GIL (docs/gpu.md, "No hang"). With the C
        hook the callbacks need no GIL at all, and the buffers the flush completed are
        delivered here, before this returns; otherwise libcupti is called through ctypes,
        which releases the GIL.
        """
        if self._cupti is None:
            return
        native = self.native if self._thread_state != "off" else None
        if native is not None:
            native.flush_all(1)
            with self._delivering:
                self._deliver_buffers(native, native.take_buffers(0.0))
                self.deliver_syncs()
            return
        lib = self._lib
        if lib is None:
            path = loaded_library("libcupti")
            lib = self._lib = ctypes.CDLL(path) if path is not None else None
        if lib is not None:
            lib.cuptiActivityFlushAll(1)  # a ctypes.CDLL call: the GIL is released
        self.deliver_syncs()

    # -- activity buffers: cupti-python objects --

    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _exclude_current(self) -> None:
        ident = threading.get_ident()
        if ident not in self._excluded:
            self._excluded.add(ident)
            if self.monitor is not None:
                self.monitor.exclude_current_thread()

    def _buffer_completed(self, activities: list[Any]) -> None:
        self._exclude_current()
        records = act.empty_activities(len(activities))
        keep = np.zeros(len(activities), dtype=bool)
        for index, record in enumerate(activities):
            kind = self._kinds.get(int(record.kind))
            if kind is None:
                continue
            keep[index] = True
            row = records[index]
            row["kind"] = kind
            row["correlation"] = record.correlation_id
            row["context"] = getattr(record, "context_id", 0)
            row["stream"] = getattr(record, "stream_id", 0)
            row["device"] = getattr(record, "device_id", 0)
            row["graph"] = getattr(record, "graph_id", 0)
            row["graph_node"] = getattr(record, "graph_node_id", 0)
            if kind == act.ALLOC:
                if int(record.memory_operation_type) == 2:
                    row["kind"] = act.FREE  # CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE
                row["start"] = row["end"] = record.timestamp
                row["bytes"] = record.bytes
                row["memory_kind"] = record.memory_kind
                row[act.ADDRESS] = getattr(record, "address", 0)
                continue
            row["start"] = record.start
            row["end"] = record.end
            if kind == act.KERNEL:
                row["registers"] = record.registers_per_thread
                row["static_smem"] = record.static_shared_memory
                row["dynamic_smem"] = record.dynamic_shared_memory
                row["local_mem"] = record.local_memory_total
                row["block_threads"] = record.block_x * record.block_y * record.block_z
                row["grid_blocks"] = record.grid_x * record.grid_y * record.grid_z
                row["function"] = self._function_index(str(record.name))
            elif kind == act.COPY:
                row["bytes"] = record.bytes
                row["copy_kind"] = record.copy_kind
            elif kind == act.MEMSET:
                row["bytes"] = record.bytes
                row["memory_kind"] = record.memory_kind
            elif kind == act.SYNC:
                row["sync_kind"] = record.type
        self._deliver(records[keep])

    def _function_index(self, name: str) -> int:
        index = self._names.get(hash(name))
        if index is None:
            index = self._names[hash(name)] = len(self.functions)
            self.functions.append(name)
        return index

    def deliver_syncs(self) -> None:
        """The synchronizations the hook timed since the last buffer, alone (a flush)."""
        if self.api_syncs is not None:
            rows = self.api_syncs.take()
            if len(rows):
                self._deliver(rows)

    def _deliver(self, records: np.ndarray) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        if self.api_syncs is not None:  # sync=api: as CUPTI's records came, with a buffer
            records = self.api_syncs.joined(records)
        if self.learned_limits is None and (records["kind"] == act.KERNEL).any():
            self._learn_limits(int(records["device"][records["kind"] == act.KERNEL][0]))
        monitor.buffer_completed(records, self.functions, self._take_dropped())

    def _take_dropped(self) -> int:
        cupti = self._cupti
        if cupti is None:
            return 0
        dropped = ctypes.c_size_t(0)
        try:
            cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        except Exception:
            return 0
        return int(dropped.value)

    def _learn_limits(self, device: int) -> None:
        self.learned_limits = act.DeviceLimits(name="NVIDIA (defaults until a kernel runs)")
        try:
            runtime = importlib.import_module("cuda.bindings.runtime")
            error, props = runtime.cudaGetDeviceProperties(device)
            if int(error) != 0:
                return
            limits = act.DeviceLimits(
                name=props.name.decode(errors="replace")
                if isinstance(props.name, bytes)
                else str(props.name),
                sm_count=int(props.multiProcessorCount),
                max_threads_per_sm=int(props.maxThreadsPerMultiProcessor),
                max_blocks_per_sm=int(props.maxBlocksPerMultiProcessor),
                registers_per_sm=int(props.regsPerMultiprocessor),
                shared_per_sm=int(props.sharedMemPerMultiprocessor),
                warp_size=int(props.warpSize),
            )
        except Exception:  # keep the defaults
            return
        self.learned_limits = limits
        if self.monitor is not None:
            self.monitor.set_limits(limits)

    # -- activity buffers: raw, through libcupti and numpy --

    def _register_raw(self, cupti: object) -> None:
        path = loaded_library("libcupti")
        if path is None:
            raise OSError("libcupti is not loaded (is cupti-python installed?)")
        lib = ctypes.CDLL(path)
        self._lib = lib
        lib.cuptiActivityGetNextRecord.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.cuptiActivityGetNextRecord.restype = ctypes.c_int
        if self.native is not None:  # the C hook's callbacks: CUPTI's thread needs no GIL
            self.native.register_buffers(path, self.buffer_bytes)
            self._thread_state = "running"
            self._buffer_done.clear()
            _thread.start_new_thread(self._buffer_main, (self.native,))
        else:
            requested = BUFFER_REQUESTED(self._raw_requested)
            completed = BUFFER_COMPLETED(self._raw_completed)
            self._callbacks = (requested, completed)
            status = lib.cuptiActivityRegisterCallbacks(requested, completed)
            if status != 0:
                raise OSError(f"cuptiActivityRegisterCallbacks failed with status {status}")
        self._gathers = {
            kind: Gather([getattr(cupti, name) for name in names])
            for kind, names in record_dtype_names(cupti).items()
        }

    def _buffer_main(self, native: NativeHook) -> None:
        """The buffer thread: completed buffers from the C hook's queue, read and delivered."""
        name_own_thread("pyrun-gpubufs")
        try:
            if self.monitor is not None:
                self.monitor.exclude_current_thread()
            while True:
                taken = native.take_buffers(0.25)  # waits without the GIL
                with self._delivering:
                    self._deliver_buffers(native, taken)
                if self._thread_state == "stopping" and not taken:
                    return
        finally:
            self._buffer_done.set()

    def _deliver_buffers(self, native: NativeHook, taken: list[tuple[int, int]]) -> None:
        for address, valid in taken:
            try:
                if valid:
                    self._deliver(self.parse_raw(address, valid))
            except Exception as error:  # one bad buffer must not stop the others
                if self.monitor is not None:
                    self.monitor.errors.append(f"pyrun: gpu: bad activity buffer: {error!r}")
                sys.stderr.write(f"pyrun: gpu: bad activity buffer: {error!r}\n")
            finally:
                native.free_buffer(address)

    def _stop_buffer_thread(self) -> None:
        native = self.native
        if native is None or self._thread_state == "off":
            return
        self._thread_state = "stopping"
        native.wake_buffers()
        self._buffer_done.wait(5.0)
        with self._delivering:  # what came after the thread's last look
            self._deliver_buffers(native, native.take_buffers(0.0))
        self._thread_state = "off"

    def _raw_requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        block = (ctypes.c_uint8 * (self.buffer_bytes + 8))()
        address = (ctypes.addressof(block) + 7) & ~7  # CUPTI wants 8-byte aligned buffers
        self._buffers[address] = block
        buffer[0] = address
        size[0] = self.buffer_bytes
        max_records[0] = 0

    def _raw_completed(self, context: int, stream: int, buffer: int, size: int, valid: int) -> None:
        try:
            self._exclude_current()
            block = self._buffers.pop(buffer, None)
            if not valid or block is None:
                return
            self._deliver(self.parse_raw(buffer, valid))
        except Exception as error:  # never raise into CUPTI
            if self.monitor is not None:
                self.monitor.errors.append(f"pyrun: gpu: bad activity buffer: {error!r}")
            sys.stderr.write(f"pyrun: gpu: bad activity buffer: {error!r}\n")

    def _walk_next_record(self, buffer: int, valid: int, limit: int = 0) -> np.ndarray:
        """Record offsets, one ``cuptiActivityGetNextRecord`` call each (``limit``: at most)."""
        lib = self._lib
        assert lib is not None
        record = ctypes.c_void_p(0)
        next_record = lib.cuptiActivityGetNextRecord
        offsets: list[int] = []
        append = offsets.append
        while next_record(buffer, valid, ctypes.byref(record)) == 0:
            append(int(record.value or 0) - buffer)
            if limit and len(offsets) >= limit:
                break
        return np.asarray(offsets, dtype=np.int64)

    def _learn_size(self, buffer: int, valid: int, at: int) -> int | None:
        """The size of the record at offset ``at``: where CUPTI puts the next one (one call)."""
        lib = self._lib
        if lib is None:
            return None
        record = ctypes.c_void_p(buffer + at)
        if lib.cuptiActivityGetNextRecord(buffer, valid, ctypes.byref(record)) != 0:
            return valid - at if at else None  # the last record: it ends the valid bytes
        size = int(record.value or 0) - buffer - at
        return size if size > 0 else None

    def _runs(
        self, words: np.ndarray, valid: int, buffer: int = 0
    ) -> list[tuple[int, int, int, int]] | None:
        """The buffer as runs of one record kind: ``(kind, offset, count, size)``, in order.

        Record sizes are learned once per kind (from CUPTI, one call at the first record of a
        kind not seen before); None when a size cannot be learned (the caller walks with
        CUPTI record by record). Each step looks ahead twice as far as the last, from 8 up to
        ``_LOOKAHEAD`` records, so long runs take few steps and alternating kinds short ones.
        """
        sizes = self.record_sizes
        runs: list[tuple[int, int, int, int]] = []
        at = 0
        while valid - at >= 8:
            kind = int(words[at // 4])
            size = sizes.get(kind)
            if size is None:
                size = self._learn_kind(kind, buffer, valid, at)
                if size is None:
                    return None
            count = (valid - at) // size
            run = 0
            step = 8
            while run < count:
                ahead = min(count - run, step)
                first = (at + run * size) // 4
                same = words[first : first + ahead * (size // 4) : size // 4] == kind
                if same.all():
                    run += ahead
                    step = min(2 * step, _LOOKAHEAD)
                    continue
                run += int(np.argmin(same))
                break
            if run == 0:
                return None
            runs.append((kind, at, run, size))
            at += size * run
        return runs

    def _learn_kind(self, kind: int, buffer: int, valid: int, at: int) -> int | None:
        """The record size of ``kind``, from CUPTI at the record at ``at`` (None: unknown).

        Only kinds this backend enabled are asked about: a kind word that is none of them means
        the walk is lost, and CUPTI must not be handed a non-record.
        """
        known = buffer and kind in self._kinds
        learned = self._learn_size(buffer, valid, at) if known else None
        if learned is None or learned % 8 or at + learned > valid:
            return None
        self.record_sizes[kind] = learned
        return learned

    def record_offsets(self, words: np.ndarray, valid: int, buffer: int) -> np.ndarray | None:
        """Where each record of a buffer starts (None: a record size could not be learned).

        With the C hook, one C walk over the buffer (``record_offsets``), resumed after
        learning the size of each kind met for the first time; otherwise run by run in numpy.
        """
        walker = self.walker
        if walker is None:
            runs = self._runs(words, valid, buffer)
            if runs is None:
                return None
            return np.concatenate(
                [start + size * np.arange(count, dtype=np.int64) for _, start, count, size in runs]
                or [np.zeros(0, np.int64)]
            )
        pieces = []
        at = 0
        while True:
            known = tuple(sorted(self.record_sizes.items()))
            if self._size_table[1] != known:
                table = np.zeros(256, dtype=np.uint32)
                for kind, size in known:
                    if 0 <= kind < 256:
                        table[kind] = size
                self._size_table = (table.tobytes(), known)
            found, stop = walker.record_offsets(buffer, valid, self._size_table[0], at)
            pieces.append(np.frombuffer(found, dtype=np.int64))
            if stop >= valid:
                return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            kind = int(words[stop // 4])
            if kind in self.record_sizes or self._learn_kind(kind, buffer, valid, stop) is None:
                return None  # a size CUPTI's own walk must settle
            at = stop

    def parse_raw(self, buffer: int, valid: int) -> np.ndarray:
        """Every known record of a completed buffer as an :data:`ACTIVITY_DTYPE` array.

        Records are located from each kind's size (:meth:`record_offsets`) and read in place,
        each kind in one pass of the C hook's ``convert_records()`` (:mod:`.records`; without
        the hook, with numpy through a strided view of the buffer): no per-record Python work,
        rows grouped by kind. The first buffer is also walked with CUPTI for its first ``_CHECKED``
        records, and a disagreement turns the fast walk off for the process.
        """
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * valid).from_address(buffer))
        words = raw[: valid - valid % 4].view("<u4")
        offsets = self.record_offsets(words, valid, buffer) if self.fast_walk else None
        if offsets is not None and self.checks_left > 0:
            self.checks_left -= 1
            slow = self._walk_next_record(buffer, valid, _CHECKED)
            if not np.array_equal(offsets[: len(slow)], slow):
                self.fast_walk = False  # never trust it again in this process
                self.walk_mismatches += 1
                offsets = None
        if offsets is None:
            return self._parse_walked(raw, words, buffer, valid)
        kinds = words[offsets // 4] if len(offsets) else np.zeros(0, np.uint32)
        chosen: list[tuple[int, np.dtype, np.ndarray]] = []
        for cupti_kind, kind in self._kinds.items():
            mine = offsets[kinds == cupti_kind]
            if not len(mine):
                continue
            name = act.KIND_NAMES[kind]
            self.record_counts[name] = self.record_counts.get(name, 0) + len(mine)
            dtype = self._gathers[kind].padded(self.record_sizes[cupti_kind])
            if dtype is not None:
                chosen.append((kind, dtype, mine))
        # One array for the rows of every kind, each kind's written in place (C or numpy).
        out = np.empty(sum(len(mine) for _, _, mine in chosen), dtype=act.ACTIVITY_DTYPE)
        at = 0
        for kind, dtype, mine in chosen:
            part = out[at : at + len(mine)]
            at += len(mine)
            if self.converter.rows(kind, dtype, buffer, valid, mine, self._name_index, part):
                continue
            first, count, size = int(mine[0]), len(mine), dtype.itemsize
            if int(mine[-1]) - first == (count - 1) * size:  # one run: read in place
                rows = np.ndarray((count,), dtype=dtype, buffer=raw, offset=first)
            else:
                # Every 8-byte boundary as the start of a record of this kind (records are
                # 8-byte aligned): one gather of opaque records picks them out of the buffer.
                opaque = np.dtype((np.void, size))
                slots = np.ndarray(((valid - size) // 8 + 1,), opaque, buffer=raw, strides=(8,))
                rows = slots[mine // 8].view(dtype)
            part[:] = self._convert(kind, rows)
        return out

    def _parse_walked(
        self, raw: np.ndarray, words: np.ndarray, buffer: int, valid: int
    ) -> np.ndarray:
        """:meth:`parse_raw` with every record located by CUPTI (unknown or untrusted sizes)."""
        at = self._walk_next_record(buffer, valid)
        kinds_slow = words[at // 4] if len(at) else np.zeros(0, np.uint32)
        for kind, stride in zip(kinds_slow[:-1].tolist(), np.diff(at).tolist(), strict=True):
            self.record_sizes[int(kind)] = int(stride)  # CUPTI's own walk: the truth
        strides = np.diff(np.append(at, valid))
        pieces = []
        for cupti_kind, kind in self._kinds.items():
            mask = kinds_slow == cupti_kind
            if not mask.any():
                continue
            name = act.KIND_NAMES[kind]
            self.record_counts[name] = self.record_counts.get(name, 0) + int(mask.sum())
            rows = self._gathers[kind].rows(raw, at[mask], strides[mask])
            if rows is not None:
                pieces.append(self._convert(kind, rows))
        return np.concatenate(pieces) if pieces else act.empty_activities()

    def _convert(self, kind: int, rows: np.ndarray) -> np.ndarray:
        return convert(kind, rows, self._name_index)

    def _name_index(self, pointer: int) -> int:
        index = self._names.get(pointer)
        if index is None:
            name = ctypes.string_at(pointer).decode("utf-8", "replace") if pointer else "?"
            index = self._names[pointer] = len(self.functions)
            self.functions.append(name)
        return index

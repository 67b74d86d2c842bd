"""One traced launch, both strategies: the host's part of :mod:`pyhpctk.instrument.ptx.traces`.

``exact`` (hip-analyzer's two passes):

1. save the memory the launch may write (:func:`.memory.writable_regions` of its arguments)
   into copies on the device;
2. the counting pass: the control block with no table and a zeroed tally per warp; run; read
   the tallies (each warp's event count);
3. put the saved memory back, so the traced pass computes from the same inputs;
4. the traced pass: a buffer of exactly the counted events (or the cap's share of each warp's,
   :class:`.buffers.ExactLayout`), the table, the tallies zeroed; run; read the buffer, and the
   tallies again: events the traced pass had no room for (0 when it took the counting pass's
   paths), with the control block's ``LOST``.

The program sees the traced pass's results: the counting pass's writes are undone in step 3.
Memory the kernel writes that its arguments do not show (a pointer inside a struct, a
module's own ``.global`` variables) is not saved: such a kernel is traced from what the
counting pass left there.

``chunks``: one run with a pool of chunks (the cap's bytes); the pool's cursor and ``LOST``
are read, then only the chunks the cursor handed out. No memory is saved: the kernel runs once.

The launcher needs the device's memory (:class:`.memory.DeviceMemory`), the address of the
kernel's control block in its loaded module, and a function that launches the kernel the way
the program does (a CuPy ``RawKernel`` call, a Triton kernel's ``[grid](...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.instrument.ptx.traces import CONTROL, EVENT_BYTES, Strategy, TracePlan
from pyhpctk.instrument.tracing.buffers import (
    DEFAULT_CHUNK_EVENTS,
    ChunkPool,
    Dim3,
    ExactLayout,
    control_words,
    launch_warps,
)
from pyhpctk.instrument.tracing.decode import WarpEvents, decode_chunks, decode_exact
from pyhpctk.instrument.tracing.memory import DeviceMemory, Region

DEFAULT_CAP_BYTES = 256 << 20


@dataclass
class LaunchTrace:
    """What one traced launch gave: the raw buffer as the device left it, how to cut it, and
    the events lost (counted on the device)."""

    kernel: str
    strategy: Strategy
    grid: Dim3
    block: Dim3
    raw: np.ndarray  # uint8: the event buffer
    lost: int
    table: np.ndarray | None = None  # exact: (warps, 2) u32 slot ranges
    counted: np.ndarray | None = None  # exact: u32 events per warp in the counting pass
    chunk_events: int = 0  # chunks: slots per chunk
    taken: int = 0  # chunks: chunks the cursor handed out
    saved_bytes: int = 0  # exact: memory saved and restored
    extra: dict[str, float] = field(default_factory=dict)

    def decode(self) -> WarpEvents:
        if self.strategy is Strategy.EXACT:
            assert self.table is not None
            return decode_exact(self.raw, self.table, self.lost)
        return decode_chunks(self.raw, self.chunk_events, self.taken, self.lost)


class TracedLauncher:
    """Runs traced launches of one kernel (the module docstring)."""

    def __init__(
        self,
        memory: DeviceMemory,
        control: int,
        plan: TracePlan,
        cap_bytes: int = DEFAULT_CAP_BYTES,
        chunk_events: int = DEFAULT_CHUNK_EVENTS,
    ) -> None:
        self.memory = memory
        self.control = control  # device address of the kernel's control block
        self.plan = plan
        self.cap_bytes = cap_bytes
        self.chunk_events = chunk_events

    def launch(
        self, run: Callable[[], object], grid: Dim3, block: Dim3, writable: Sequence[Region] = ()
    ) -> LaunchTrace:
        if self.plan.strategy is Strategy.EXACT:
            return self._exact(run, grid, block, writable)
        return self._chunks(run, grid, block)

    def _set(self, words: np.ndarray) -> None:
        self.memory.write(self.control, words.astype(np.uint64))

    def _lost(self) -> int:
        words = self.memory.read(self.control, 8 * len(CONTROL)).view(np.uint64)
        return int(words[CONTROL.LOST])

    def _buffer(self, nbytes: int, keep: list[int]) -> int:
        address = self.memory.alloc(max(nbytes, EVENT_BYTES))
        keep.append(address)
        self.memory.zero(address, max(nbytes, EVENT_BYTES))
        return address

    def _exact(
        self, run: Callable[[], object], grid: Dim3, block: Dim3, writable: Sequence[Region]
    ) -> LaunchTrace:
        mem, owned = self.memory, list[int]()
        warps = launch_warps(grid, block)
        try:
            saved = [(a, n, self._buffer(n, owned)) for a, n in writable]
            for address, size, copy in saved:
                mem.copy(copy, address, size)
            tallies = self._buffer(4 * warps, owned)
            self._set(control_words(Strategy.EXACT, tallies=tallies))
            run()
            mem.synchronize()
            counted = mem.read(tallies, 4 * warps).view(np.uint32).copy()
            for address, size, copy in saved:
                mem.copy(address, copy, size)
            layout = ExactLayout.from_tallies(counted, self.cap_bytes // EVENT_BYTES)
            table = layout.table()
            events = self._buffer(layout.nbytes, owned)
            table_at = self._buffer(table.nbytes, owned)
            mem.write(table_at, table)
            mem.zero(tallies, 4 * warps)
            self._set(control_words(Strategy.EXACT, events, table_at, tallies))
            run()
            mem.synchronize()
            raw = mem.read(events, layout.nbytes)
            missed = int(mem.read(tallies, 4 * warps).view(np.uint32).astype(np.uint64).sum())
            lost = missed + self._lost()
            self._set(control_words(Strategy.EXACT))
        except BaseException:
            self._set(control_words(Strategy.EXACT))  # no probe may write the freed buffers
            raise
        finally:
            for address in owned:
                mem.free(address)
        return LaunchTrace(self.plan.kernel, Strategy.EXACT, grid, block, raw, lost, table,
                           counted, saved_bytes=sum(n for _, n in writable))  # fmt: skip

    def _chunks(self, run: Callable[[], object], grid: Dim3, block: Dim3) -> LaunchTrace:
        pending = self.begin_chunks(grid, block)
        try:
            run()
        except BaseException:
            self._set(control_words(Strategy.CHUNKS))  # no probe may write the freed pool
            self.memory.free(pending.events)
            raise
        return self.finish_chunks(pending)

    def begin_chunks(self, grid: Dim3, block: Dim3) -> PendingChunks:
        """The chunk strategy's first half, for a launch this launcher does not make (a launch
        callback's enter): the pool allocated and zeroed, the control block set."""
        pool = ChunkPool.for_bytes(self.cap_bytes, self.chunk_events)
        events = self._buffer(pool.nbytes, [])
        self._set(control_words(Strategy.CHUNKS, events, chunk_events=pool.chunk_events,
                                chunks=pool.chunks))  # fmt: skip
        return PendingChunks(grid, block, pool, events)

    def finish_chunks(self, pending: PendingChunks) -> LaunchTrace:
        """The second half, after the launch (its exit): wait, read the cursor, ``LOST`` and
        the chunks handed out, reset the control block, free the pool."""
        mem, pool = self.memory, pending.pool
        try:
            mem.synchronize()
            words = mem.read(self.control, 8 * len(CONTROL)).view(np.uint64)
            taken = min(int(words[CONTROL.NEXT_CHUNK]) & 0xFFFFFFFF, pool.chunks)
            lost = int(words[CONTROL.LOST])
            raw = mem.read(pending.events, taken * pool.chunk_events * EVENT_BYTES)
            self._set(control_words(Strategy.CHUNKS))
        finally:
            mem.free(pending.events)
        return LaunchTrace(self.plan.kernel, Strategy.CHUNKS, pending.grid, pending.block, raw,
                           lost, chunk_events=pool.chunk_events, taken=taken)  # fmt: skip


@dataclass(frozen=True)
class PendingChunks:
    """A chunk-strategy launch between :meth:`TracedLauncher.begin_chunks` and
    :meth:`~TracedLauncher.finish_chunks`."""

    grid: Dim3
    block: Dim3
    pool: ChunkPool
    events: int  # device address of the pool

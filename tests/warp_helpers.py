"""Per-warp traces without a GPU (issue #34 item 4): a device memory in numpy, what the tracing
probes do (:func:`run_probes`, the contract of pyhpctk.instrument.ptx.traces written again in
Python: a model to test the host against, not an emulator of the PTX), and schedules whose
every event the tests know (:func:`schedule`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ptx_helpers import triton_ptx
from pyhpctk.instrument.ptx import CONTROL, EVENT_DTYPE, Sites, Strategy, instrument_traces
from pyhpctk.instrument.ptx.traces import NO_CHUNK
from pyhpctk.instrument.tracing import recording
from pyhpctk.instrument.tracing.buffers import Dim3, dim3, warps_per_cta
from pyhpctk.instrument.tracing.launcher import TracedLauncher

CLOCK_GHZ = 1.5  # the SMs' clock in the synthetic runs: cycles = ns * 3 // 2, in integers


class FakeMemory:
    """A device memory of numpy blocks (pyhpctk.instrument.tracing.memory.DeviceMemory)."""

    def __init__(self, packed: bool = False) -> None:
        self.blocks: dict[int, np.ndarray] = {}
        self.next = 0x1000_0000
        self.freed: list[int] = []
        self.synchronized = 0
        self.packed = packed  # allocations end to end, 512 bytes each at least (CuPy's pool)

    def alloc(self, nbytes: int) -> int:
        base = self.next
        if self.packed:
            nbytes = max((nbytes + 511) // 512 * 512, 512)
            self.next += nbytes
        else:
            self.next += (nbytes + 0xFFF) // 0x1000 * 0x1000 + 0x1000
        self.blocks[base] = np.full(nbytes, 0xCD, np.uint8)  # not zero: the caller must zero
        return base

    def _where(self, address: int, nbytes: int) -> tuple[np.ndarray, int]:
        for base, block in self.blocks.items():
            if base <= address and address + nbytes <= base + len(block):
                return block, address - base
        raise KeyError(f"no allocation holds {nbytes} bytes at {address:#x}")

    def free(self, address: int) -> None:
        del self.blocks[address]
        self.freed.append(address)

    def zero(self, address: int, nbytes: int) -> None:
        block, at = self._where(address, nbytes)
        block[at : at + nbytes] = 0

    def read(self, address: int, nbytes: int) -> np.ndarray:
        block, at = self._where(address, nbytes)
        return block[at : at + nbytes].copy()

    def write(self, address: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        block, at = self._where(address, raw.size)
        block[at : at + raw.size] = raw

    def copy(self, target: int, source: int, nbytes: int) -> None:
        self.write(target, self.read(source, nbytes))

    def synchronize(self) -> None:
        self.synchronized += 1

    def array(self, address: int, dtype: type, count: int) -> np.ndarray:
        return self.read(address, np.dtype(dtype).itemsize * count).view(dtype)


@dataclass
class WarpRun:
    """One warp of a launch as the test knows it: where it ran and each event it writes."""

    cta: tuple[int, int, int]
    index: int  # warp in its CTA
    sm: int
    slot: int
    events: list[tuple[int, int, int]] = field(default_factory=list)  # (site, time ns, mask)
    blocks: list[int] = field(default_factory=list)  # each event's block (for the truth)

    def grid_index(self, grid: Dim3, block: Dim3) -> int:
        x, y, z = self.cta
        return ((z * grid[1] + y) * grid[0] + x) * warps_per_cta(block) + self.index


def event_row(warp: WarpRun, site: int, time: int, mask: int) -> np.ndarray:
    row = np.zeros(1, EVENT_DTYPE)
    row["time"] = time
    row["clock"] = time % 10**12 * 3 // 2 + 7_000_000 * (warp.sm + 1)  # each SM its own origin
    row["mask"] = mask
    row["cta_x"] = warp.cta[0]
    row["cta_yz"] = warp.cta[1] | warp.cta[2] << 16
    row["where"] = site | warp.sm << 16 | warp.slot << 26
    return row


def run_probes(memory: FakeMemory, control: int, grid: Dim3, block: Dim3,
               warps: Sequence[WarpRun]) -> None:  # fmt: skip
    """What the probes of a launch do, in time order (tracing.py's contract)."""
    words = memory.array(control, np.uint64, len(CONTROL)).copy()
    exact = words[CONTROL.CHUNK_EVENTS] == 0 and words[CONTROL.CHUNKS] == 0
    order = sorted(
        (t, w, e) for w, warp in enumerate(warps) for e, (_, t, _) in enumerate(warp.events)
    )
    cursor: dict[int, list[int]] = {}  # exact: warp → [next, end]; chunks: warp → [chunk, fill]
    chunk = int(words[CONTROL.CHUNK_EVENTS])
    for _, w, e in order:
        warp = warps[w]
        site, time, mask = warp.events[e]
        row = event_row(warp, site, time, mask)
        g = warp.grid_index(grid, block)
        if exact:
            if g not in cursor:
                table = int(words[CONTROL.TABLE])
                cursor[g] = list(memory.array(table + 8 * g, np.uint32, 2)) if table else [0, 0]
            slot = cursor[g][0]
            cursor[g][0] += 1
            if slot < cursor[g][1]:
                memory.write(int(words[CONTROL.EVENTS]) + 32 * int(slot), row)
            elif words[CONTROL.TALLIES]:
                at = int(words[CONTROL.TALLIES]) + 4 * g
                memory.write(at, memory.array(at, np.uint32, 1) + 1)
            else:
                words[CONTROL.LOST] += 1
            continue
        state = cursor.setdefault(w, [0, chunk] if chunk else [NO_CHUNK, 0])
        current, fill = state
        state[1] += 1
        if current == NO_CHUNK:
            words[CONTROL.LOST] += 1
        elif fill < chunk:
            memory.write(int(words[CONTROL.EVENTS]) + 32 * (current * chunk + fill), row)
        else:
            taken = int(words[CONTROL.NEXT_CHUNK])
            words[CONTROL.NEXT_CHUNK] += 1
            if taken < int(words[CONTROL.CHUNKS]):
                memory.write(int(words[CONTROL.EVENTS]) + 32 * taken * chunk, row)
                state[:] = [taken, 1]
            else:
                state[:] = [NO_CHUNK, 0]
                words[CONTROL.LOST] += 1
    memory.write(control, words)


@dataclass(frozen=True)
class Program:
    """A kernel as the schedule sees it: each warp's path of blocks (a function of its CTA and
    warp index), the site at each block's head, the exit site, and each block's duration."""

    sites: dict[int, int]  # block → site id of its head
    exit_site: int
    durations: dict[int, int]  # block → ns a warp spends in it


def schedule(program: Program, grid: Dim3, block: Dim3, paths: dict[tuple[int, int], list[int]],
             sms: int = 2, slots: int = 8, start: int = 1_700_000_000_000_000_000,
             divergent: dict[tuple[int, int], int] | None = None) -> list[WarpRun]:  # fmt: skip
    """Every warp of the launch: CTAs in order to the SM slot group free first (a CTA takes
    warps-per-CTA slots); a warp's events are its path's block heads, each block lasting its
    duration, then its exit. ``paths[(cta x, warp)]`` is the warp's path of blocks;
    ``divergent[(cta x, warp)] = k``: the warp's lanes above k exit at the path's second block
    (a partial exit), the others go on."""
    wpc = warps_per_cta(block)
    groups = [(sm, g) for g in range(slots // wpc) for sm in range(sms)]
    free = {group: start for group in groups}
    lanes = block[0] * block[1] * block[2]
    out: list[WarpRun] = []
    for x in range(grid[0]):
        group = min(groups, key=lambda gr: (free[gr], gr))
        cta_start = free[group]
        end = cta_start
        for w in range(wpc):
            width = min(32, lanes - 32 * w)
            full = (1 << width) - 1
            warp = WarpRun((x, 0, 0), w, group[0], group[1] * wpc + w)
            t = cta_start + 100 * w
            split = (divergent or {}).get((x, w))
            for n, b in enumerate(paths[(x, w)]):
                mask = full if split is None or n < 1 else (1 << split) - 1
                warp.events.append((program.sites[b], t, mask))
                warp.blocks.append(b)
                if split is not None and n == 1:  # the others leave here
                    warp.events.append((program.exit_site, t, full & ~((1 << split) - 1)))
                    warp.blocks.append(-1)
                t += program.durations[b]
            alive = full if split is None else (1 << split) - 1
            warp.events.append((program.exit_site, t, alive))
            warp.blocks.append(-1)
            out.append(warp)
            end = max(end, t)
        free[group] = end + 50
    return out


#: A kernel shaped as Triton's ``bfs`` (tests/data/ptx/triton_kernels.py), its sites those of the
#: bfs plan in ``blocks`` mode: site b at block b's head (0 is the entry), 7 on the exit edge.
PROGRAM = Program(
    {b: b for b in range(7)},
    exit_site=7,
    durations={0: 50, 1: 80, 2: 60, 3: 300, 4: 120, 5: 40, 6: 30},
)
GRID, BLOCK = dim3(6), dim3(64)  # 6 CTAs of 2 warps


def model_paths(x: np.ndarray) -> dict[tuple[int, int], list[int]]:
    """CTA c's warps loop x[c] % 4 times (block 2 is the loop's header, 3 to 5 its body)."""
    return {
        (c, w): [0, 1, 2] + [3, 4, 5, 2] * (int(x[c]) % 4) + [6]
        for c in range(GRID[0])
        for w in range(2)
    }


class Kernel:
    """y += x, then x += 1 (it writes its own input), its warps' paths set by x."""

    def __init__(self, memory: FakeMemory, control: int) -> None:
        self.memory, self.control = memory, control
        self.x = memory.alloc(4 * GRID[0])
        self.y = memory.alloc(4 * GRID[0])
        memory.write(self.x, np.array([5, 0, 3, 2, 7, 1], np.int32))
        memory.zero(self.y, 4 * GRID[0])
        self.runs: list[list[WarpRun]] = []
        self.program = PROGRAM

    def __call__(self) -> None:
        x = self.memory.array(self.x, np.int32, GRID[0]).copy()
        warps = schedule(self.program, GRID, BLOCK, model_paths(x))
        run_probes(self.memory, self.control, GRID, BLOCK, warps)
        self.runs.append(warps)
        self.memory.write(self.y, self.memory.array(self.y, np.int32, GRID[0]) + x)
        self.memory.write(self.x, x + 1)


def model_setup(
    strategy: Strategy = Strategy.EXACT, memory: FakeMemory | None = None
) -> tuple[FakeMemory, TracedLauncher, Kernel]:
    """A memory (``memory`` or a new one), a launcher of the bfs plan in ``strategy`` and the
    model kernel."""
    memory = FakeMemory() if memory is None else memory
    control = memory.alloc(64)
    memory.zero(control, 64)
    plan = instrument_traces(triton_ptx("bfs").read_text(), strategy).plans["bfs"]
    return memory, TracedLauncher(memory, control, plan, cap_bytes=1 << 20), Kernel(memory, control)


def model_recording(
    path: Path, strategy: Strategy, launches: int = 2, cap_bytes: int = 1 << 20
) -> list[list[WarpRun]]:
    """A recording of ``launches`` traced launches of the model kernel, saved at ``path``; each
    launch's warps as the model ran them (the truth: the traced pass's, in the exact strategy)."""
    _, launcher, kernel = model_setup(strategy)
    launcher.cap_bytes = cap_bytes
    writable = [(kernel.x, 4 * GRID[0]), (kernel.y, 4 * GRID[0])]
    traces = [launcher.launch(kernel, GRID, BLOCK, writable) for _ in range(launches)]
    rec = recording.TraceRecording("bfs", triton_ptx("bfs").read_text(), strategy, Sites.BLOCKS,
                                   (), traces, {"name": "model", "sm_count": 2})  # fmt: skip
    recording.save(rec, path)
    return kernel.runs[1::2] if strategy is Strategy.EXACT else kernel.runs

"""A ``.global`` counter array holds one replica of a kernel's counters per SM (issue #34).

On the H100 the CuPy kernel set (a thread an element: 8.4 million warps for the stencil) ran
23x its plain time with atomic probes and 2.55x (stencil 24x, softmax_rows 33x) with a loop's
counters in registers: every warp of the grid added to the same few 16-byte counters, one L2
line, and the atomics queued there (the stencil has no loop, so registers change nothing; the
softmax's registers are flushed at exit, still about 26 atomics a warp on one line). Here the
probes' addresses are worked out from the instrumented PTX itself, for every SM id: warps of
different SMs must add to different 128-byte lines, all inside the array, and what they add
there must be what the reader returns.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from ptx_helpers import NVCC_PTX, cupy_ptx
from pyhpctk.instrument.frameworks.base import LoadedModule
from pyhpctk.instrument.ptx import (
    REPLICAS,
    Buffer,
    Instrumented,
    Mode,
    assemble,
    find_ptxas,
    instrument,
    parse,
)
from pyhpctk.instrument.ptx.parse import Kind, Statement

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
LINE = 128
MASK = (1 << 64) - 1


def _value(operand: str, env: dict[str, int], smid: int, symbol: str) -> int | None:
    if operand == "%smid":
        return smid
    if operand == symbol:
        return 0  # addresses relative to the array
    if re.fullmatch(r"-?\d+", operand):
        return int(operand)
    return env.get(operand)


def _run(scope: list[Statement], smid: int, symbol: str) -> dict[str, int]:
    """The integer registers a probe's scope computes before its atomics, on SM ``smid`` (the
    movs, ands, multiplies and adds that find an address; other instructions are skipped)."""
    env: dict[str, int] = {}
    for s in scope:
        if s.kind is not Kind.INSTRUCTION or s.base_opcode not in ("mov", "and", "mul", "add"):
            continue
        args = [_value(o, env, smid, symbol) for o in s.operands[1:]]
        if any(a is None for a in args):
            continue
        values = [a for a in args if a is not None]
        if s.base_opcode == "mov":
            env[s.operands[0]] = values[0]
        elif s.base_opcode == "and":
            env[s.operands[0]] = values[0] & values[1]
        elif s.base_opcode == "mul":
            env[s.operands[0]] = (values[0] * values[1]) & MASK
        else:
            env[s.operands[0]] = (values[0] + values[1]) & MASK
    return env


Atomic = tuple[list[Statement], str, int, str]  # its scope before it, register, offset, added


def atomics(result: Instrumented, kernel: str) -> list[Atomic]:
    """Every ``red.global`` of ``kernel``: the statements of its probe's scope before it, its
    address register and offset, and what it adds."""
    body = parse(result.ptx).function(kernel).body
    out, start = [], 0
    for i, s in enumerate(body):
        start = i if s.kind is Kind.OPEN else start
        if s.kind is not Kind.INSTRUCTION or not s.opcode.startswith("red.global"):
            continue
        m = re.fullmatch(r"\[(%[\w$]+)\+(\d+)\]", s.operands[0])
        assert m, f"{kernel}: an atomic without a register+offset address: {s.text}"
        out.append((list(body[start:i]), m.group(1), int(m.group(2)), s.operands[1]))
    return out


def addresses(result: Instrumented, kernel: str, found: list[Atomic], smid: int) -> list[int]:
    """The byte offset in ``kernel``'s array at which each atomic of ``found`` adds, as a warp
    on SM ``smid`` executes it."""
    out = []
    for scope, register, offset, _ in found:
        env = _run(scope, smid, result.counter_globals[kernel])
        assert register in env, f"{kernel}: an atomic adds at an address not of the array"
        out.append(env[register] + offset)
    return out


@pytest.fixture(scope="module")
def cupy_set() -> str:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import kernel_set_cupy
    finally:
        sys.path.remove(str(BENCHMARKS))
    return cupy_ptx(kernel_set_cupy.SOURCE)


VARIANTS = {"counts": (Mode.EDGES, False), "counts-registers": (Mode.EDGES, True),
            "counts-warps": (Mode.BLOCKS, False)}  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_cupy_sets_warps_on_different_sms_add_to_different_lines(cupy_set, variant) -> None:  # type: ignore[no-untyped-def]
    mode, registers = VARIANTS[variant]
    result = instrument(cupy_set, mode, buffer=Buffer.GLOBAL, registers=registers)
    assert len(result.plans) == 8
    for kernel in result.plans:
        size, found = result.counter_bytes(kernel), atomics(result, kernel)
        assert found, f"{kernel}: no atomic"
        owner: dict[int, int] = {}  # 128-byte line -> the replica (SM id modulo) adding to it
        for smid in range(REPLICAS):
            for at in addresses(result, kernel, found, smid):
                assert 0 <= at < size, f"{kernel}: SM {smid} adds at {at}, outside its {size} bytes"
                assert owner.setdefault(at // LINE, smid) == smid, (
                    f"{kernel}: SMs {owner[at // LINE]} and {smid} add to line {at // LINE}"
                )
        wrapped = addresses(result, kernel, found, REPLICAS + 5)
        assert wrapped == addresses(result, kernel, found, 5)


def test_the_reader_sums_what_every_sms_warps_added() -> None:
    """Counts added where the PTX's atomics add on SM 0 and on the last replica's SM come back
    from the loaded module as their sum; a reset zeroes every replica."""
    result = instrument(NVCC_PTX.read_text(), Mode.BLOCKS, buffer=Buffer.GLOBAL)
    kernel = next(k for k in result.plans if result.plans[k].counters >= 2)
    memory = {result.counter_globals[k]: np.zeros(result.counter_bytes(k), np.uint8)
              for k in result.plans}  # fmt: skip

    def read(symbol: str, nbytes: int) -> np.ndarray:
        assert nbytes == memory[symbol].size
        return memory[symbol].copy()

    def zero(symbol: str, nbytes: int) -> None:
        memory[symbol][:nbytes] = 0

    words = memory[result.counter_globals[kernel]].view(np.uint64)
    found = atomics(result, kernel)
    for smid, warps, threads in ((0, 3, 70), (REPLICAS - 1, 5, 130)):
        for (*_, added), at in zip(found, addresses(result, kernel, found, smid), strict=True):
            words[at // 8] += np.uint64(warps if added == "1" else threads)
    loaded = LoadedModule("test", result, read, zero)
    counters = loaded.counters(kernel)
    assert counters.shape == (result.plans[kernel].counters, 2)
    assert counters.tolist() == [[8, 200]] * result.plans[kernel].counters
    loaded.reset()
    assert not memory[result.counter_globals[kernel]].any()


def test_edges_mode_adds_threads_only_and_keeps_the_softmax_at_full_occupancy(cupy_set) -> None:  # type: ignore[no-untyped-def]
    """Edges mode derives every count from the thread slots, so its probes add no warp count:
    one atomic a probe (the stencil's warps: 2, not 4) and, in registers, one 64-bit register a
    loop counter, so the CuPy softmax (7 loop counters) fits 8 CTAs of 256 threads an SM on
    sm_90 (32 registers a thread; 48 with the warp registers)."""
    for registers in (False, True):
        result = instrument(cupy_set, Mode.EDGES, buffer=Buffer.GLOBAL, registers=registers)
        for kernel in result.plans:
            found = atomics(result, kernel)
            slots = {at % 16 for at in addresses(result, kernel, found, 0)}
            assert slots == {8}, f"{kernel}: atomics at slots {sorted(slots)} of a counter"
    if find_ptxas() is None:
        pytest.skip("no ptxas (the nvidia-cuda-nvcc wheel of the dev extra)")
    result = instrument(cupy_set, Mode.EDGES, buffer=Buffer.GLOBAL, registers=True)
    used = assemble(result.ptx, "sm_90").registers["softmax_rows"]
    assert used <= 32, f"softmax_rows: {used} registers a thread, {65536 // (used * 256)} CTAs"


def _triangles(n: int) -> str:
    """A kernel of ``n`` guarded skips in a row: ``n`` counters in edges mode."""
    body = []
    for i in range(n):
        body += [f"\tsetp.eq.u32 %p1, %r1, {i};", f"\t@%p1 bra $L_{i};",
                 "\tadd.u32 %r1, %r1, 3;", f"$L_{i}:"]  # fmt: skip
    return "\n".join([
        ".version 7.0", ".target sm_80", ".address_size 64",
        ".visible .entry many(.param .u32 many_n)", "{", "\t.reg .pred %p<2>;",
        "\t.reg .b32 %r<2>;", "\tld.param.u32 %r1, [many_n];", *body, "\tret;", "}", "",
    ])  # fmt: skip


def test_a_kernel_of_many_counters_keeps_its_array_within_64_kib() -> None:
    """pyrun reads and zeroes a kernel's whole array after each launch: 301 counters (4.9 KB a
    copy) get 8 replicas, not 128 (623 KB), and still lines of their own for the SMs 0 to 7."""
    result = instrument(_triangles(300), Mode.EDGES, buffer=Buffer.GLOBAL, registers=True)
    assert result.plans["many"].counters == 301  # a skip each and the way in
    size = result.counter_bytes("many")
    assert 4816 * 8 <= size <= 64 * 1024, size
    assert f".u64 {result.counter_globals['many']}[{size // 8}];" in result.ptx
    found = atomics(result, "many")
    owner: dict[int, int] = {}
    for smid in range(16):
        for at in addresses(result, "many", found, smid):
            assert 0 <= at < size
            assert owner.setdefault(at // LINE, smid % 8) == smid % 8, (smid, at)
    small = instrument(_triangles(6), Mode.EDGES, buffer=Buffer.GLOBAL)
    assert small.counter_bytes("many") == 16 * 8 * REPLICAS  # one line a copy, 128 copies

"""Triton kernels after Rodinia and HeCBench, for the PTX pass's tests (issue #34).

``compile_ptx(name, capability)`` compiles one for an explicit target (no GPU needed);
make_fixtures.py records their sm_90 PTX, and the tests compile them afresh where Triton is
installed. ``SIGNATURES`` gives each kernel's argument types and constants.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def stencil(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inner = (offs > 0) & (offs < n - 1)
    left = tl.load(x_ptr + offs - 1, mask=inner, other=0.0)
    mid = tl.load(x_ptr + offs, mask=inner, other=0.0)
    right = tl.load(x_ptr + offs + 1, mask=inner, other=0.0)
    tl.store(y_ptr + offs, 0.25 * left + 0.5 * mid + 0.25 * right, mask=inner)


@triton.jit
def reduce(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    if pid % 2 == 0:  # noqa: SIM108 (a branch taken by even programs only, not a select)
        total = tl.sum(x, 0)
    else:
        total = tl.max(x, 0)
    tl.store(y_ptr + pid, total)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ks = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, n, BLOCK):
        a = tl.load(a_ptr + rows[:, None] * n + (k0 + ks)[None, :])
        b = tl.load(b_ptr + (k0 + ks)[:, None] * n + cols[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * n + cols[None, :], acc)


@triton.jit
def bfs(row_ptr, col_ptr, level_ptr, next_ptr, current):
    v = tl.program_id(0)
    if tl.load(level_ptr + v) == current:
        e = tl.load(row_ptr + v)
        end = tl.load(row_ptr + v + 1)
        while e < end:  # as long as this vertex has neighbours
            w = tl.load(col_ptr + e)
            if tl.load(level_ptr + w) < 0:
                tl.store(next_ptr + w, 1)
            e += 1


@triton.jit
def wavefront(score_ptr, sim_ptr, n, penalty, BLOCK: tl.constexpr):
    t = tl.arange(0, BLOCK)
    for diag in range(1, 2 * n):  # one anti-diagonal after the other
        i = t + 1
        j = diag - t
        ok = (i <= n) & (j >= 1) & (j <= n)
        w = n + 1
        best = tl.load(score_ptr + (i - 1) * w + (j - 1), mask=ok, other=0)
        best += tl.load(sim_ptr + (i - 1) * n + (j - 1), mask=ok, other=0)
        up = tl.load(score_ptr + (i - 1) * w + j, mask=ok, other=0) - penalty
        left = tl.load(score_ptr + i * w + (j - 1), mask=ok, other=0) - penalty
        best = tl.maximum(best, tl.maximum(up, left))
        tl.store(score_ptr + i * w + j, best, mask=ok)
        tl.debug_barrier()


@triton.jit
def histogram(x_ptr, bins_ptr, n, nbins, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.atomic_add(bins_ptr + x % nbins, 1, mask=offs < n)


@triton.jit
def softmax(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * cols + offs, e / tl.sum(e, 0), mask=offs < cols)


KERNELS: dict[str, Any] = {
    "stencil": (stencil, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}, {"BLOCK": 128}),
    "reduce": (reduce, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32"}, {"BLOCK": 256}),
    "matmul": (
        matmul,
        {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "n": "i32"},
        {"BLOCK": 32},
    ),
    "bfs": (
        bfs,
        {
            "row_ptr": "*i32",
            "col_ptr": "*i32",
            "level_ptr": "*i32",
            "next_ptr": "*i32",
            "current": "i32",
        },
        {},
    ),
    "wavefront": (
        wavefront,
        {"score_ptr": "*i32", "sim_ptr": "*i32", "n": "i32", "penalty": "i32"},
        {"BLOCK": 64},
    ),
    "histogram": (
        histogram,
        {"x_ptr": "*i32", "bins_ptr": "*i32", "n": "i32", "nbins": "i32"},
        {"BLOCK": 256},
    ),
    "softmax": (softmax, {"x_ptr": "*fp32", "y_ptr": "*fp32", "cols": "i32"}, {"BLOCK": 128}),
}


def compile_ptx(name: str, capability: int = 90) -> str:
    """The PTX Triton makes of kernel ``name`` for ``sm_<capability>``, with no GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constants = KERNELS[name]
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    return str(triton.compile(source, target=GPUTarget("cuda", capability, 32)).asm["ptx"])


def compile_kernel(name: str, capability: int) -> tuple[str, str, int, int]:
    """(PTX, kernel name, warps, dynamic shared bytes) of kernel ``name`` for the device."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constants = KERNELS[name]
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
    meta = compiled.metadata
    return str(compiled.asm["ptx"]), str(meta.name), int(meta.num_warps), int(meta.shared)


@triton.jit(noinline=True)
def _scaled(x):
    return x * 3 + 1


@triton.jit
def checked(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.device_assert(x >= 0, "negative")  # a call to __assertfail, then trap
    y = x * 3 + _scaled(tl.program_id(0))  # a call to a .func kept apart
    if tl.program_id(0) == 0:
        tl.device_print("y", y)  # a call to vprintf
    tl.store(y_ptr + offs, y, mask=offs < n)


# Compiled with debug=True (make_fixtures.py), so the assertion stays.
CHECKED = (checked, {"x_ptr": "*i32", "y_ptr": "*i32", "n": "i32"}, {"BLOCK": 128})

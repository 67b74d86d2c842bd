"""The instrumentation benchmark's kernel set in Triton (``benchmarks/kernel_instrumentation.py``).

The same eight kernels as :mod:`kernel_set_cupy`, written the way Triton is written: each
program loops over tiles (a stencil's columns, a reduction's chunk, a matrix product's K, a
histogram's chunk, a softmax's rows, k-means' centroids), a BFS program over the largest degree
of its vertices (a data-dependent trip count), a Needleman-Wunsch program over its anti-diagonals
(with a barrier between them). Triton writes a branch on data as a select, so the reduction's
divergence is per lane, not per path. Trip counts are runtime arguments (no unrolling), so each
kernel's loop body runs, per thread, the trips its inputs imply: ``truths`` says how many.

``SIGNATURES`` lets the CI test compile every kernel for ``GPUTarget("cuda", 90, 32)`` without
a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton
import triton.language as tl
from kernel_set_cupy import Launch, graph, nw_inputs

WARPS = 4
THREADS = 32 * WARPS


@triton.jit
def stencil(a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    r = tl.program_id(0) + 1
    for c0 in range(0, n, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        inner = (c > 0) & (c < n - 1)
        i = r * n + c
        s = tl.load(a_ptr + i, mask=inner, other=0.0)
        s += tl.load(a_ptr + i - 1, mask=inner, other=0.0)
        s += tl.load(a_ptr + i + 1, mask=inner, other=0.0)
        s += tl.load(a_ptr + i - n, mask=inner, other=0.0)
        s += tl.load(a_ptr + i + n, mask=inner, other=0.0)
        tl.store(b_ptr + i, 0.2 * s, mask=inner)


@triton.jit
def reduce_branchy(x_ptr, partial_ptr, per_program, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, per_program, BLOCK):
        v = tl.load(x_ptr + start + off + tl.arange(0, BLOCK))
        acc += tl.where(v > 0.5, tl.sqrt(v) * v, -0.5 * v)
    tl.store(partial_ptr + tl.program_id(0), tl.sum(acc, 0))


@triton.jit
def matmul_tiled(a_ptr, b_ptr, c_ptr, n, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, n, BK):
        a = tl.load(a_ptr + rows[:, None] * n + (k0 + ks)[None, :])
        b = tl.load(b_ptr + (k0 + ks)[:, None] * n + cols[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rows[:, None] * n + cols[None, :], acc)


@triton.jit
def bfs_step(
    offsets_ptr, edges_ptr, frontier_ptr, visited_ptr, next_ptr, vertices, BLOCK: tl.constexpr
):
    v = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = (v < vertices) & (tl.load(frontier_ptr + v, mask=v < vertices, other=0) != 0)
    first = tl.load(offsets_ptr + v, mask=live, other=0)
    degree = tl.load(offsets_ptr + v + 1, mask=live, other=0) - first
    for k in range(0, tl.max(degree, 0)):  # the program's largest degree: data-dependent
        has = k < degree
        w = tl.load(edges_ptr + first + k, mask=has, other=0)
        seen = tl.load(visited_ptr + w, mask=has, other=1)
        tl.store(next_ptr + w, 1, mask=has & (seen == 0))


@triton.jit
def nw_wavefront(a_ptr, b_ptr, score_ptr, length, BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64)
    side = length + 1
    h = score_ptr + p * side * side
    i = tl.arange(0, BLOCK) + 1
    mine = tl.load(a_ptr + p * length + i - 1, mask=i <= length, other=0)
    for d in range(2, 2 * length + 1):
        j = d - i
        ok = (i <= length) & (j >= 1) & (j <= length)
        theirs = tl.load(b_ptr + p * length + j - 1, mask=ok, other=-1)
        diag = tl.load(h + (i - 1) * side + j - 1, mask=ok, other=0)
        up = tl.load(h + (i - 1) * side + j, mask=ok, other=0) - 1
        left = tl.load(h + i * side + j - 1, mask=ok, other=0) - 1
        match = diag + tl.where(mine == theirs, 1, -1)
        tl.store(h + i * side + j, tl.maximum(match, tl.maximum(up, left)), mask=ok)
        tl.debug_barrier()


@triton.jit
def histogram(x_ptr, bins_ptr, per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * per_program
    row = bins_ptr + (pid % 64) * 256
    for off in range(0, per_program, BLOCK):
        v = tl.load(x_ptr + start + off + tl.arange(0, BLOCK)).to(tl.int32)
        tl.atomic_add(row + v, 1)


@triton.jit
def softmax_rows(x_ptr, y_ptr, rows_per_program, COLS: tl.constexpr):
    first = tl.program_id(0) * rows_per_program
    c = tl.arange(0, COLS)
    for r in range(first, first + rows_per_program):
        x = tl.load(x_ptr + r.to(tl.int64) * COLS + c)
        e = tl.exp(x - tl.max(x, 0))
        tl.store(y_ptr + r.to(tl.int64) * COLS + c, e / tl.sum(e, 0))


@triton.jit
def kmeans_assign(points_ptr, centroids_ptr, labels_ptr, k, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, 8)
    p = tl.load(points_ptr + i[:, None] * 8 + dims[None, :])
    best = tl.full((BLOCK,), 3.0e38, tl.float32)
    label = tl.zeros((BLOCK,), dtype=tl.int32)
    for c in range(0, k):
        t = p - tl.load(centroids_ptr + c * 8 + dims)[None, :]
        dist = tl.sum(t * t, 1)
        closer = dist < best
        best = tl.where(closer, dist, best)
        label = tl.where(closer, c, label)
    tl.store(labels_ptr + i, label)


P32, I32 = "*fp32", "i32"
#: Each kernel, its argument types and constants, for triton.compile without a GPU.
SIGNATURES: dict[str, tuple[Any, dict[str, str], dict[str, int]]] = {
    "stencil": (stencil, {"a_ptr": P32, "b_ptr": P32, "n": I32}, {"BLOCK": 512}),
    "reduce_branchy": (
        reduce_branchy,
        {"x_ptr": P32, "partial_ptr": P32, "per_program": I32},
        {"BLOCK": 1024},
    ),
    "matmul_tiled": (
        matmul_tiled,
        {"a_ptr": P32, "b_ptr": P32, "c_ptr": P32, "n": I32},
        {"BM": 128, "BN": 128, "BK": 32},
    ),
    "bfs_step": (
        bfs_step,
        {
            "offsets_ptr": "*i32",
            "edges_ptr": "*i32",
            "frontier_ptr": "*i32",
            "visited_ptr": "*i32",
            "next_ptr": "*i32",
            "vertices": I32,
        },
        {"BLOCK": THREADS},
    ),
    "nw_wavefront": (
        nw_wavefront,
        {"a_ptr": "*i32", "b_ptr": "*i32", "score_ptr": "*i32", "length": I32},
        {"BLOCK": THREADS},
    ),
    "histogram": (
        histogram,
        {"x_ptr": "*u8", "bins_ptr": "*i32", "per_program": I32},
        {"BLOCK": 1024},
    ),
    "softmax_rows": (
        softmax_rows,
        {"x_ptr": P32, "y_ptr": P32, "rows_per_program": I32},
        {"COLS": 1024},
    ),
    "kmeans_assign": (
        kmeans_assign,
        {"points_ptr": P32, "centroids_ptr": P32, "labels_ptr": "*i32", "k": I32},
        {"BLOCK": THREADS},
    ),
}
NAMES = tuple(SIGNATURES)


def _launch(
    name: str,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    outputs: tuple[Any, ...],
    reset: Any,
    loop_runs: int,
) -> Launch:
    """A launch whose truth is its loop body's runs: threads × trips, summed over programs."""
    return Launch(
        name,
        grid,
        (THREADS,),
        args,
        outputs,
        reset,
        {"loop body runs (threads x trips)": ("loop", loop_runs)},
    )


def launches(torch: Any, scale: float = 1.0) -> list[Launch]:
    """Every kernel's launch (torch tensors on the GPU), sized as :mod:`kernel_set_cupy`'s."""
    rng = np.random.default_rng(34)
    dev = "cuda"
    out: list[Launch] = []

    def t(array: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array)).to(dev)

    n = int(16384 * scale**0.5) // 512 * 512
    a = t(rng.standard_normal((n, n), dtype=np.float32))
    b = torch.zeros_like(a)
    out.append(
        _launch("stencil", (n - 2,), (a, b, n), (b,), b.zero_, THREADS * (n - 2) * (n // 512))
    )

    per, programs = 1 << 16, int(4096 * scale)
    x = t(rng.random(per * programs, dtype=np.float32))
    partial = torch.zeros(programs, dtype=torch.float32, device=dev)
    out.append(
        _launch(
            "reduce_branchy",
            (programs,),
            (x, partial, per),
            (partial,),
            partial.zero_,
            THREADS * programs * (per // 1024),
        )
    )

    m = int(4096 * scale ** (1 / 3)) // 128 * 128
    ma = t(rng.standard_normal((m, m), dtype=np.float32))
    mb = t(rng.standard_normal((m, m), dtype=np.float32))
    mc = torch.zeros((m, m), dtype=torch.float32, device=dev)
    out.append(
        _launch(
            "matmul_tiled",
            (m // 128, m // 128),
            (ma, mb, mc, m),
            (mc,),
            mc.zero_,
            THREADS * (m // 128) ** 2 * (m // 32),
        )
    )

    vertices = int((1 << 22) * scale) // THREADS * THREADS
    offsets, edges = graph(rng, vertices, 16)
    frontier = (rng.random(vertices) < 0.5).astype(np.int32)
    visited = (rng.random(vertices) < 0.3).astype(np.int32)
    degree = (np.diff(offsets) * frontier).reshape(-1, THREADS)
    nxt = torch.zeros(vertices, dtype=torch.int32, device=dev)
    out.append(
        _launch(
            "bfs_step",
            (vertices // THREADS,),
            (t(offsets), t(edges), t(frontier), t(visited), nxt, vertices),
            (nxt,),
            nxt.zero_,
            THREADS * int(degree.max(axis=1).sum()),
        )
    )

    problems, length = int(8192 * scale), THREADS
    sa, sb, score = nw_inputs(rng, problems, length)
    d_score, h_score = t(score), t(score)
    out.append(
        _launch(
            "nw_wavefront",
            (problems,),
            (t(sa), t(sb), d_score, length),
            (d_score,),
            lambda s=d_score, h=h_score: s.copy_(h),
            THREADS * problems * (2 * length - 1),
        )
    )

    per, programs = 1 << 17, int(1024 * scale)
    values = np.minimum(rng.geometric(0.02, per * programs), 255).astype(np.uint8)
    bins = torch.zeros(64 * 256, dtype=torch.int32, device=dev)
    out.append(
        _launch(
            "histogram",
            (programs,),
            (t(values), bins, per),
            (bins,),
            bins.zero_,
            THREADS * programs * (per // 1024),
        )
    )

    rows, per = int(262144 * scale) // 64 * 64, 64
    sx = t(rng.standard_normal((rows, 1024), dtype=np.float32))
    sy = torch.zeros_like(sx)
    out.append(
        _launch("softmax_rows", (rows // per,), (sx, sy, per), (sy,), sy.zero_, THREADS * rows)
    )

    points, k = int((1 << 24) * scale) // THREADS * THREADS, 64
    px = t(rng.standard_normal((points, 8), dtype=np.float32))
    cx = t(rng.standard_normal((k, 8), dtype=np.float32))
    labels = torch.zeros(points, dtype=torch.int32, device=dev)
    out.append(
        _launch(
            "kmeans_assign",
            (points // THREADS,),
            (px, cx, labels, k),
            (labels,),
            labels.zero_,
            THREADS * (points // THREADS) * k,
        )
    )
    return out


def run(launch: Launch) -> None:
    """Launch ``launch`` as a program would (Triton's own launcher)."""
    fn, _, constants = SIGNATURES[launch.kernel]
    fn[launch.grid](*launch.args, **constants, num_warps=WARPS)

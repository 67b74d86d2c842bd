"""The instrumentation benchmark's kernel set in Numba-CUDA (``kernel_instrumentation.py``).

The same eight kernels as :mod:`kernel_set_cupy`, line for line in Numba's Python: the same
inputs (its ``launches``, each array argument passed flat, as the CUDA C kernels index them) and
the same arithmetic, so the same truths: thread executions of the instruction kinds
(``st.global``, ``bar.sync``, ``atom.shared``...) NVVM writes for Numba as NVRTC does for CUDA
C (the CI test checks each kind is in each kernel's PTX). Numba's names for the kernels are
mangled (``_ZN16kernel_set_numba7stencilB2v1B...``): :func:`entry` finds a kernel's.

Each kernel is a plain Python function; :func:`kernels` compiles them anew (``cuda.jit``), so
that the framework hook sees their PTX at link time; ``SIGNATURES`` lets the CI test compile
every one for sm_90 with ``numba.cuda.compile_ptx``, without a GPU.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
from kernel_set_cupy import NAMES, Launch
from kernel_set_cupy import launches as cupy_launches

if not hasattr(np, "row_stack"):  # numba-cuda 0.30 overloads it at import; numpy 2.5 removed it
    np.row_stack = np.vstack  # (the device image's numba-cuda failed to import there)

from numba import cuda, float32, int32, uint8, uint32

TILE = 16
FIFTH = float32(0.2)
HALF = float32(0.5)
HUGE = float32(3.0e38)


def stencil(a, b, n):  # type: ignore[no-untyped-def]
    x = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    y = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if x > 0 and y > 0 and x < n - 1 and y < n - 1:
        i = y * n + x
        b[i] = FIFTH * (a[i] + a[i - 1] + a[i + 1] + a[i - n] + a[i + n])


def reduce_branchy(x, partial, n):  # type: ignore[no-untyped-def]
    s = cuda.shared.array(256, float32)
    tid = cuda.threadIdx.x
    acc = float32(0.0)
    i = cuda.blockIdx.x * cuda.blockDim.x + tid
    while i < n:
        v = x[i]
        if v > HALF:
            acc += math.sqrt(v) * v
        else:
            acc -= v * HALF
        i += cuda.gridDim.x * cuda.blockDim.x
    s[tid] = acc
    cuda.syncthreads()
    k = cuda.blockDim.x // 2
    while k > 0:
        if tid < k:
            s[tid] += s[tid + k]
        cuda.syncthreads()
        k >>= 1
    if tid == 0:
        partial[cuda.blockIdx.x] = s[0]


def matmul_tiled(a, b, c, n):  # type: ignore[no-untyped-def]
    ta = cuda.shared.array((TILE, TILE), float32)
    tb = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx
    acc = float32(0.0)
    for t in range(n // TILE):
        ta[ty, tx] = a[row * n + t * TILE + tx]
        tb[ty, tx] = b[(t * TILE + ty) * n + col]
        cuda.syncthreads()
        for k in range(TILE):
            acc = cuda.fma(ta[ty, k], tb[k, tx], acc)
        cuda.syncthreads()
    c[row * n + col] = acc


def bfs_step(offsets, edges, frontier, visited, next_, vertices):  # type: ignore[no-untyped-def]
    v = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if v >= vertices or not frontier[v]:
        return
    for e in range(offsets[v], offsets[v + 1]):
        w = edges[e]
        if not visited[w]:
            next_[w] = 1


def nw_wavefront(seq_a, seq_b, score, length):  # type: ignore[no-untyped-def]
    p, i = cuda.blockIdx.x, cuda.threadIdx.x + 1
    side = length + 1
    h = p * side * side  # the problem's score matrix in the flat array
    a, b = p * length, p * length
    for d in range(2, 2 * length + 1):
        j = d - i
        if j >= 1 and j <= length:
            same = seq_a[a + i - 1] == seq_b[b + j - 1]
            match = score[h + (i - 1) * side + j - 1] + (1 if same else -1)
            up = score[h + (i - 1) * side + j] - 1
            left = score[h + i * side + j - 1] - 1
            score[h + i * side + j] = max(match, max(up, left))
        cuda.syncthreads()


def histogram(x, bins, n):  # type: ignore[no-untyped-def]
    local = cuda.shared.array(256, uint32)
    tid = cuda.threadIdx.x
    local[tid] = 0
    cuda.syncthreads()
    i = cuda.blockIdx.x * cuda.blockDim.x + tid
    while i < n:
        cuda.atomic.add(local, x[i], uint32(1))
        i += cuda.gridDim.x * cuda.blockDim.x
    cuda.syncthreads()
    mine = local[tid]
    if mine:
        cuda.atomic.add(bins, tid, mine)


def softmax_rows(x, y, cols):  # type: ignore[no-untyped-def]
    s = cuda.shared.array(256, float32)
    row = cuda.blockIdx.x * cols
    tid = cuda.threadIdx.x
    m = -HUGE
    c = tid
    while c < cols:
        m = max(m, x[row + c])
        c += cuda.blockDim.x
    s[tid] = m
    cuda.syncthreads()
    k = cuda.blockDim.x // 2
    while k > 0:
        if tid < k:
            s[tid] = max(s[tid], s[tid + k])
        cuda.syncthreads()
        k >>= 1
    m = s[0]
    cuda.syncthreads()
    total = float32(0.0)
    c = tid
    while c < cols:
        total += math.exp(x[row + c] - m)
        c += cuda.blockDim.x
    s[tid] = total
    cuda.syncthreads()
    k = cuda.blockDim.x // 2
    while k > 0:
        if tid < k:
            s[tid] += s[tid + k]
        cuda.syncthreads()
        k >>= 1
    inv = float32(1.0) / s[0]
    c = tid
    while c < cols:
        y[row + c] = math.exp(x[row + c] - m) * inv
        c += cuda.blockDim.x


def kmeans_assign(points, centroids, labels, n, k):  # type: ignore[no-untyped-def]
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i >= n:
        return
    p = cuda.local.array(8, float32)
    for d in range(8):
        p[d] = points[i * 8 + d]
    best = HUGE
    label = 0
    for c in range(k):
        dist = float32(0.0)
        for d in range(8):
            t = p[d] - centroids[c * 8 + d]
            dist = cuda.fma(t, t, dist)
        if dist < best:
            best = dist
            label = c
    labels[i] = label


FUNCTIONS = {name: globals()[name] for name in NAMES}
F32, I32 = float32[::1], int32[::1]
#: Each kernel's argument types as its launch passes them (flat arrays, int32 scalars).
SIGNATURES = {
    "stencil": (F32, F32, int32),
    "reduce_branchy": (F32, F32, int32),
    "matmul_tiled": (F32, F32, F32, int32),
    "bfs_step": (I32, I32, I32, I32, I32, int32),
    "nw_wavefront": (I32, I32, I32, int32),
    "histogram": (uint8[::1], uint32[::1], int32),
    "softmax_rows": (F32, F32, int32),
    "kmeans_assign": (F32, F32, I32, int32, int32),
}


def kernels() -> dict[str, Any]:
    """Every kernel compiled anew (a new dispatcher each: Numba compiles at the first launch)."""
    return {name: cuda.jit(function) for name, function in FUNCTIONS.items()}


def launches(cp: Any, scale: float = 1.0) -> list[Launch]:
    """CuPy's launches (the same inputs and truths), each array argument flat and each scalar
    a scalar (numpy scalars have ``ravel`` too: a one-element array Numba cannot ``range``)."""
    out = []
    for one in cupy_launches(cp, scale):
        flat = tuple(a.ravel() if getattr(a, "ndim", 0) > 0 else a for a in one.args)
        out.append(dataclasses.replace(one, args=flat))
    return out


def entry(name: str, entries: Iterable[str]) -> str | None:
    """The PTX entry of kernel ``name`` among ``entries`` (Itanium-mangled, its module first)."""
    pattern = re.compile(rf"_ZN{len(__name__)}{__name__}{len(name)}{name}B")
    return next((one for one in entries if pattern.match(one)), None)


def run(launch: Launch, compiled: dict[str, Any]) -> None:
    """The program's own launch of one kernel."""
    compiled[launch.kernel][launch.grid, launch.block](*launch.args)

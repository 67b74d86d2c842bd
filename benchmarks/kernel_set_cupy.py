"""The instrumentation benchmark's kernel set in CUDA C, for CuPy (``kernel_instrumentation.py``).

Eight kernels written here after Rodinia and HeCBench: a 5-point stencil (Rodinia hotspot's
shape), a reduction with a divergent branch per element and a shared-memory tree, a tiled
matrix product with its loop over tiles, a BFS step (a data-dependent loop over each frontier
vertex's edges), a Needleman-Wunsch wavefront (one CTA per problem, a loop over anti-diagonals),
a histogram with shared and global atomics, a row softmax, and a k-means assignment (a loop over
centroids with a divergent minimum). Every kernel is deterministic (integer atomics only, no
float atomics), so instrumented and plain outputs must be bit-identical.

Each :class:`Case` knows, from its inputs alone, what its counts must be (``truths``): thread
executions of an instruction kind (``st.global``, ``bar.sync``, ``atom.shared``...) that the
kernel's arithmetic implies. ``SOURCE`` compiles with NVRTC without a GPU (the CI test).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

SOURCE = r"""
extern "C" __global__ void stencil(const float *a, float *b, int n) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x > 0 && y > 0 && x < n - 1 && y < n - 1) {
        int i = y * n + x;
        b[i] = 0.2f * (a[i] + a[i - 1] + a[i + 1] + a[i - n] + a[i + n]);
    }
}

extern "C" __global__ void reduce_branchy(const float *x, float *partial, int n) {
    __shared__ float s[256];
    int tid = threadIdx.x;
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + tid; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        if (v > 0.5f) {
            acc += sqrtf(v) * v;
        } else {
            acc -= v * 0.5f;
        }
    }
    s[tid] = acc;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (tid < k) s[tid] += s[tid + k];
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = s[0];
}

#define TILE 16
extern "C" __global__ void matmul_tiled(const float *a, const float *b, float *c, int n) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n / TILE; ++t) {
        ta[threadIdx.y][threadIdx.x] = a[row * n + t * TILE + threadIdx.x];
        tb[threadIdx.y][threadIdx.x] = b[(t * TILE + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc = fmaf(ta[threadIdx.y][k], tb[k][threadIdx.x], acc);
        __syncthreads();
    }
    c[row * n + col] = acc;
}

extern "C" __global__ void bfs_step(const int *offsets, const int *edges, const int *frontier,
                                    const int *visited, int *next, int vertices) {
    int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= vertices || !frontier[v]) return;
    for (int e = offsets[v]; e < offsets[v + 1]; ++e) {
        int w = edges[e];
        if (!visited[w]) next[w] = 1;
    }
}

extern "C" __global__ void nw_wavefront(const int *seq_a, const int *seq_b, int *score, int len) {
    int p = blockIdx.x, i = threadIdx.x + 1;
    int side = len + 1;
    int *h = score + (long long)p * side * side;
    const int *a = seq_a + (long long)p * len, *b = seq_b + (long long)p * len;
    for (int d = 2; d <= 2 * len; ++d) {
        int j = d - i;
        if (j >= 1 && j <= len) {
            int match = h[(i - 1) * side + j - 1] + (a[i - 1] == b[j - 1] ? 1 : -1);
            int up = h[(i - 1) * side + j] - 1, left = h[i * side + j - 1] - 1;
            h[i * side + j] = max(match, max(up, left));
        }
        __syncthreads();
    }
}

extern "C" __global__ void histogram(const unsigned char *x, unsigned int *bins, int n) {
    __shared__ unsigned int local[256];
    local[threadIdx.x] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        atomicAdd(&local[x[i]], 1u);
    }
    __syncthreads();
    unsigned int mine = local[threadIdx.x];
    if (mine) atomicAdd(&bins[threadIdx.x], mine);
}

extern "C" __global__ void softmax_rows(const float *x, float *y, int cols) {
    __shared__ float s[256];
    const float *row = x + (long long)blockIdx.x * cols;
    float *out = y + (long long)blockIdx.x * cols;
    int tid = threadIdx.x;
    float m = -3.0e38f;
    for (int c = tid; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    s[tid] = m;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (tid < k) s[tid] = fmaxf(s[tid], s[tid + k]);
        __syncthreads();
    }
    m = s[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = tid; c < cols; c += blockDim.x) sum += __expf(row[c] - m);
    s[tid] = sum;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (tid < k) s[tid] += s[tid + k];
        __syncthreads();
    }
    float inv = 1.0f / s[0];
    for (int c = tid; c < cols; c += blockDim.x) out[c] = __expf(row[c] - m) * inv;
}

extern "C" __global__ void kmeans_assign(const float *points, const float *centroids,
                                         int *labels, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p[8];
    for (int d = 0; d < 8; ++d) p[d] = points[i * 8 + d];
    float best = 3.0e38f;
    int label = 0;
    for (int c = 0; c < k; ++c) {
        float dist = 0.0f;
        for (int d = 0; d < 8; ++d) {
            float t = p[d] - centroids[c * 8 + d];
            dist = fmaf(t, t, dist);
        }
        if (dist < best) {
            best = dist;
            label = c;
        }
    }
    labels[i] = label;
}
"""

NAMES = (
    "stencil",
    "reduce_branchy",
    "matmul_tiled",
    "bfs_step",
    "nw_wavefront",
    "histogram",
    "softmax_rows",
    "kmeans_assign",
)


@dataclass
class Launch:
    """One kernel's launch: its grid and block, its arguments, the arrays it writes (zeroed or
    reset before each launch by ``reset``) and what its counts must be."""

    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple[Any, ...]
    outputs: tuple[Any, ...]
    reset: Callable[[], None]
    truths: dict[str, tuple[str, int]]  # what -> (instruction prefix, thread executions)


def graph(rng: np.random.Generator, vertices: int, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """A CSR graph: vertex v has a degree drawn around ``degree`` (0 to 2 × degree)."""
    degrees = rng.integers(0, 2 * degree + 1, vertices).astype(np.int64)
    offsets = np.zeros(vertices + 1, np.int64)
    offsets[1:] = np.cumsum(degrees)
    edges = rng.integers(0, vertices, int(offsets[-1])).astype(np.int32)
    return offsets.astype(np.int32), edges


def nw_inputs(rng: np.random.Generator, problems: int, length: int) -> tuple[np.ndarray, ...]:
    """Sequences over 4 letters and score matrices with their gap borders (-i, -j)."""
    a = rng.integers(0, 4, (problems, length)).astype(np.int32)
    b = rng.integers(0, 4, (problems, length)).astype(np.int32)
    side = length + 1
    score = np.zeros((problems, side, side), np.int32)
    score[:, 0, :] = -np.arange(side)
    score[:, :, 0] = -np.arange(side)
    return a, b, score


def launches(cp: Any, scale: float = 1.0) -> list[Launch]:
    """Every kernel's launch on the device, sized for about a millisecond on an H100 at scale
    1 (``scale`` < 1 for a quick run), with its truths computed from its inputs."""
    rng = np.random.default_rng(34)
    out: list[Launch] = []

    n = int(16384 * scale**0.5) // 16 * 16
    a = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = cp.zeros_like(a)
    out.append(
        Launch(
            "stencil",
            (n // 16, n // 16),
            (16, 16),
            (a, b, np.int32(n)),
            (b,),
            lambda b=b: b.fill(0),
            {"interior stores": ("st.global", (n - 2) ** 2)},
        )
    )

    size, grid = int((1 << 28) * scale), 4096
    x = cp.asarray(rng.random(size, dtype=np.float32))
    partial = cp.zeros(grid, cp.float32)
    out.append(
        Launch(
            "reduce_branchy",
            (grid,),
            (256,),
            (x, partial, np.int32(size)),
            (partial,),
            lambda p=partial: p.fill(0),
            {
                "element loads": ("ld.global", size),
                "barriers (1 + log2 256 per thread)": ("bar.sync", grid * 256 * 9),
                "per-CTA stores": ("st.global", grid),
            },
        )
    )

    m = int(2048 * scale ** (1 / 3)) // 16 * 16
    ma = cp.asarray(rng.standard_normal((m, m), dtype=np.float32))
    mb = cp.asarray(rng.standard_normal((m, m), dtype=np.float32))
    mc = cp.zeros((m, m), cp.float32)
    out.append(
        Launch(
            "matmul_tiled",
            (m // 16, m // 16),
            (16, 16),
            (ma, mb, mc, np.int32(m)),
            (mc,),
            lambda c=mc: c.fill(0),
            {
                "barriers (2 per tile)": ("bar.sync", m * m * 2 * (m // 16)),
                "stores": ("st.global", m * m),
            },
        )
    )

    vertices = int((1 << 22) * scale)
    offsets, edges = graph(rng, vertices, 16)
    frontier = (rng.random(vertices) < 0.5).astype(np.int32)
    visited = (rng.random(vertices) < 0.3).astype(np.int32)
    owner = np.repeat(np.arange(vertices), np.diff(offsets))
    marks = int((frontier[owner] & (1 - visited[edges])).sum())  # edges to unvisited vertices
    nxt = cp.zeros(vertices, cp.int32)
    out.append(
        Launch(
            "bfs_step",
            ((vertices + 255) // 256,),
            (256,),
            (
                cp.asarray(offsets),
                cp.asarray(edges),
                cp.asarray(frontier),
                cp.asarray(visited),
                nxt,
                np.int32(vertices),
            ),
            (nxt,),
            lambda z=nxt: z.fill(0),
            {"marks (frontier edges to unvisited vertices)": ("st.global", marks)},
        )
    )

    problems, length = int(8192 * scale), 128
    sa, sb, score = nw_inputs(rng, problems, length)
    d_score = cp.asarray(score)
    out.append(
        Launch(
            "nw_wavefront",
            (problems,),
            (length,),
            (cp.asarray(sa), cp.asarray(sb), d_score, np.int32(length)),
            (d_score,),
            lambda s=d_score, h=score: s.set(h),
            {
                "cells": ("st.global", problems * length * length),
                "barriers (one a diagonal)": ("bar.sync", problems * length * (2 * length - 1)),
            },
        )
    )

    size, grid = int((1 << 27) * scale), 1024
    values = np.minimum(rng.geometric(0.02, size), 255).astype(np.uint8)
    bins = cp.zeros(256, cp.uint32)
    cta = (np.arange(size, dtype=np.int64) // 256) % grid  # the grid-stride loop's CTA
    merges = np.unique(cta * 256 + values).size  # non-empty (CTA, bin) pairs
    out.append(
        Launch(
            "histogram",
            (grid,),
            (256,),
            (cp.asarray(values), bins, np.int32(size)),
            (bins,),
            lambda z=bins: z.fill(0),
            {
                "shared atomics (one an element)": ("atom.shared", size),
                "global merges (non-empty CTA bins)": ("atom.global", merges),
            },
        )
    )

    rows, cols = int(262144 * scale), 1024
    sx = cp.asarray(rng.standard_normal((rows, cols), dtype=np.float32))
    sy = cp.zeros_like(sx)
    out.append(
        Launch(
            "softmax_rows",
            (rows,),
            (256,),
            (sx, sy, np.int32(cols)),
            (sy,),
            lambda z=sy: z.fill(0),
            {
                "stores": ("st.global", rows * cols),
                "barriers": ("bar.sync", rows * 256 * (1 + 8 + 1 + 1 + 8)),
            },
        )
    )

    points, k = int((1 << 24) * scale), 64
    px = cp.asarray(rng.standard_normal((points, 8), dtype=np.float32))
    cx = cp.asarray(rng.standard_normal((k, 8), dtype=np.float32))
    labels = cp.zeros(points, cp.int32)
    out.append(
        Launch(
            "kmeans_assign",
            ((points + 255) // 256,),
            (256,),
            (px, cx, labels, np.int32(points), np.int32(k)),
            (labels,),
            lambda z=labels: z.fill(0),
            {"labels stored": ("st.global", points)},
        )
    )
    return out

// Kernels after Rodinia and HeCBench, written here for the PTX pass's tests (issue #34).
// make_fixtures.py compiles them with nvcc -ptx -lineinfo (sm_80) into kernels_sm80.ptx; the
// device script runs them instrumented and checks the counts their own arithmetic implies.
#include <math.h>

extern "C" {

// A 3-point stencil: interior points only.
__global__ void stencil(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= 0 || i >= n - 1) return;
  out[i] = 0.25f * in[i - 1] + 0.5f * in[i] + 0.25f * in[i + 1];
}

// A shared-memory tree reduction: the active threads halve each step (divergent branches).
__global__ void reduce(const float* in, float* out, int n) {
  __shared__ float s[256];
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = i < n ? in[i] : 0.0f;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// A tiled matrix product (n a multiple of 16): a loop over tiles holding a loop over one tile.
__global__ void matmul(const float* a, const float* b, float* c, int n) {
  __shared__ float as[16][16], bs[16][16];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += 16) {
    as[ty][tx] = a[row * n + k0 + tx];
    bs[ty][tx] = b[(k0 + ty) * n + col];
    __syncthreads();
#pragma unroll 1
    for (int k = 0; k < 16; ++k) acc += as[ty][k] * bs[k][tx];
    __syncthreads();
  }
  c[row * n + col] = acc;
}

// One BFS level over a CSR graph: each frontier vertex walks its own adjacency list.
__global__ void bfs(const int* row, const int* col, const int* level, int* next, int n,
                    int current) {
  int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= n || level[v] != current) return;
  for (int e = row[v]; e < row[v + 1]; ++e) {
    int w = col[e];
    if (level[w] < 0) next[w] = 1;
  }
}

// Needleman-Wunsch, one anti-diagonal per launch (cells with i + j == diag + 1).
__global__ void wavefront(int* score, const int* sim, int n, int diag, int penalty) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  int i = t + 1, j = diag - t;
  if (i > n || j < 1 || j > n) return;
  int w = n + 1;
  int best = score[(i - 1) * w + (j - 1)] + sim[(i - 1) * n + (j - 1)];
  int up = score[(i - 1) * w + j] - penalty, left = score[i * w + (j - 1)] - penalty;
  if (up > best) best = up;
  if (left > best) best = left;
  score[i * w + j] = best;
}

// A histogram: shared-memory bins, a grid-stride loop of atomics, then a merge.
__global__ void histogram(const int* x, int n, unsigned* bins, int nbins) {
  __shared__ unsigned local[256];
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&local[x[i] % nbins], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < nbins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&bins[b], local[b]);
}

// Softmax of each row by one warp: three strided passes and two shuffle reductions.
__global__ void softmax(const float* x, float* y, int cols) {
  const float* in = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;
  int lane = threadIdx.x;
  float m = -INFINITY;
  for (int c = lane; c < cols; c += 32) m = fmaxf(m, in[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0.0f;
  for (int c = lane; c < cols; c += 32) s += expf(in[c] - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  for (int c = lane; c < cols; c += 32) out[c] = expf(in[c] - m) / s;
}

}  // extern "C"

// Unit a of the multi-unit cubin (tests/data/cubin/build.sh): an inlined helper, a device
// function called from another unit, a kernel calling into units b and c.
__device__ __forceinline__ int a_scale(int x) { return (x * x) ^ (x >> 3); }
__device__ int b_work(int x);
__device__ int c_work(int x);
__device__ __noinline__ int a_work(int x)
{
    int s = 0;
#pragma unroll 1
    for (int i = 0; i < x; ++i)
        s += a_scale(i);
    return s;
}
__global__ void ka(int *out, int n)
{
    int t = threadIdx.x;
    out[t] = a_work(n) + b_work(t) + c_work(n + t);
}

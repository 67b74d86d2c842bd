// Unit b: an inlined template whose mangled name encodes its return type, inlined twice deep.
template <typename T> struct Pair { T lo, hi; };
template <typename T> __device__ __forceinline__ Pair<T> b_split(T v) { return Pair<T>{v & 15, v >> 4}; }
__device__ __forceinline__ int b_mix(int x) { Pair<int> p = b_split<int>(x); return p.lo * 7 + p.hi; }
__device__ int c_work(int x);
__device__ __noinline__ int b_work(int x)
{
    int s = 0;
#pragma unroll 1
    for (int i = 0; i < x; ++i)
        s ^= b_mix(i + x);
    return s + c_work(s);
}
__global__ void kb(int *out) { out[threadIdx.x] = b_work(threadIdx.x); }

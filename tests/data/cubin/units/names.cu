// Names as hpcstruct prints them (tests/data/cubin/build.sh builds it with -G and -lineinfo):
// template functions (inlined and not) whose mangled names encode their return types, and a
// template kernel.
template <typename T> struct Pair { T lo, hi; };
template <typename T> __device__ __forceinline__ Pair<T> split(T v) { return Pair<T>{v & 15, v >> 4}; }
__device__ __forceinline__ int mix(int x) { Pair<int> p = split<int>(x); return p.lo * 7 + p.hi; }
template <typename T> __device__ __noinline__ Pair<T> widen(T v) { return Pair<T>{v, mix(v)}; }
template <typename T> __global__ void kt(T *out)
{
    Pair<T> p = widen<T>(out[threadIdx.x]);
    out[threadIdx.x] = p.lo + mix(p.hi);
}
template __global__ void kt<int>(int *);

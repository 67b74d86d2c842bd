// Unit c: double division, which calls the CUDA math helper __cuda_sm20_div_rn_f64_full.
__device__ __forceinline__ double c_ratio(double a, double b) { return a / b; }
__device__ __noinline__ int c_work(int x)
{
    double r = 0;
#pragma unroll 1
    for (int i = 1; i < x; ++i)
        r += c_ratio(x, i);
    return (int)r;
}
__global__ void kc(double *out, double d) { out[threadIdx.x] = c_ratio(out[threadIdx.x], d) + c_work(threadIdx.x); }

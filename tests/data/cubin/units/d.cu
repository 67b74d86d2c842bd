// Unit d: its own copy of the division helper (same name as unit c's) and the sqrt helper.
__device__ __forceinline__ double d_norm(double a, double b) { return sqrt(a * a + b) / b; }
__global__ void kd(double *out, double d) { out[threadIdx.x] = d_norm(out[threadIdx.x], d); }

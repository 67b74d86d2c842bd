// One unit of copies_sm_75.cubin, compiled once per UNIT (0 to 3) with -rdc=true: each unit
// brings its own local copy of CUDA's double sqrt and division helpers, which nvlink keeps
// side by side under one section and symbol name.
#define KERNEL_(n) k##n
#define KERNEL(n) KERNEL_(n)
__global__ void KERNEL(UNIT)(double *out, double d) { out[threadIdx.x] = sqrt(out[threadIdx.x] * d) / d; }

// Recursive device code for tests/test_pyprof_gpu_recursion.py: direct recursion and two
// mutually recursive pairs, each function __noinline__ so that every call stays a call.

// Direct recursion: fact calls itself. What follows the call (xor, then multiply) is no
// accumulation the compiler could turn into a loop, so the call stays.
__device__ __noinline__ int fact(int n) {
    if (n <= 1) {
        return 1;
    }
    return (fact(n - 1) ^ n) * 3 + 1;
}

// Mutual recursion entered at both members: the kernel `mutual` calls even and odd.
__device__ __noinline__ int odd(int n);
__device__ __noinline__ int even(int n) {
    if (n == 0) {
        return 1;
    }
    return odd(n - 1) * 3 + 1;
}
__device__ __noinline__ int odd(int n) {
    if (n == 0) {
        return 0;
    }
    return even(n - 1) * 5 + 2;
}

// Mutual recursion entered at one member only: the kernel `entered_once` calls pong alone.
__device__ __noinline__ int pong(int n);
__device__ __noinline__ int ping(int n) {
    if (n <= 0) {
        return 7;
    }
    return pong(n - 1) * 11 + 3;
}
__device__ __noinline__ int pong(int n) {
    if (n <= 0) {
        return 13;
    }
    return ping(n - 1) * 17 + 4;
}

__global__ void direct(int *out, int n) {
    out[threadIdx.x] = fact(n + threadIdx.x);
}

__global__ void mutual(int *out, int n) {
    int a = even(n + threadIdx.x);
    out[threadIdx.x] = a + odd(n + threadIdx.x + 1);
}

__global__ void entered_once(int *out, int n) {
    out[threadIdx.x] = pong(n + threadIdx.x);
}

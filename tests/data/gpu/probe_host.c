// A C host that loads sass_probe.cu's library the way a Python process loads libraries
// (dlopen, RTLD_LOCAL unless told otherwise): does the dynamic-linking scope of libcuda and
// libcupti decide whether CUPTI patches a cuModuleLoadData module? (issue #7 diagnosis)
//
//   gcc -o /tmp/probe_host tests/data/gpu/probe_host.c -ldl
//   /tmp/probe_host CUDA_SCOPE PROBE_SCOPE RTINIT [LIBRARY] [CUBIN]
// CUDA_SCOPE: none | local | global — libcuda.so.1 opened first, before the probe library;
// PROBE_SCOPE: local | global — how the probe library (and so its libcupti) is opened;
// RTINIT: 1 initializes the probe's CUDA runtime before the CUPTI setup (as its main() does).
// Prints "RESULT records=N".
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*int_fn)(void);
typedef int (*init_fn)(unsigned int);
typedef int (*setup_fn)(int, int);
typedef void *(*load_fn)(const char *);
typedef int (*launch_fn)(void *, int);
typedef long long (*collect_fn)(void);
typedef int (*retain_fn)(void **, int);
typedef int (*current_fn)(void *);

static int scope(const char *name)
{
    return strcmp(name, "global") == 0 ? RTLD_GLOBAL : RTLD_LOCAL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s none|local|global local|global 0|1 [LIBRARY] [CUBIN]\n", argv[0]);
        return 2;
    }
    const char *library = argc > 4 ? argv[4] : "/tmp/libsass_probe.so";
    const char *cubin = argc > 5 ? argv[5] : "tests/data/gpu/gt_sm90.cubin";
    void *cuda = NULL;
    if (strcmp(argv[1], "none") != 0) {
        cuda = dlopen("libcuda.so.1", RTLD_NOW | scope(argv[1]));
    }
    void *probe = dlopen(library, RTLD_NOW | scope(argv[2]));
    if (!probe) {
        printf("dlopen %s: %s\n", library, dlerror());
        return 2;
    }
    if (!cuda) {
        cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    }
    init_fn cu_init = (init_fn)dlsym(cuda, "cuInit");
    retain_fn retain = (retain_fn)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    current_fn set_current = (current_fn)dlsym(cuda, "cuCtxSetCurrent");
    void *context = NULL;
    printf("cuInit %d", cu_init(0));
    printf(" retain %d", retain(&context, 0));
    printf(" set %d\n", set_current(context));
    if (atoi(argv[3])) {
        printf("probe_runtime_init %d\n", ((int_fn)dlsym(probe, "probe_runtime_init"))());
    }
    ((setup_fn)dlsym(probe, "probe_setup"))(1, 0);
    void *function = ((load_fn)dlsym(probe, "probe_load_cubin"))(cubin);
    ((launch_fn)dlsym(probe, "probe_launch_function"))(function, 64);
    long long records = ((collect_fn)dlsym(probe, "probe_collect"))();
    printf("RESULT records=%lld cuda=%s probe=%s rtinit=%s\n", records, argv[1], argv[2], argv[3]);
    return records > 0 ? 0 : 1;
}

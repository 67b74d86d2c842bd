// Does CUPTI's SASS metrics API count instructions on this machine, with no Python at all?
// (issue #7: from Python, cuptiSassMetricsGetDataProperties reported 0 patched instructions on
// the H200 in every configuration diagnose_inst.py tries; this program counts there.)
//
// Build and run on the device (repository root):
//   nvcc -arch=sm_90 -o /tmp/sass_probe tests/data/gpu/sass_probe.cu -lcupti -lcuda
//   /tmp/sass_probe [primary|created] [lazy: 0|1] [iterations] [CUBIN]
// With CUBIN (tests/data/gpu/gt_sm90.cubin), the kernel is gt_kernel loaded from it with
// cuModuleLoadData (as CuPy and PyTorch load theirs) instead of this file's own kernel.
// Each CUPTI call's status is printed; the last line is
//   RESULT records=R instances=I inst_executed=N expected_at_least=E
// where E is a lower bound on the warp-level instructions the kernel executes (one add and one
// compare per loop iteration per warp). LD_LIBRARY_PATH picks which libcupti is used.
// PROBE_ZERO_CONFIG=1 zeroes the CUpti_SassMetrics_Config array right after SetConfig;
// PROBE_NO_QUERY=1 leaves out cuptiProfilerDeviceSupported; PROBE_TWO_METRICS=1 also counts
// smsp__sass_thread_inst_executed (as pyrun does).
//
// Built with -shared -Xcompiler -fPIC -DPROBE_LIBRARY, the steps are functions a Python process
// calls through ctypes (diagnose_inst.py mixes them with its own ctypes calls):
//   probe_setup(lazy, query)  profiler init, [DeviceSupported], SetConfig, Enable (current ctx)
//   probe_launch(iterations)  this file's kernel, synchronized
//   probe_collect()           GetDataProperties + FlushData: the records, or -status
//   probe_load_cubin(path) -> gt_kernel's CUfunction; probe_launch_function(function, iters);
//   probe_runtime_init()      cudaFree(0) on this file's statically linked CUDA runtime
//   probe_enable(lazy), probe_disable()   cuptiSassMetricsEnable / Disable again
//   probe_unset(), probe_deinit()          cuptiSassMetricsUnsetConfig, cuptiProfilerDeInitialize
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_profiler_target.h>
#include <cupti_sass_metrics.h>
#include <cupti_target.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCKS 132
#define THREADS 128

#ifdef PROBE_LIBRARY
#define PROBE_API extern "C"
#else
#define PROBE_API static
#endif

static int failures = 0;
static CUcontext context = NULL;
static CUpti_SassMetrics_Config config[2];
static unsigned long long executed = 0;
static size_t instances = 0;

static CUptiResult report(const char *what, CUptiResult status)
{
    const char *text = "";
    cuptiGetResultString(status, &text);
    printf("%-34s %d %s\n", what, (int)status, status == CUPTI_SUCCESS ? "" : text);
    if (status != CUPTI_SUCCESS) {
        failures++;
    }
    return status;
}

__global__ void probe_kernel(int *out, int iterations)
{
    int acc = threadIdx.x;
    for (int i = 0; i < iterations; ++i) {
        acc = acc * 3 + (i ^ acc);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

PROBE_API int probe_setup(int lazy, int query)
{
    cuCtxGetCurrent(&context);
    CUpti_Profiler_Initialize_Params init = {CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    report("cuptiProfilerInitialize", cuptiProfilerInitialize(&init));

    if (query) {
        CUpti_Profiler_DeviceSupported_Params supported = {
            CUpti_Profiler_DeviceSupported_Params_STRUCT_SIZE};
        supported.cuDevice = 0;
        supported.api = CUPTI_PROFILER_SASS_METRICS;
        report("cuptiProfilerDeviceSupported(SASS)", cuptiProfilerDeviceSupported(&supported));
        printf("  supported=%d arch=%d sli=%d vgpu=%d cc=%d cmp=%d wsl=%d (3 = supported)\n",
               supported.isSupported, supported.architecture, supported.sli, supported.vGpu,
               supported.confidentialCompute, supported.cmp, supported.wsl);
    }

    CUpti_Device_GetChipName_Params chip = {CUpti_Device_GetChipName_Params_STRUCT_SIZE};
    chip.deviceIndex = 0;
    report("cuptiDeviceGetChipName", cuptiDeviceGetChipName(&chip));
    printf("  chip %s\n", chip.pChipName ? chip.pChipName : "?");

    const char *names[2] = {"smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"};
    size_t metrics = getenv("PROBE_TWO_METRICS") ? 2 : 1;
    for (size_t m = 0; m < metrics; ++m) {
        CUpti_SassMetrics_GetProperties_Params props = {
            CUpti_SassMetrics_GetProperties_Params_STRUCT_SIZE};
        props.pChipName = chip.pChipName;
        props.pMetricName = names[m];
        report("cuptiSassMetricsGetProperties", cuptiSassMetricsGetProperties(&props));
        config[m].metricId = props.metric.metricId;
        config[m].outputGranularity = CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU;
    }

    CUpti_SassMetricsSetConfig_Params set = {CUpti_SassMetricsSetConfig_Params_STRUCT_SIZE};
    set.numOfMetricConfig = metrics;
    set.pConfigs = config;
    set.deviceIndex = 0;
    report("cuptiSassMetricsSetConfig", cuptiSassMetricsSetConfig(&set));
    printf("  metric id %llu\n", (unsigned long long)config[0].metricId);
    if (getenv("PROBE_ZERO_CONFIG")) {  // does CUPTI read the array again after SetConfig?
        memset(&config, 0, sizeof(config));
    }

    if (lazy >= 0) {  // lazy < 0: configured, not enabled
        CUpti_SassMetricsEnable_Params enable = {CUpti_SassMetricsEnable_Params_STRUCT_SIZE};
        enable.ctx = context;
        enable.enableLazyPatching = (uint8_t)lazy;
        report("cuptiSassMetricsEnable", cuptiSassMetricsEnable(&enable));
    }
    fflush(stdout);
    return failures;
}

PROBE_API int probe_enable(int lazy)  // cuptiSassMetricsEnable on the setup's context
{
    CUpti_SassMetricsEnable_Params enable = {CUpti_SassMetricsEnable_Params_STRUCT_SIZE};
    enable.ctx = context;
    enable.enableLazyPatching = (uint8_t)lazy;
    return (int)cuptiSassMetricsEnable(&enable);
}

PROBE_API long long probe_disable(void)  // cuptiSassMetricsDisable: dropped records, or -status
{
    CUpti_SassMetricsDisable_Params disable = {CUpti_SassMetricsDisable_Params_STRUCT_SIZE};
    disable.ctx = context;
    CUptiResult status = cuptiSassMetricsDisable(&disable);
    return status ? -(long long)status : (long long)disable.numOfDroppedRecords;
}

PROBE_API int probe_unset(void)  // cuptiSassMetricsUnsetConfig (after a disable)
{
    CUpti_SassMetricsUnsetConfig_Params unset = {CUpti_SassMetricsUnsetConfig_Params_STRUCT_SIZE};
    unset.deviceIndex = 0;
    return (int)cuptiSassMetricsUnsetConfig(&unset);
}

PROBE_API int probe_deinit(void)  // cuptiProfilerDeInitialize
{
    CUpti_Profiler_DeInitialize_Params deinit = {CUpti_Profiler_DeInitialize_Params_STRUCT_SIZE};
    return (int)cuptiProfilerDeInitialize(&deinit);
}

PROBE_API unsigned long long probe_executed(void)  // instructions flushed so far, in total
{
    return executed;
}

static int *out = NULL;

PROBE_API int probe_launch(int iterations)
{
    if (!out) {
        cudaMalloc(&out, BLOCKS * THREADS * sizeof(int));
    }
    probe_kernel<<<BLOCKS, THREADS>>>(out, iterations);
    cudaError_t launched = cudaDeviceSynchronize();
    printf("kernel                             %d %s\n", (int)launched,
           cudaGetErrorString(launched));
    fflush(stdout);
    return (int)launched;
}

PROBE_API void *probe_load_cubin(const char *cubin)  // gt_kernel's CUfunction, or NULL
{
    FILE *file = fopen(cubin, "rb");
    static char image[1 << 22];
    size_t size = file ? fread(image, 1, sizeof(image), file) : 0;
    if (file) {
        fclose(file);
    }
    CUmodule module;
    CUfunction function = NULL;
    CUresult loaded = cuModuleLoadData(&module, image);
    CUresult found = cuModuleGetFunction(&function, module, "gt_kernel");
    printf("cuModuleLoadData (%zu bytes)        %d, cuModuleGetFunction %d\n", size, (int)loaded,
           (int)found);
    fflush(stdout);
    return (loaded || found) ? NULL : (void *)function;
}

PROBE_API int probe_launch_function(void *function, int iterations)  // gt_kernel, synchronized
{
    if (!out) {
        cudaMalloc(&out, BLOCKS * THREADS * sizeof(int));
    }
    int iters = iterations, depth = 5, turns = 3, reps = 1;
    void *args[] = {&out, &iters, &depth, &turns, &reps};
    CUresult started =
        cuLaunchKernel((CUfunction)function, BLOCKS, 1, 1, THREADS, 1, 1, 0, NULL, args, NULL);
    printf("cuLaunchKernel                     %d\n", (int)started);
    fflush(stdout);
    return (int)cudaDeviceSynchronize();
}

PROBE_API int probe_runtime_init(void)  // initializes this file's (static) CUDA runtime
{
    return (int)cudaFree(0);
}

PROBE_API long long probe_collect(void)
{
    CUpti_SassMetricsGetDataProperties_Params data = {
        CUpti_SassMetricsGetDataProperties_Params_STRUCT_SIZE};
    data.ctx = context;
    CUptiResult status = report("cuptiSassMetricsGetDataProperties",
                                cuptiSassMetricsGetDataProperties(&data));
    if (status != CUPTI_SUCCESS) {
        return -(long long)status;
    }
    size_t records = data.numOfPatchedInstructionRecords;
    instances = data.numOfInstances;
    if (records && instances) {
        CUpti_SassMetrics_Data *rows =
            (CUpti_SassMetrics_Data *)calloc(records, sizeof(CUpti_SassMetrics_Data));
        CUpti_SassMetrics_InstanceValue *values = (CUpti_SassMetrics_InstanceValue *)calloc(
            records * instances, sizeof(CUpti_SassMetrics_InstanceValue));
        for (size_t r = 0; r < records; ++r) {
            rows[r].structSize = sizeof(CUpti_SassMetrics_Data);
            rows[r].pInstanceValues = values + r * instances;
        }
        CUpti_SassMetricsFlushData_Params flush = {CUpti_SassMetricsFlushData_Params_STRUCT_SIZE};
        flush.ctx = context;
        flush.numOfPatchedInstructionRecords = records;
        flush.numOfInstances = instances;
        flush.pMetricsData = rows;
        report("cuptiSassMetricsFlushData", cuptiSassMetricsFlushData(&flush));
        for (size_t v = 0; v < records * instances; ++v) {
            executed += values[v].value;
        }
        printf("  first record: %s pc 0x%x\n", rows[0].functionName ? rows[0].functionName : "?",
               rows[0].pcOffset);
        free(values);
        free(rows);
    }
    fflush(stdout);
    return (long long)records;
}

#ifndef PROBE_LIBRARY
int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "primary";
    int lazy = argc > 2 ? atoi(argv[2]) : 1;
    int iterations = argc > 3 ? atoi(argv[3]) : 1000;
    const char *cubin = argc > 4 ? argv[4] : NULL;
    int driver = 0;
    uint32_t cupti_version = 0;

    cuInit(0);
    cuDriverGetVersion(&driver);
    cuptiGetVersion(&cupti_version);
    printf("driver API %d, CUPTI API %u, mode %s, lazy %d\n", driver, cupti_version, mode, lazy);
    if (strcmp(mode, "created") == 0) {
        CUdevice device;
        CUcontext made_context;
        cuDeviceGet(&device, 0);
        CUresult made = cuCtxCreate(&made_context, NULL, 0, device);
        printf("cuCtxCreate                        %d\n", (int)made);
    } else {
        cudaSetDevice(0);
        probe_runtime_init();
    }
    probe_setup(lazy, getenv("PROBE_NO_QUERY") == NULL);
    if (cubin) {
        probe_launch_function(probe_load_cubin(cubin), iterations);
    } else {
        probe_launch(iterations);
    }
    long long records = probe_collect();

    CUpti_SassMetricsDisable_Params disable = {CUpti_SassMetricsDisable_Params_STRUCT_SIZE};
    disable.ctx = context;
    report("cuptiSassMetricsDisable", cuptiSassMetricsDisable(&disable));
    CUpti_SassMetricsUnsetConfig_Params unset = {CUpti_SassMetricsUnsetConfig_Params_STRUCT_SIZE};
    unset.deviceIndex = 0;
    report("cuptiSassMetricsUnsetConfig", cuptiSassMetricsUnsetConfig(&unset));

    unsigned long long warps = BLOCKS * ((THREADS + 31) / 32);
    printf("RESULT records=%lld instances=%zu inst_executed=%llu expected_at_least=%llu "
           "failures=%d\n",
           records, instances, executed, warps * 2ULL * (unsigned long long)iterations, failures);
    return records > 0 ? 0 : 1;
}
#endif

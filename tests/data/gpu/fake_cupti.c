/* A stand-in for libcupti, for tests and benchmarks without a GPU. It keeps what matters for
 * the measurement's threading and nothing else:
 *
 * - Activity buffers (tests/test_gpu_nohang.py): CUPTI completes a buffer on a thread of its
 *   own, holding its own lock while it calls the registered bufferCompleted callback;
 *   cuptiActivityFlushAll takes that same lock. fake_complete_async(hold_ms) starts such a
 *   completion: the worker takes the lock, says it is inside (fake_inside), waits hold_ms, then
 *   asks for a buffer and completes it (no records).
 * - Callbacks (tests/test_gpu_hook.py, benchmarks/gpu_model_sim.py): the subscriber is called
 *   from C on the thread that makes the API call, at its entry and exit, for the callbacks it
 *   enabled. fake_api() is one call; fake_runtime() a runtime call with the driver call it
 *   makes inside (cudaLaunchKernel calls cuLaunchKernel). Called through ctypes.CDLL, the
 *   caller's thread has released the GIL, as a library that releases it around CUDA calls.
 *   fake_worker_start() runs calls on a new thread that has a Python thread state but no
 *   Python frame and does not hold the GIL, as PyTorch's autograd workers (they create their
 *   thread state once, then release the GIL).
 * - Synchronizations timed at the API (tests/test_gpu_sync_api.py): cuptiGetTimestamp is a
 *   clock that moves 1000 ns per call, from 1000000; cuptiGetStreamIdEx names stream S of any
 *   context 10 * S + perThreadStream (handle 0xbad: an error). fake_api_stream() is one call
 *   whose first parameter is a stream, on a context whose id is ``context``.
 * Built by the tests: cc -shared -fPIC -o libcupti_fake.so fake_cupti.c -lpthread -ldl
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*requested_fn)(uint8_t **, size_t *, size_t *);
typedef void (*completed_fn)(void *, uint32_t, uint8_t *, size_t, size_t);

static requested_fn requested;
static completed_fn completed;
static pthread_mutex_t internal = PTHREAD_MUTEX_INITIALIZER; /* CUPTI's own lock */
static volatile int inside, completions, flushes;

int cuptiActivityRegisterCallbacks(requested_fn request, completed_fn complete) {
    requested = request;
    completed = complete;
    return 0;
}

static void complete_one(void) {
    uint8_t *buffer = NULL;
    size_t size = 0, most = 0;
    requested(&buffer, &size, &most);
    completed(NULL, 0, buffer, size, 0);
    __atomic_add_fetch(&completions, 1, __ATOMIC_SEQ_CST);
}

int cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    pthread_mutex_lock(&internal);
    __atomic_add_fetch(&flushes, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&internal);
    return 0;
}

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    (void)buffer;
    (void)valid;
    (void)record;
    return 1; /* CUPTI_ERROR_MAX_LIMIT_REACHED and the like: no record */
}

static void *worker(void *arg) {
    long hold_ms = (long)(intptr_t)arg;
    pthread_mutex_lock(&internal);
    __atomic_store_n(&inside, 1, __ATOMIC_SEQ_CST);
    struct timespec pause = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    complete_one();
    __atomic_store_n(&inside, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&internal);
    return NULL;
}

int fake_complete_async(long hold_ms) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, (void *)(intptr_t)hold_ms) != 0)
        return -1;
    return pthread_detach(thread);
}

int fake_inside(void) { return __atomic_load_n(&inside, __ATOMIC_SEQ_CST); }
int fake_completions(void) { return __atomic_load_n(&completions, __ATOMIC_SEQ_CST); }
int fake_flushes(void) { return __atomic_load_n(&flushes, __ATOMIC_SEQ_CST); }

/* -- callbacks ------------------------------------------------------------------------------ */

typedef void (*callback_fn)(void *, int, uint32_t, const void *);

typedef struct { /* CUpti_CallbackData (cupti_callbacks.h) */
    int callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} CallbackData;

#define FAKE_CBIDS 4096
static callback_fn subscriber;
static void *subscriber_data;
static uint8_t enabled[3][FAKE_CBIDS];

int cuptiSubscribe(void **handle, callback_fn callback, void *userdata) {
    subscriber = callback;
    subscriber_data = userdata;
    *handle = (void *)&subscriber;
    return 0;
}

int cuptiEnableCallback(uint32_t enable, void *handle, int domain, uint32_t cbid) {
    (void)handle;
    if (domain < 1 || domain > 2 || cbid >= FAKE_CBIDS)
        return domain == 3 ? 0 : 1; /* resource callbacks: accepted, never made */
    enabled[domain][cbid] = (uint8_t)(enable != 0);
    return 0;
}

int cuptiUnsubscribe(void *handle) {
    (void)handle;
    subscriber = NULL;
    memset(enabled, 0, sizeof(enabled));
    return 0;
}

static void site_with(int domain, uint32_t cbid, int at, uint32_t correlation, uintptr_t context,
                      const void *params) {
    callback_fn callback = subscriber;
    if (callback == NULL || domain < 1 || domain > 2 || cbid >= FAKE_CBIDS ||
        !enabled[domain][cbid])
        return;
    CallbackData data;
    memset(&data, 0, sizeof(data));
    data.callbackSite = at;
    data.correlationId = correlation;
    data.context = (void *)context;
    data.contextUid = (uint32_t)context;
    data.functionParams = params;
    callback(subscriber_data, domain, cbid, &data);
}

static void site(int domain, uint32_t cbid, int at, uint32_t correlation) {
    site_with(domain, cbid, at, correlation, 0, NULL);
}

static uint64_t fake_clock = 1000000;

int cuptiGetTimestamp(uint64_t *timestamp) {
    *timestamp = __atomic_add_fetch(&fake_clock, 1000, __ATOMIC_SEQ_CST);
    return 0;
}

int cuptiGetStreamIdEx(void *context, void *stream, uint8_t per_thread, uint32_t *id) {
    (void)context;
    if ((uintptr_t)stream == 0xbad)
        return 1; /* CUPTI_ERROR_INVALID_PARAMETER */
    *id = (uint32_t)((uintptr_t)stream * 10 + per_thread);
    return 0;
}

/* One API call whose parameters start with a stream (cudaStreamSynchronize_params...). */
void fake_api_stream(int domain, uint32_t cbid, uint32_t correlation, uintptr_t context,
                     uintptr_t stream) {
    const void *params[1] = {(const void *)stream};
    site_with(domain, cbid, 0, correlation, context, params);
    site_with(domain, cbid, 1, correlation, context, params);
}

/* One API call: entry and exit. */
void fake_api(int domain, uint32_t cbid, uint32_t correlation) {
    site(domain, cbid, 0, correlation);
    site(domain, cbid, 1, correlation);
}

/* A runtime call (CUPTI_CB_DOMAIN_RUNTIME_API, 2) that makes a driver call
 * (CUPTI_CB_DOMAIN_DRIVER_API, 1) inside, as cudaLaunchKernel makes cuLaunchKernel; the
 * correlation ids are the caller's to choose (equal or not). */
void fake_runtime(uint32_t runtime_cbid, uint32_t correlation, uint32_t driver_cbid,
                  uint32_t inner_correlation) {
    site(2, runtime_cbid, 0, correlation);
    fake_api(1, driver_cbid, inner_correlation);
    site(2, runtime_cbid, 1, correlation);
}

typedef struct {
    long calls;
    uint32_t runtime_cbid, driver_cbid, first;
} Job;

/* The worker: one thread for the process, as PyTorch keeps its autograd threads. */
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t job_ready = PTHREAD_COND_INITIALIZER;
static Job job;
static int job_waiting, worker_started;
static volatile int worker_done = 1;

static void *launcher(void *arg) {
    (void)arg;
    int (*ensure)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    void *(*save)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    if (ensure && save) { /* a thread state of its own, then the GIL released for good */
        ensure();
        save();
    }
    for (;;) {
        pthread_mutex_lock(&job_lock);
        while (!job_waiting)
            pthread_cond_wait(&job_ready, &job_lock);
        Job mine = job;
        job_waiting = 0;
        pthread_mutex_unlock(&job_lock);
        for (long i = 0; i < mine.calls; i++)
            fake_runtime(mine.runtime_cbid, mine.first + 2 * (uint32_t)i, mine.driver_cbid,
                         mine.first + 2 * (uint32_t)i + 1);
        __atomic_store_n(&worker_done, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

/* ``calls`` runtime calls (correlation ids first, first + 2, ...; their inner driver calls
 * first + 1, first + 3, ...) on the worker thread; fake_worker_done() says when they are made. */
int fake_worker_start(long calls, uint32_t runtime_cbid, uint32_t driver_cbid, uint32_t first) {
    pthread_mutex_lock(&job_lock);
    if (!worker_started) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, launcher, NULL) != 0) {
            pthread_mutex_unlock(&job_lock);
            return -1;
        }
        pthread_detach(thread);
        worker_started = 1;
    }
    job.calls = calls;
    job.runtime_cbid = runtime_cbid;
    job.driver_cbid = driver_cbid;
    job.first = first;
    job_waiting = 1;
    __atomic_store_n(&worker_done, 0, __ATOMIC_SEQ_CST);
    pthread_cond_signal(&job_ready);
    pthread_mutex_unlock(&job_lock);
    return 0;
}

int fake_worker_done(void) { return __atomic_load_n(&worker_done, __ATOMIC_SEQ_CST); }

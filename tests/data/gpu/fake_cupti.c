/* A stand-in for libcupti's activity-buffer threading, for tests without a GPU
 * (tests/test_gpu_nohang.py). It keeps what matters for deadlocks and nothing else:
 *
 * - CUPTI completes a buffer on a thread of its own, holding its own lock while it calls the
 *   registered bufferCompleted callback;
 * - cuptiActivityFlushAll takes that same lock (and completes what is pending on the calling
 *   thread).
 *
 * fake_complete_async(hold_ms) starts such a completion: the worker takes the lock, says it is
 * inside (fake_inside), waits hold_ms, then asks for a buffer and completes it (no records).
 * Built by the test: cc -shared -fPIC -o libcupti_fake.so fake_cupti.c -lpthread
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
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

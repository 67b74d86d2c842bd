/* CUPTI's activity buffers in C: the buffer callbacks, never the GIL, and the walk of records.
 *
 * CUPTI calls bufferCompleted on its own thread while holding its own lock, and
 * cuptiActivityFlushAll takes that lock. A completion callback that needs the GIL (a ctypes or
 * cupti-python callback) therefore deadlocks with any thread that flushes, or makes a CUDA call
 * that waits for that lock, while holding the GIL: seen once in nine ResNet-18 runs under
 * pyrun -t (docs/gpu.md, "No hang"). Here the callbacks only allocate and queue; Python takes
 * the completed buffers (take_buffers) on a thread of its own, and flush_all calls CUPTI with
 * the GIL released.
 *
 * record_offsets() finds where each record of a completed buffer starts, from each kind's
 * record size: records of different kinds alternate in a real model's buffers (kernels,
 * memsets, synchronizations), and a walk in Python costs microseconds per change of kind.
 */
#include "_cuptihook.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct Completed {
    struct Completed *next;
    uint8_t *buffer;
    size_t valid;
} Completed;

typedef int (*register_fn)(void (*)(uint8_t **, size_t *, size_t *),
                           void (*)(void *, uint32_t, uint8_t *, size_t, size_t));
typedef int (*flush_fn)(uint32_t);

static pthread_mutex_t buffers_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t buffers_ready = PTHREAD_COND_INITIALIZER;
static Completed *done_head, *done_tail;
static size_t buffer_bytes = 8u << 20;
static int buffers_woken;
static flush_fn cupti_flush_all;
static uint64_t n_buffers, n_buffers_lost;

static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    void *block = NULL;
    if (posix_memalign(&block, 8, buffer_bytes) != 0)
        block = NULL;
    *buffer = block;
    *size = block != NULL ? buffer_bytes : 0;
    *max_records = 0;
}

static void buffer_completed(void *context, uint32_t stream, uint8_t *buffer, size_t size,
                             size_t valid) {
    (void)context;
    (void)stream;
    (void)size;
    if (buffer == NULL)
        return;
    Completed *item = malloc(sizeof(Completed));
    if (item == NULL) {
        free(buffer);
        __atomic_add_fetch(&n_buffers_lost, 1, __ATOMIC_RELAXED);
        return;
    }
    item->next = NULL;
    item->buffer = buffer;
    item->valid = valid;
    pthread_mutex_lock(&buffers_lock);
    if (done_tail != NULL)
        done_tail->next = item;
    else
        done_head = item;
    done_tail = item;
    n_buffers++;
    pthread_cond_signal(&buffers_ready);
    pthread_mutex_unlock(&buffers_lock);
}

/* Register the C buffer callbacks with libcupti at ``path`` (buffers of ``size`` bytes). */
PyObject *hook_register_buffers(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    unsigned long long size = 8u << 20;
    if (!PyArg_ParseTuple(args, "s|K", &path, &size))
        return NULL;
    if (size < 4096 || size % 8)
        return PyErr_Format(PyExc_ValueError, "bad activity buffer size %llu", size);
    void *library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL)
        library = dlopen(path, RTLD_NOW);
    if (library == NULL)
        return PyErr_Format(PyExc_OSError, "cannot open %s: %s", path, dlerror());
    register_fn do_register = (register_fn)dlsym(library, "cuptiActivityRegisterCallbacks");
    flush_fn flush = (flush_fn)dlsym(library, "cuptiActivityFlushAll");
    if (do_register == NULL || flush == NULL)
        return PyErr_Format(PyExc_OSError, "%s has no cuptiActivityRegisterCallbacks", path);
    buffer_bytes = (size_t)size;
    cupti_flush_all = flush;
    int status = do_register(buffer_requested, buffer_completed);
    if (status != 0)
        return PyErr_Format(PyExc_OSError, "cuptiActivityRegisterCallbacks: CUPTI status %d",
                            status);
    Py_RETURN_NONE;
}

/* The completed buffers as (address, valid bytes), waiting up to ``timeout`` seconds for one
 * (without the GIL). Free each with free_buffer() once read. */
PyObject *hook_take_buffers(PyObject *self, PyObject *args) {
    (void)self;
    double timeout = 0.0;
    if (!PyArg_ParseTuple(args, "|d", &timeout))
        return NULL;
    Completed *taken;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&buffers_lock);
    if (done_head == NULL && timeout > 0 && !buffers_woken) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long long nanos = until.tv_nsec + (long long)(timeout * 1e9);
        until.tv_sec += (time_t)(nanos / 1000000000LL);
        until.tv_nsec = (long)(nanos % 1000000000LL);
        while (done_head == NULL && !buffers_woken)
            if (pthread_cond_timedwait(&buffers_ready, &buffers_lock, &until) != 0)
                break;
    }
    buffers_woken = 0;
    taken = done_head;
    done_head = done_tail = NULL;
    pthread_mutex_unlock(&buffers_lock);
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(0);
    while (taken != NULL) {
        Completed *next = taken->next;
        PyObject *pair = list != NULL ? Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)
                                                      taken->buffer,
                                                      (unsigned long long)taken->valid)
                                      : NULL;
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            free(taken->buffer); /* lost: the error is raised below */
            Py_CLEAR(list);
        }
        Py_XDECREF(pair);
        free(taken);
        taken = next;
    }
    return list;
}

PyObject *hook_free_buffer(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address))
        return NULL;
    free((void *)(uintptr_t)address);
    Py_RETURN_NONE;
}

/* A take_buffers() waiting now returns at once (the buffer thread is asked to stop). */
PyObject *hook_wake_buffers(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    pthread_mutex_lock(&buffers_lock);
    buffers_woken = 1;
    pthread_cond_broadcast(&buffers_ready);
    pthread_mutex_unlock(&buffers_lock);
    Py_RETURN_NONE;
}

/* cuptiActivityFlushAll(flag) with the GIL released: CUPTI's thread may be inside
 * bufferCompleted, holding the lock the flush waits for. */
PyObject *hook_flush_all(PyObject *self, PyObject *args) {
    (void)self;
    unsigned int flag = 1;
    if (!PyArg_ParseTuple(args, "|I", &flag))
        return NULL;
    flush_fn flush = cupti_flush_all;
    if (flush == NULL)
        return PyErr_Format(PyExc_RuntimeError, "register_buffers() was not called");
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = flush(flag);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

/* record_offsets(address, valid, sizes, start=0) -> (offsets, stop): the offset of every record
 * from ``start`` on (bytes of native int64), each record's size taken from ``sizes`` (native
 * uint32 per CUPTI activity kind, 0: not known). The walk stops at the first record of a kind
 * whose size is not known, or that would not fit: ``stop`` is its offset (``valid`` when every
 * record was found). The buffer is read without the GIL. */
PyObject *hook_record_offsets(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address, valid, start = 0;
    Py_buffer sizes;
    if (!PyArg_ParseTuple(args, "KKy*|K", &address, &valid, &sizes, &start))
        return NULL;
    const uint32_t *size_of = sizes.buf;
    size_t kinds = (size_t)sizes.len / sizeof(uint32_t);
    const uint8_t *buffer = (const uint8_t *)(uintptr_t)address;
    size_t capacity = 0;
    if (start < valid) {
        uint32_t smallest = UINT32_MAX;
        for (size_t kind = 0; kind < kinds; kind++)
            if (size_of[kind] >= 8 && size_of[kind] < smallest)
                smallest = size_of[kind];
        capacity = smallest == UINT32_MAX ? 0 : (size_t)((valid - start) / smallest + 1);
    }
    int64_t *offsets = malloc((capacity ? capacity : 1) * sizeof(int64_t));
    if (offsets == NULL) {
        PyBuffer_Release(&sizes);
        return PyErr_NoMemory();
    }
    size_t count = 0, at = (size_t)start;
    Py_BEGIN_ALLOW_THREADS
    while (valid - at >= 8 && count < capacity) {
        uint32_t kind;
        memcpy(&kind, buffer + at, sizeof(kind));
        uint32_t size = kind < kinds ? size_of[kind] : 0;
        if (size < 8 || size % 8 || size > valid - at)
            break;
        offsets[count++] = (int64_t)at;
        at += size;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sizes);
    if (valid - at < 8)
        at = (size_t)valid;
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)offsets,
                                                (Py_ssize_t)(count * sizeof(int64_t)));
    free(offsets);
    if (bytes == NULL)
        return NULL;
    return Py_BuildValue("(NK)", bytes, (unsigned long long)at);
}

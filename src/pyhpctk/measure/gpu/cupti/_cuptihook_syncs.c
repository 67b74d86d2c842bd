/* Synchronizations timed at the API (gpu=nvidia,sync=api): the C hook's own SYNC rows.
 *
 * Why: CUPTI's SYNCHRONIZATION activity kind costs a PyTorch training step about 30 %
 * (H200, benchmarks/cupti_knobs.py: 1.26-1.37x with it, 0.90-1.07x without; docs/gpu.md,
 * "Synchronizations"). The callback API the hook already subscribes to brackets every
 * synchronization call: a CUPTI timestamp once the call's operation is recorded at API entry
 * (hook_sync_enter), another first thing at its exit (hook_sync_exit), and the row that
 * CUPTI's record would have given (type from the API, correlation id of the call, context id,
 * stream id where the API names a stream) goes into the calling thread's ring. The buffer
 * thread takes the rows (take_syncs) and delivers them with CUPTI's next buffer, as CUPTI's
 * own records came.
 *
 * Never Python, never the GIL, no allocation but a new chunk every SYNC_CHUNK rows. Single
 * producer per ring (its thread), consumers serialised by syncs_lock (take_syncs may be called
 * from the buffer thread and from a flush).
 */
#include "_cuptihook.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*timestamp_fn)(uint64_t *);
typedef int (*stream_id_fn)(void *, void *, uint8_t, uint32_t *);

/* The row a synchronization gives (syncapi.SYNC_ROW_DTYPE says the same, as numpy). */
typedef struct {
    uint64_t correlation, start, end;
    uint32_t context, stream;
    uint32_t type, pad;
} SyncRow;

_Static_assert(sizeof(SyncRow) == 40, "syncapi.SYNC_ROW_DTYPE is 40 bytes");

#define SYNC_CHUNK 256
#define SYNC_INVALID 0xFFFFFFFFu   /* CUPTI_SYNCHRONIZATION_INVALID_VALUE: no stream */
#define STREAM_LEGACY ((uintptr_t)1) /* CU_STREAM_LEGACY */
#define STREAM_PER_THREAD ((uintptr_t)2) /* CU_STREAM_PER_THREAD */

typedef struct SyncChunk {
    struct SyncChunk *next; /* published (release) once the producer has moved on */
    uint32_t count;         /* rows written (release by the producer) */
    SyncRow rows[SYNC_CHUNK];
} SyncChunk;

_Static_assert(offsetof(SyncChunk, next) == offsetof(HookChunk, next) &&
                   offsetof(SyncChunk, count) == offsetof(HookChunk, count),
               "a SyncChunk starts with a HookChunk");

typedef struct SyncRing {
    SyncChunk *head;        /* consumer */
    uint32_t read;          /* consumer: rows taken from head */
    SyncChunk *tail;        /* producer */
    int dead;               /* the thread ended (release): the consumer frees the ring */
    struct SyncRing *next;  /* the list of rings (under syncs_lock) */
} SyncRing;

/* [domain][cbid]: 0 no row; else SYNC_ROW | type | SYNC_STREAM_ARG? | SYNC_PER_THREAD? */
#define SYNC_ROW 0x80
#define SYNC_STREAM_ARG 0x08  /* the call's first parameter is a stream */
#define SYNC_PER_THREAD 0x10  /* a _ptsz/_ptds variant: the NULL stream is the thread's own */
#define SYNC_TYPE_MASK 0x07

static uint8_t sync_table[3][4096];
static timestamp_fn get_timestamp;
static stream_id_fn get_stream_id;
static pthread_key_t sync_key;
static pthread_mutex_t syncs_lock = PTHREAD_MUTEX_INITIALIZER;
static SyncRing *sync_rings;
static uint64_t n_rows, n_rows_lost;

static uint64_t now_ns(void) {
    uint64_t stamp = 0;
    if (get_timestamp != NULL && get_timestamp(&stamp) == 0)
        return stamp;
    /* without libcupti (tests): the epoch clock in ns, as CUPTI's own timestamps are */
    struct timespec clock;
    clock_gettime(CLOCK_REALTIME, &clock);
    return (uint64_t)clock.tv_sec * 1000000000u + (uint64_t)clock.tv_nsec;
}

static void sync_ring_ended(void *value) {
    hook_cache.sync_ring = NULL;
    __atomic_store_n(&((SyncRing *)value)->dead, 1, __ATOMIC_RELEASE);
}

static SyncRing *sync_ring(void) {
    if (hook_cache.sync_ring != NULL)
        return hook_cache.sync_ring;
    SyncRing *ring = calloc(1, sizeof(SyncRing));
    SyncChunk *chunk = calloc(1, sizeof(SyncChunk));
    if (ring == NULL || chunk == NULL) {
        free(ring);
        free(chunk);
        return NULL;
    }
    ring->head = ring->tail = chunk;
    pthread_mutex_lock(&syncs_lock);
    ring->next = sync_rings;
    sync_rings = ring;
    pthread_mutex_unlock(&syncs_lock);
    pthread_setspecific(sync_key, ring);
    hook_cache.sync_ring = ring;
    return ring;
}

static void push_row(const SyncRow *row) {
    SyncRing *ring = sync_ring();
    if (ring == NULL) {
        __atomic_add_fetch(&n_rows_lost, 1, __ATOMIC_RELAXED);
        return;
    }
    SyncChunk *tail = ring->tail;
    uint32_t count = tail->count; /* only this thread writes it */
    if (count == SYNC_CHUNK) {
        SyncChunk *fresh = calloc(1, sizeof(SyncChunk));
        if (fresh == NULL) {
            __atomic_add_fetch(&n_rows_lost, 1, __ATOMIC_RELAXED);
            return;
        }
        __atomic_store_n(&tail->next, fresh, __ATOMIC_RELEASE);
        ring->tail = tail = fresh;
        count = 0;
    }
    tail->rows[count] = *row;
    __atomic_store_n(&tail->count, count + 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&n_rows, 1, __ATOMIC_RELAXED);
}

int hook_sync_wanted(int domain, uint32_t cbid) {
    return domain >= 0 && domain < 3 && cbid < 4096 && sync_table[domain][cbid] != 0;
}

void hook_sync_enter(uint64_t correlation) {
    hook_cache.sync_correlation = correlation;
    hook_cache.sync_start = now_ns();
}

/* The stream id CUPTI's record names (SYNC_INVALID where the API has none or CUPTI says no). */
static uint32_t stream_of(uint8_t entry, const CallbackData *call) {
    if (!(entry & SYNC_STREAM_ARG) || call->functionParams == NULL)
        return SYNC_INVALID;
    void *stream = *(void *const *)call->functionParams; /* {stream, ...}: the params struct */
    if (get_stream_id == NULL) /* without libcupti (tests): the handle is the id */
        return (uint32_t)(uintptr_t)stream;
    uint8_t per_thread = (entry & SYNC_PER_THREAD) != 0;
    if ((uintptr_t)stream == STREAM_LEGACY || (uintptr_t)stream == STREAM_PER_THREAD) {
        per_thread = (uintptr_t)stream == STREAM_PER_THREAD;
        stream = NULL;
    }
    uint32_t id = SYNC_INVALID;
    if (get_stream_id(call->context, stream, per_thread, &id) != 0)
        return SYNC_INVALID;
    return id;
}

void hook_sync_exit(int domain, uint32_t cbid, const CallbackData *call) {
    uint64_t end = now_ns();
    ThreadCache *cache = &hook_cache;
    if (cache->sync_correlation == 0 || cache->sync_correlation != call->correlationId)
        return; /* its entry was not ours (subscribed in between, or a nested call) */
    cache->sync_correlation = 0;
    uint8_t entry = sync_table[domain][cbid];
    SyncRow row = {0};
    row.correlation = call->correlationId;
    row.start = cache->sync_start;
    row.end = end;
    row.context = call->contextUid;
    row.stream = stream_of(entry, call);
    row.type = entry & SYNC_TYPE_MASK;
    push_row(&row);
}

/* -- Python interface ---------------------------------------------------------------------- */

/* sync_apis(entries): (domain, cbid, type, stream_arg, per_thread) of each API that gives a
 * row; after configure() (which forgets them), before subscribe(). */
PyObject *hook_sync_apis(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *entries;
    if (!PyArg_ParseTuple(args, "O", &entries))
        return NULL;
    uint8_t table[3][4096];
    memset(table, 0, sizeof(table));
    PyObject *iterator = PyObject_GetIter(entries);
    if (iterator == NULL)
        return NULL;
    PyObject *item;
    while ((item = PyIter_Next(iterator)) != NULL) {
        int domain, type, stream_arg, per_thread;
        unsigned int cbid;
        int ok = PyArg_ParseTuple(item, "iIiii", &domain, &cbid, &type, &stream_arg, &per_thread);
        Py_DECREF(item);
        if (!ok) {
            Py_DECREF(iterator);
            return NULL;
        }
        if (domain < DOMAIN_API_FIRST || domain > DOMAIN_API_LAST || cbid >= 4096 || type < 0 ||
            type > SYNC_TYPE_MASK) {
            Py_DECREF(iterator);
            return PyErr_Format(PyExc_ValueError, "bad sync entry (%d, %u, %d)", domain, cbid,
                                type);
        }
        table[domain][cbid] = (uint8_t)(SYNC_ROW | type | (stream_arg ? SYNC_STREAM_ARG : 0) |
                                        (per_thread ? SYNC_PER_THREAD : 0));
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred())
        return NULL;
    memcpy(sync_table, table, sizeof(table));
    Py_RETURN_NONE;
}

/* Every row since the last call: bytes of SyncRow (syncapi.SYNC_ROW_DTYPE). */
PyObject *hook_take_syncs(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    HookTaken out = {malloc(64 * sizeof(SyncRow)), 0, 64};
    if (out.data == NULL)
        return PyErr_NoMemory();
    pthread_mutex_lock(&syncs_lock);
    SyncRing **link = &sync_rings;
    while (*link != NULL) {
        SyncRing *ring = *link;
        int dead = __atomic_load_n(&ring->dead, __ATOMIC_ACQUIRE);
        if (hook_take_chunks((HookChunk **)&ring->head, &ring->read, sizeof(SyncRow),
                             offsetof(SyncChunk, rows), &out) != 0) {
            pthread_mutex_unlock(&syncs_lock);
            free(out.data);
            return PyErr_NoMemory();
        }
        if (dead) {
            *link = ring->next;
            free(ring->head);
            free(ring);
        } else {
            link = &ring->next;
        }
    }
    pthread_mutex_unlock(&syncs_lock);
    PyObject *result = PyBytes_FromStringAndSize(out.data, out.used * sizeof(SyncRow));
    free(out.data);
    return result;
}

/* sync_stats() -> (rows made, rows lost for want of memory). */
PyObject *hook_sync_stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(KK)", (unsigned long long)__atomic_load_n(&n_rows, __ATOMIC_RELAXED),
                         (unsigned long long)__atomic_load_n(&n_rows_lost, __ATOMIC_RELAXED));
}

/* -- the rest of the hook's life ----------------------------------------------------------- */

int hook_sync_init(void) {
    return pthread_key_create(&sync_key, sync_ring_ended);
}

void hook_sync_bind(void *library) {
    get_timestamp = (timestamp_fn)dlsym(library, "cuptiGetTimestamp");
    get_stream_id = (stream_id_fn)dlsym(library, "cuptiGetStreamIdEx");
}

void hook_sync_forget(void) { /* configure(), reset(), a forked child: no API gives rows */
    memset(sync_table, 0, sizeof(sync_table));
}

void hook_sync_reset(void) { /* libcupti is bound again at the next subscribe() */
    hook_sync_forget();
    get_timestamp = NULL;
    get_stream_id = NULL;
    PyObject *stale = hook_take_syncs(NULL, NULL); /* rows of the old configuration: dropped */
    Py_XDECREF(stale);
    if (stale == NULL)
        PyErr_Clear();
    __atomic_store_n(&n_rows, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&n_rows_lost, 0, __ATOMIC_RELAXED);
}

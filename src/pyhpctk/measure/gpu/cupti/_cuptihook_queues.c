/* What the callback hands to the monitor thread, and how the monitor takes it: each thread's
 * operations, and the loaded modules (cubins).
 *
 * - Operations: the fast path of _cuptihook.c pushes (correlation id, token) pairs into the
 *   calling thread's own chunk list (hook_push); drain() on the monitor thread takes every
 *   thread's new pairs and frees the lists of threads that ended, with the code objects their
 *   site caches held. hook_take_chunks is the walk of one chunk list, shared with the
 *   synchronization rows of _cuptihook_syncs.c.
 * - Modules: MODULE_LOADED copies the cubin into a queue (hook_queue_module); take_modules()
 *   takes them on the monitor thread.
 *
 * Single producer (the application thread), single consumer (the monitor thread's drain()):
 * each thread's chunks are published with release stores and read with acquire loads; the
 * list of threads is guarded by a mutex taken once per new thread and once per drain.
 */
#include "_cuptihook.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* -- per-thread operation chunks ----------------------------------------------------------- */

typedef struct {
    uint64_t correlation;
    int64_t token;
} Record;

#define CHUNK_RECORDS 4096

typedef struct Chunk {
    struct Chunk *next; /* published (release) once the producer has moved on */
    uint32_t count;     /* records written (release by the producer) */
    uint32_t pad;
    Record records[CHUNK_RECORDS];
} Chunk;

_Static_assert(offsetof(Chunk, next) == offsetof(HookChunk, next) &&
                   offsetof(Chunk, count) == offsetof(HookChunk, count),
               "a Chunk starts with a HookChunk");

struct Ring {
    Chunk *head;        /* consumer */
    uint32_t read;      /* consumer: records taken from head */
    Chunk *tail;        /* producer */
    int dead;           /* the thread ended (release); the consumer frees the ring */
    int nheld;          /* the dead thread's cached references (code objects), */
    PyObject **held;    /* released by the consumer, which holds the GIL */
    struct Ring *next;  /* the list of rings (under rings_lock) */
};

static pthread_key_t ring_key;
static pthread_mutex_t rings_lock = PTHREAD_MUTEX_INITIALIZER;
static Ring *rings;

/* -- producer side ------------------------------------------------------------------------- */

static void ring_destructor(void *value) {
    Ring *ring = (Ring *)value;
    /* No GIL here: the references go to the consumer, which releases them. */
    ring->held = hook_surrender(&ring->nheld);
    hook_cache.ring = NULL;
    __atomic_store_n(&ring->dead, 1, __ATOMIC_RELEASE);
}

Ring *hook_thread_ring(void) {
    if (hook_cache.ring != NULL)
        return hook_cache.ring;
    Ring *ring = calloc(1, sizeof(Ring));
    Chunk *chunk = calloc(1, sizeof(Chunk));
    if (ring == NULL || chunk == NULL) {
        free(ring);
        free(chunk);
        return NULL;
    }
    ring->head = ring->tail = chunk;
    pthread_mutex_lock(&rings_lock);
    ring->next = rings;
    rings = ring;
    pthread_mutex_unlock(&rings_lock);
    pthread_setspecific(ring_key, ring);
    hook_cache.ring = ring;
    return ring;
}

void hook_push(uint64_t correlation, int64_t token) {
    Ring *ring = hook_thread_ring();
    if (ring == NULL) {
        COUNT(lost);
        return;
    }
    Chunk *tail = ring->tail;
    uint32_t count = tail->count; /* only this thread writes it */
    if (count == CHUNK_RECORDS) {
        Chunk *fresh = calloc(1, sizeof(Chunk));
        if (fresh == NULL) {
            COUNT(lost);
            return;
        }
        __atomic_store_n(&tail->next, fresh, __ATOMIC_RELEASE);
        ring->tail = tail = fresh;
        count = 0;
    }
    tail->records[count].correlation = correlation;
    tail->records[count].token = token;
    __atomic_store_n(&tail->count, count + 1, __ATOMIC_RELEASE);
}

/* -- consumer side ------------------------------------------------------------------------- */

int hook_take_chunks(HookChunk **head, uint32_t *read, size_t item, size_t offset,
                     HookTaken *out) {
    for (;;) {
        HookChunk *chunk = *head;
        uint32_t count = __atomic_load_n(&chunk->count, __ATOMIC_ACQUIRE);
        if (count > *read) {
            size_t take = count - *read;
            if (out->used + take > out->capacity) {
                size_t capacity = out->capacity;
                while (out->used + take > capacity)
                    capacity *= 2;
                char *grown = realloc(out->data, capacity * item);
                if (grown == NULL)
                    return -1;
                out->data = grown;
                out->capacity = capacity;
            }
            memcpy(out->data + out->used * item, (char *)chunk + offset + *read * item,
                   take * item);
            out->used += take;
            *read = count;
        }
        HookChunk *next = __atomic_load_n(&chunk->next, __ATOMIC_ACQUIRE);
        if (next == NULL)
            return 0;
        if (__atomic_load_n(&chunk->count, __ATOMIC_ACQUIRE) != *read)
            continue; /* written just before the move: take those first */
        *head = next;
        *read = 0;
        free(chunk);
    }
}

/* Every operation the fast path recorded since the last drain: bytes of (u64, i64) pairs. */
PyObject *hook_drain(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    HookTaken out = {malloc(4096 * sizeof(Record)), 0, 4096};
    if (out.data == NULL)
        return PyErr_NoMemory();
    PyObject *released = NULL;
    pthread_mutex_lock(&rings_lock);
    Ring **link = &rings;
    while (*link != NULL) {
        Ring *ring = *link;
        int dead = __atomic_load_n(&ring->dead, __ATOMIC_ACQUIRE);
        if (hook_take_chunks((HookChunk **)&ring->head, &ring->read, sizeof(Record),
                             offsetof(Chunk, records), &out) != 0) {
            pthread_mutex_unlock(&rings_lock);
            free(out.data);
            return PyErr_NoMemory();
        }
        if (dead) {
            *link = ring->next;
            for (int i = 0; i < ring->nheld; i++) {
                if (released == NULL)
                    released = PyList_New(0);
                if (released != NULL) /* freed after the lock: a finaliser may call CUDA */
                    PyList_Append(released, ring->held[i]);
                Py_DECREF(ring->held[i]);
            }
            free(ring->held);
            free(ring->head);
            free(ring);
        } else {
            link = &ring->next;
        }
    }
    pthread_mutex_unlock(&rings_lock);
    Py_XDECREF(released);
    PyObject *result = PyBytes_FromStringAndSize(out.data, out.used * sizeof(Record));
    free(out.data);
    return result;
}

/* -- module queue -------------------------------------------------------------------------- */

typedef struct Module {
    struct Module *next;
    size_t size;
    char data[];
} Module;

static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;
static Module *modules_head, *modules_tail;

void hook_queue_module(const ResourceData *resource) {
    const ModuleResourceData *module = resource ? resource->resourceDescriptor : NULL;
    if (module == NULL || module->pCubin == NULL || module->cubinSize == 0)
        return;
    Module *copy = malloc(sizeof(Module) + module->cubinSize);
    if (copy == NULL) {
        COUNT(lost);
        return;
    }
    copy->next = NULL;
    copy->size = module->cubinSize;
    memcpy(copy->data, module->pCubin, module->cubinSize);
    pthread_mutex_lock(&modules_lock);
    if (modules_tail)
        modules_tail->next = copy;
    else
        modules_head = copy;
    modules_tail = copy;
    pthread_mutex_unlock(&modules_lock);
    COUNT(modules);
}

PyObject *hook_take_modules(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    pthread_mutex_lock(&modules_lock);
    Module *module = modules_head;
    modules_head = modules_tail = NULL;
    pthread_mutex_unlock(&modules_lock);
    PyObject *list = PyList_New(0);
    while (module != NULL) {
        Module *next = module->next;
        if (list != NULL) {
            PyObject *bytes = PyBytes_FromStringAndSize(module->data, (Py_ssize_t)module->size);
            if (bytes == NULL || PyList_Append(list, bytes) < 0)
                Py_CLEAR(list);
            Py_XDECREF(bytes);
        }
        free(module);
        module = next;
    }
    return list;
}

/* At import: the key whose destructor hands a dead thread's ring to the consumer. */
int hook_queues_init(void) {
    return pthread_key_create(&ring_key, ring_destructor);
}

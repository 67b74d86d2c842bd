/* The CUPTI callback of pyrun's GPU layer, in C (pyhpctk.measure.gpu._cuptihook).
 *
 * Why C: a CUPTI callback that enters Python costs several microseconds per API call (the
 * bindings build an object for every call, entry and exit), more than a small kernel launch
 * itself; and a Python callback that runs while the driver holds its module lock can deadlock
 * with a thread that holds the GIL and waits for that lock. Here:
 *
 * - API entry of a GPU operation (launch, copy, memset, sync, alloc, free): the calling thread
 *   looks up its call site (Site, below: the program's frames down to an anchor) among the
 *   sites it remembers. A known site with a token for this kind, in the current epoch: the
 *   operation (correlation id, token) goes into the thread's own lock-free chunk list and no
 *   Python runs at all. Otherwise the Python slow path (GpuMonitor.operation_token) unwinds,
 *   records the operation itself and returns the token to remember (-1: none).
 * - MODULE_LOADED: the cubin is copied into a queue; Python takes it on the monitor thread.
 * - Everything else the Python side asked for (PC sampling needs context creation and kernel
 *   exits) goes to a Python callable, with the GIL.
 *
 * Single producer (the application thread), single consumer (the monitor thread's drain()):
 * each thread's chunks are published with release stores and read with acquire loads; the
 * list of threads is guarded by a mutex taken once per new thread and once per drain.
 *
 * No CUDA header is needed: the few CUPTI declarations used are written out below
 * (cupti_callbacks.h, CUDA 11-13; x86-64 and AArch64 layouts are the same).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030B0000
#error "pyhpctk needs Python 3.11 or newer"
#endif

/* -- CUPTI declarations (cupti_callbacks.h) ------------------------------------------------ */

typedef struct {
    int callbackSite; /* CUpti_ApiCallbackSite: 0 = enter, 1 = exit */
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} CallbackData;

typedef struct {
    void *context;
    void *resourceHandle;
    void *resourceDescriptor;
} ResourceData;

typedef struct {
    uint32_t moduleId;
    size_t cubinSize;
    const char *pCubin;
} ModuleResourceData;

/* cupti_callbacks.h: CUpti_GraphData, the resource descriptor of the graph callbacks. */
typedef struct {
    void *graph;
    void *originalGraph;
    void *node;
    void *originalNode;
    int nodeType;
    void *dependency;
    void *graphExec;
} GraphData;

typedef void (*callback_fn)(void *, int, uint32_t, const void *);
typedef int (*graph_node_id_fn)(void *, uint64_t *);
typedef int (*subscribe_fn)(void **, callback_fn, void *);
typedef int (*enable_fn)(uint32_t, void *, int, uint32_t);
typedef int (*unsubscribe_fn)(void *);

enum { DOMAIN_RUNTIME = 1, DOMAIN_DRIVER = 2, DOMAIN_RESOURCE = 3 };
#define MAX_CBID 4096
#define KIND_MASK 0x0f
#define MULTI_FLAG 0x10
#define NKINDS 16
#define MAXCHAIN 48 /* frames compared by (code, instruction) above a site's anchor frame */
#define NWAYS 4     /* call sites remembered per thread: sets of NWAYS, chosen by the top frame's */
#define NSETS 16    /* code and instruction (one wrapper called from several places: several ways) */
#define NSITES (NWAYS * NSETS)
#define KIND_GRAPH_NODE 8           /* activity.GRAPH_NODE: a graph node made at this site */
#define NODE_TAG (1ULL << 63)       /* operations.NODE_TAG: the correlation is a node's id */
#define CLONE_TAG (1ULL << 62)      /* operations.CLONE_TAG: clone id, token = original id */

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

typedef struct Ring {
    Chunk *head;        /* consumer */
    uint32_t read;      /* consumer: records taken from head */
    Chunk *tail;        /* producer */
    int dead;           /* the thread ended (release); the consumer frees the ring */
    int nheld;          /* the dead thread's cached references (frames, code objects), */
    PyObject **held;    /* released by the consumer, which holds the GIL */
    struct Ring *next;  /* the list of rings (under rings_lock) */
} Ring;

/* One call site: the program's frames from the top down to the anchor. The first chain_len
 * frames are compared by code object and instruction (a library's Python wrapper or a model's
 * forward gets a new frame object at every call); the anchor, the frame below them (the
 * stack's bottom, or MAXCHAIN frames down), is compared by identity: it is held by
 * reference, so no other frame can take its address, and it is never a generator's or a
 * coroutine's (whose callers change). The same frames, code objects and instructions down to
 * the same live anchor mean the same Python calling context. No frame above the anchor is
 * held: their locals (tensors, arrays) are freed when they return. */
typedef struct {
    int used;
    int64_t epoch;
    int chain_len;
    PyObject *chain_code[MAXCHAIN];
    int chain_lasti[MAXCHAIN];
    PyObject *anchor;
    int anchor_lasti;
    int64_t token[NKINDS];  /* per kind: the token for this site, -1 unknown */
} Site;

typedef struct {
    int busy;               /* inside the Python slow path: nested calls are not re-entered */
    PyObject *code;         /* the last code object looked at, and whether it is skipped */
    int code_skipped;
    int frameless_ready;    /* a thread without Python frames: one site */
    int64_t frameless_epoch;
    int64_t frameless_token[NKINDS];
    Site sites[NSITES];
    uint8_t victim[NSETS];  /* per set: the way to replace next */
    Ring *ring;
} ThreadCache;

static __thread ThreadCache cache;
static pthread_key_t ring_key;
static pthread_mutex_t rings_lock = PTHREAD_MUTEX_INITIALIZER;
static Ring *rings;

/* -- module queue -------------------------------------------------------------------------- */

typedef struct Module {
    struct Module *next;
    size_t size;
    char data[];
} Module;

static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;
static Module *modules_head, *modules_tail;

/* -- configuration (written by start() with the GIL, before the subscription) -------------- */

static uint8_t table[3][MAX_CBID]; /* [domain][cbid] → kind | MULTI_FLAG, 0: not ours */
static uint8_t exit_wanted[3][MAX_CBID];
static uint32_t module_loaded_cbid = UINT32_MAX;
static uint32_t context_created_cbid = UINT32_MAX;
static uint32_t graph_created_cbid = UINT32_MAX, graph_cloned_cbid = UINT32_MAX;
static graph_node_id_fn get_graph_node_id;
static PyObject *skip_prefix; /* frames of files under it are pyhpctk's own: looked through */
static PyObject *slow_path;  /* (kind, correlation, multi) -> token */
static PyObject *every_call; /* (domain, cbid, site, correlation, context) -> None, or NULL */
static int64_t epoch;
static void *subscriber;
static unsubscribe_fn cupti_unsubscribe;
static uint64_t n_fast, n_slow, n_nested, n_errors, n_modules, n_lost, n_chain;

/* -- producer side ------------------------------------------------------------------------- */

static void ring_destructor(void *value) {
    Ring *ring = (Ring *)value;
    /* No GIL here: the references go to the consumer, which releases them. */
    int total = 1;
    for (int i = 0; i < NSITES; i++)
        if (cache.sites[i].used)
            total += cache.sites[i].chain_len + 1;
    ring->held = calloc((size_t)total, sizeof(PyObject *));
    int n = 0;
    if (ring->held != NULL) {
        if (cache.code != NULL)
            ring->held[n++] = cache.code;
        for (int i = 0; i < NSITES; i++) {
            Site *site = &cache.sites[i];
            if (!site->used)
                continue;
            for (int k = 0; k < site->chain_len; k++)
                ring->held[n++] = site->chain_code[k];
            if (site->anchor != NULL)
                ring->held[n++] = site->anchor;
            site->used = 0;
        }
    }
    ring->nheld = n;
    cache.code = NULL;
    __atomic_store_n(&ring->dead, 1, __ATOMIC_RELEASE);
}

static Ring *thread_ring(void) {
    if (cache.ring != NULL)
        return cache.ring;
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
    cache.ring = ring;
    return ring;
}

static void push(uint64_t correlation, int64_t token) {
    Ring *ring = thread_ring();
    if (ring == NULL) {
        __atomic_add_fetch(&n_lost, 1, __ATOMIC_RELAXED);
        return;
    }
    Chunk *tail = ring->tail;
    uint32_t count = tail->count; /* only this thread writes it */
    if (count == CHUNK_RECORDS) {
        Chunk *fresh = calloc(1, sizeof(Chunk));
        if (fresh == NULL) {
            __atomic_add_fetch(&n_lost, 1, __ATOMIC_RELAXED);
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

static void clear_site(Site *site) {
    for (int i = 0; i < site->chain_len; i++)
        Py_CLEAR(site->chain_code[i]);
    Py_CLEAR(site->anchor);
    site->chain_len = 0;
    site->used = 0;
}

static int site_set(PyObject *code, int lasti) {
    uintptr_t key = ((uintptr_t)code >> 4) ^ ((uintptr_t)lasti * 0x9E3779B1u);
    key ^= key >> 17;
    return (int)(key & (NSETS - 1));
}

/* With the GIL: does the stack from ``frame`` down match ``site``? */
static int site_matches(Site *site, PyObject *frame) {
    if (!site->used)
        return 0;
    PyFrameObject *walk = (PyFrameObject *)frame;
    Py_INCREF(walk);
    int ok = 1;
    for (int i = 0; i < site->chain_len; i++) {
        PyCodeObject *code = PyFrame_GetCode(walk);
        ok = (PyObject *)code == site->chain_code[i] &&
             PyFrame_GetLasti(walk) == site->chain_lasti[i];
        Py_DECREF(code);
        if (!ok)
            break;
        PyFrameObject *back = PyFrame_GetBack(walk);
        Py_DECREF(walk);
        walk = back;
        if (walk == NULL) {
            ok = 0;
            break;
        }
    }
    if (ok)
        ok = (PyObject *)walk == site->anchor && PyFrame_GetLasti(walk) == site->anchor_lasti;
    Py_XDECREF(walk);
    return ok;
}

/* With the GIL: make ``site`` the stack from ``frame`` down (0: not cacheable). */
static int build_site(Site *site, PyObject *frame, int64_t now) {
    clear_site(site);
    PyFrameObject *walk = (PyFrameObject *)frame;
    Py_INCREF(walk);
    int n = 0;
    for (;;) {
        PyFrameObject *back = n < MAXCHAIN ? PyFrame_GetBack(walk) : NULL;
        if (back == NULL) { /* walk is the anchor */
            PyCodeObject *code = PyFrame_GetCode(walk);
            int resumable = code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR);
            Py_DECREF(code);
            site->chain_len = n;
            if (resumable) {
                Py_DECREF(walk);
                clear_site(site);
                return 0;
            }
            site->anchor = (PyObject *)walk;
            site->anchor_lasti = PyFrame_GetLasti(walk);
            break;
        }
        site->chain_code[n] = (PyObject *)PyFrame_GetCode(walk);
        site->chain_lasti[n] = PyFrame_GetLasti(walk);
        n++;
        Py_DECREF(walk);
        walk = back;
    }
    site->used = 1;
    site->epoch = now;
    for (int k = 0; k < NKINDS; k++)
        site->token[k] = -1;
    return 1;
}

/* With the GIL: is this frame pyhpctk's own (under skip_prefix)? One answer per code object. */
static int skipped(PyFrameObject *frame) {
    if (skip_prefix == NULL)
        return 0;
    PyCodeObject *code = PyFrame_GetCode(frame);
    int answer;
    if ((PyObject *)code == cache.code) {
        answer = cache.code_skipped;
    } else {
        answer = PyUnicode_Tailmatch(code->co_filename, skip_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
        PyErr_Clear();
        Py_INCREF(code);
        Py_XSETREF(cache.code, (PyObject *)code);
        cache.code_skipped = answer;
    }
    Py_DECREF(code);
    return answer;
}

/* With the GIL: a new reference to the program's innermost frame (NULL: none). */
static PyObject *program_frame(void) {
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    while (frame != NULL && skipped(frame)) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    return (PyObject *)frame;
}

/* With the GIL: the Python slow path for this operation; returns its token (-1: none). */
static long long call_slow(int kind, int multi, uint64_t correlation) {
    PyObject *callable = slow_path;
    if (callable == NULL)
        return -1;
    thread_ring(); /* registers the thread-exit destructor that releases the cache */
    cache.busy = 1;
    PyObject *result = PyObject_CallFunction(callable, "iKi", kind,
                                             (unsigned long long)correlation, multi);
    cache.busy = 0;
    __atomic_add_fetch(&n_slow, 1, __ATOMIC_RELAXED);
    if (result == NULL) {
        __atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
        PyErr_WriteUnraisable(callable);
        return -1;
    }
    long long token = PyLong_AsLongLong(result);
    Py_DECREF(result);
    if (token == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        token = -1;
    }
    return token;
}

/* A thread without Python frames: its one site's token, pushed (1), or not known yet (0). */
static int frameless_hit(int kind, uint64_t correlation, int64_t now) {
    if (!cache.frameless_ready || cache.frameless_epoch != now || cache.frameless_token[kind] < 0)
        return 0;
    push(correlation, cache.frameless_token[kind]);
    __atomic_add_fetch(&n_fast, 1, __ATOMIC_RELAXED);
    return 1;
}

/* With the GIL: the slow path of a thread without Python frames; caches its token. */
static void frameless_slow(int kind, int multi, uint64_t correlation, int64_t now) {
    long long token = call_slow(kind, multi, correlation);
    if (!cache.frameless_ready || cache.frameless_epoch != now) {
        cache.frameless_ready = 1;
        cache.frameless_epoch = now;
        for (int k = 0; k < NKINDS; k++)
            cache.frameless_token[k] = -1;
    }
    cache.frameless_token[kind] = token;
}

static void call_every(int domain, uint32_t cbid, int site, uint64_t correlation, void *ctx) {
    PyObject *callable = every_call;
    if (callable == NULL || cache.busy)
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    cache.busy = 1;
    PyObject *result = PyObject_CallFunction(callable, "iIiKK", domain, cbid, site,
                                             (unsigned long long)correlation,
                                             (unsigned long long)(uintptr_t)ctx);
    cache.busy = 0;
    if (result == NULL) {
        __atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
        PyErr_WriteUnraisable(callable);
    } else {
        Py_DECREF(result);
    }
    PyGILState_Release(gil);
}

static void queue_module(const ResourceData *resource) {
    const ModuleResourceData *module = resource ? resource->resourceDescriptor : NULL;
    if (module == NULL || module->pCubin == NULL || module->cubinSize == 0)
        return;
    Module *copy = malloc(sizeof(Module) + module->cubinSize);
    if (copy == NULL) {
        __atomic_add_fetch(&n_lost, 1, __ATOMIC_RELAXED);
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
    __atomic_add_fetch(&n_modules, 1, __ATOMIC_RELAXED);
}

static void record_operation(int kind, int multi, uint64_t correlation);

/* A CUDA graph node's id (cuptiGetGraphNodeId; without libcupti, as in tests, the handle). */
static uint64_t node_id(void *node) {
    uint64_t id = 0;
    if (node == NULL)
        return 0;
    if (get_graph_node_id == NULL)
        return (uint64_t)(uintptr_t)node;
    return get_graph_node_id(node, &id) == 0 ? id : 0;
}

/* GRAPHNODE_CREATED: the node is made here (a stream capture inside the captured launch, or an
 * add), recorded as an operation of kind GRAPH_NODE at this site, its id tagged. CLONED (an
 * instantiation): clone → original, no Python. */
static void graph_node(const ResourceData *resource, int cloned) {
    const GraphData *graph = resource != NULL ? resource->resourceDescriptor : NULL;
    if (graph == NULL || cache.busy || every_call != NULL)
        return;
    uint64_t node = node_id(graph->node);
    if (node == 0 || node >= CLONE_TAG)
        return;
    if (cloned) {
        uint64_t original = node_id(graph->originalNode);
        if (original != 0 && original < CLONE_TAG)
            push(node | CLONE_TAG, (int64_t)original);
        return;
    }
    record_operation(KIND_GRAPH_NODE, 0, node | NODE_TAG);
}

static void on_callback(void *userdata, int domain, uint32_t cbid, const void *data) {
    (void)userdata;
    if (!Py_IsInitialized())
        return; /* the interpreter is gone (a CUDA call during process teardown) */
    if (domain == DOMAIN_RESOURCE) {
        if (cbid == graph_created_cbid || cbid == graph_cloned_cbid)
            graph_node((const ResourceData *)data, cbid == graph_cloned_cbid);
        else if (cbid == module_loaded_cbid)
            queue_module((const ResourceData *)data);
        else if (cbid == context_created_cbid && every_call != NULL)
            call_every(domain, cbid, 0, 0, data ? ((const ResourceData *)data)->context : NULL);
        return;
    }
    if (domain < DOMAIN_RUNTIME || domain > DOMAIN_DRIVER || cbid >= MAX_CBID || data == NULL)
        return;
    uint8_t entry = table[domain][cbid];
    if (entry == 0)
        return;
    const CallbackData *call = (const CallbackData *)data;
    if (call->callbackSite != 0) {
        if (exit_wanted[domain][cbid])
            call_every(domain, cbid, call->callbackSite, call->correlationId, call->context);
        return;
    }
    if (every_call != NULL) {
        call_every(domain, cbid, 0, call->correlationId, call->context);
        return;
    }
    if (cache.busy) { /* a GPU call made by the slow path itself */
        __atomic_add_fetch(&n_nested, 1, __ATOMIC_RELAXED);
        return;
    }
    record_operation(entry & KIND_MASK, (entry & MULTI_FLAG) != 0, call->correlationId);
}

/* An operation of ``kind`` made on the calling thread: known site → pushed without Python;
 * else the Python slow path unwinds and returns the site's token. */
static void record_operation(int kind, int multi, uint64_t correlation) {
    int64_t now = __atomic_load_n(&epoch, __ATOMIC_ACQUIRE);
    if (PyGILState_GetThisThreadState() == NULL) {
        /* A thread Python has never seen (a runtime's C++ worker): no frames, one site. */
        if (frameless_hit(kind, correlation, now))
            return;
        PyGILState_STATE gil = PyGILState_Ensure();
        frameless_slow(kind, multi, correlation, now);
        PyGILState_Release(gil);
        return;
    }
    int held = PyGILState_Check();
    PyGILState_STATE gil = PyGILState_LOCKED;
    if (!held)
        gil = PyGILState_Ensure();
    PyObject *frame = program_frame();
    if (frame == NULL) { /* a Python thread state, no Python frame: the frameless site */
        if (!frameless_hit(kind, correlation, now))
            frameless_slow(kind, multi, correlation, now);
    } else {
        PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)frame);
        int set = site_set((PyObject *)code, PyFrame_GetLasti((PyFrameObject *)frame));
        Py_DECREF(code);
        Site *ways = &cache.sites[set * NWAYS];
        Site *site = NULL;
        for (int way = 0; way < NWAYS && site == NULL; way++)
            if (site_matches(&ways[way], frame))
                site = &ways[way];
        int matches = site != NULL;
        if (site == NULL) { /* a free way, else the next in turn */
            for (int way = 0; way < NWAYS && site == NULL; way++)
                if (!ways[way].used)
                    site = &ways[way];
            if (site == NULL) {
                site = &ways[cache.victim[set]];
                cache.victim[set] = (uint8_t)((cache.victim[set] + 1) % NWAYS);
            }
        }
        if (matches && site->epoch == now && site->token[kind] >= 0) {
            push(correlation, site->token[kind]);
            __atomic_add_fetch(&n_fast, 1, __ATOMIC_RELAXED);
            if (site->chain_len)
                __atomic_add_fetch(&n_chain, 1, __ATOMIC_RELAXED);
        } else {
            long long token = call_slow(kind, multi, correlation);
            if (!matches) {
                matches = build_site(site, frame, now);
            } else if (site->epoch != now) {
                site->epoch = now;
                for (int k = 0; k < NKINDS; k++)
                    site->token[k] = -1;
            }
            if (matches)
                site->token[kind] = token;
        }
        Py_DECREF(frame);
    }
    if (!held)
        PyGILState_Release(gil);
}

/* -- activity buffers: CUPTI's buffer callbacks, never the GIL ---------------------------- */

/* CUPTI calls bufferCompleted on its own thread while holding its own lock, and
 * cuptiActivityFlushAll takes that lock. A completion callback that needs the GIL (a ctypes or
 * cupti-python callback) therefore deadlocks with any thread that flushes, or makes a CUDA call
 * that waits for that lock, while holding the GIL: seen once in nine ResNet-18 runs under
 * pyrun -t (docs/gpu.md, "No hang"). Here the callbacks only allocate and queue; Python takes
 * the completed buffers (take_buffers) on a thread of its own, and flush_all calls CUPTI with
 * the GIL released. */
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

/* -- Python interface ---------------------------------------------------------------------- */

static int fill_table(PyObject *entries) {
    memset(table, 0, sizeof(table));
    memset(exit_wanted, 0, sizeof(exit_wanted));
    PyObject *iterator = PyObject_GetIter(entries);
    if (iterator == NULL)
        return -1;
    PyObject *item;
    while ((item = PyIter_Next(iterator)) != NULL) {
        int domain, kind, multi, wants_exit;
        unsigned int cbid;
        int ok = PyArg_ParseTuple(item, "iIiii", &domain, &cbid, &kind, &multi, &wants_exit);
        Py_DECREF(item);
        if (!ok) {
            Py_DECREF(iterator);
            return -1;
        }
        if (domain < DOMAIN_RUNTIME || domain > DOMAIN_DRIVER || cbid >= MAX_CBID || kind <= 0 ||
            kind >= NKINDS) {
            Py_DECREF(iterator);
            PyErr_Format(PyExc_ValueError, "bad callback entry (%d, %u, %d)", domain, cbid, kind);
            return -1;
        }
        table[domain][cbid] = (uint8_t)(kind | (multi ? MULTI_FLAG : 0));
        exit_wanted[domain][cbid] = (uint8_t)(wants_exit != 0);
    }
    Py_DECREF(iterator);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *py_configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *entries, *slow_callable, *every, *prefix = Py_None;
    unsigned int module_cbid, context_cbid, created_cbid = UINT32_MAX, cloned_cbid = UINT32_MAX;
    if (!PyArg_ParseTuple(args, "OOOII|OII", &entries, &slow_callable, &every, &module_cbid,
                          &context_cbid, &prefix, &created_cbid, &cloned_cbid))
        return NULL;
    if (prefix != Py_None && !PyUnicode_Check(prefix)) {
        PyErr_SetString(PyExc_TypeError, "skip_prefix must be a str or None");
        return NULL;
    }
    if (subscriber != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the CUPTI hook is subscribed: stop() it first");
        return NULL;
    }
    if (fill_table(entries) < 0)
        return NULL;
    Py_INCREF(slow_callable);
    Py_XSETREF(slow_path, slow_callable);
    if (every == Py_None) {
        Py_CLEAR(every_call);
    } else {
        Py_INCREF(every);
        Py_XSETREF(every_call, every);
    }
    if (prefix == Py_None) {
        Py_CLEAR(skip_prefix);
    } else {
        Py_INCREF(prefix);
        Py_XSETREF(skip_prefix, prefix);
    }
    module_loaded_cbid = module_cbid;
    context_created_cbid = context_cbid;
    graph_created_cbid = created_cbid;
    graph_cloned_cbid = cloned_cbid;
    __atomic_add_fetch(&epoch, 1, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *py_subscribe(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    if (subscriber != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the CUPTI hook is already subscribed");
        return NULL;
    }
    void *library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL)
        library = dlopen(path, RTLD_NOW);
    if (library == NULL)
        return PyErr_Format(PyExc_OSError, "cannot open %s: %s", path, dlerror());
    subscribe_fn do_subscribe = (subscribe_fn)dlsym(library, "cuptiSubscribe");
    enable_fn enable = (enable_fn)dlsym(library, "cuptiEnableCallback");
    cupti_unsubscribe = (unsubscribe_fn)dlsym(library, "cuptiUnsubscribe");
    if (do_subscribe == NULL || enable == NULL || cupti_unsubscribe == NULL)
        return PyErr_Format(PyExc_OSError, "%s has no cuptiSubscribe/cuptiEnableCallback", path);
    void *handle = NULL;
    int status = do_subscribe(&handle, on_callback, NULL);
    if (status != 0)
        return PyErr_Format(PyExc_OSError, "cuptiSubscribe failed with CUPTI status %d", status);
    subscriber = handle;
    int refused = 0;
    for (int domain = DOMAIN_RUNTIME; domain <= DOMAIN_DRIVER; domain++)
        for (uint32_t cbid = 0; cbid < MAX_CBID; cbid++)
            if (table[domain][cbid] && enable(1, handle, domain, cbid) != 0) {
                table[domain][cbid] = 0;
                refused++;
            }
    if (module_loaded_cbid != UINT32_MAX && enable(1, handle, DOMAIN_RESOURCE, module_loaded_cbid))
        refused++;
    if (context_created_cbid != UINT32_MAX &&
        enable(1, handle, DOMAIN_RESOURCE, context_created_cbid))
        refused++;
    get_graph_node_id = (graph_node_id_fn)dlsym(library, "cuptiGetGraphNodeId");
    if (get_graph_node_id == NULL)
        graph_created_cbid = graph_cloned_cbid = UINT32_MAX; /* no ids: no graph nodes */
    uint32_t graph_cbids[2] = {graph_created_cbid, graph_cloned_cbid};
    for (int i = 0; i < 2; i++)
        if (graph_cbids[i] != UINT32_MAX && enable(1, handle, DOMAIN_RESOURCE, graph_cbids[i]))
            refused++;
    return PyLong_FromLong(refused);
}

static PyObject *py_unsubscribe(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (subscriber != NULL && cupti_unsubscribe != NULL) {
        int status = cupti_unsubscribe(subscriber);
        subscriber = NULL;
        if (status != 0)
            return PyErr_Format(PyExc_OSError, "cuptiUnsubscribe failed with CUPTI status %d",
                                status);
    }
    subscriber = NULL;
    Py_RETURN_NONE;
}

static PyObject *py_bump(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(__atomic_add_fetch(&epoch, 1, __ATOMIC_RELEASE));
}

/* Every operation the fast path recorded since the last drain: bytes of (u64, i64) pairs. */
static PyObject *py_drain(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    size_t capacity = 4096, used = 0;
    Record *out = malloc(capacity * sizeof(Record));
    if (out == NULL)
        return PyErr_NoMemory();
    PyObject *released = NULL;
    pthread_mutex_lock(&rings_lock);
    Ring **link = &rings;
    while (*link != NULL) {
        Ring *ring = *link;
        int dead = __atomic_load_n(&ring->dead, __ATOMIC_ACQUIRE);
        for (;;) {
            Chunk *chunk = ring->head;
            uint32_t count = __atomic_load_n(&chunk->count, __ATOMIC_ACQUIRE);
            if (count > ring->read) {
                size_t take = count - ring->read;
                if (used + take > capacity) {
                    while (used + take > capacity)
                        capacity *= 2;
                    Record *grown = realloc(out, capacity * sizeof(Record));
                    if (grown == NULL) {
                        pthread_mutex_unlock(&rings_lock);
                        free(out);
                        return PyErr_NoMemory();
                    }
                    out = grown;
                }
                memcpy(out + used, chunk->records + ring->read, take * sizeof(Record));
                used += take;
                ring->read = count;
            }
            Chunk *next = __atomic_load_n(&chunk->next, __ATOMIC_ACQUIRE);
            if (next == NULL)
                break;
            if (__atomic_load_n(&chunk->count, __ATOMIC_ACQUIRE) != ring->read)
                continue; /* written just before the move: take those first */
            ring->head = next;
            ring->read = 0;
            free(chunk);
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
    PyObject *result = PyBytes_FromStringAndSize((const char *)out, used * sizeof(Record));
    free(out);
    return result;
}


/* Register the C buffer callbacks with libcupti at ``path`` (buffers of ``size`` bytes). */
static PyObject *py_register_buffers(PyObject *self, PyObject *args) {
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
static PyObject *py_take_buffers(PyObject *self, PyObject *args) {
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

static PyObject *py_free_buffer(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address))
        return NULL;
    free((void *)(uintptr_t)address);
    Py_RETURN_NONE;
}

/* A take_buffers() waiting now returns at once (the buffer thread is asked to stop). */
static PyObject *py_wake_buffers(PyObject *self, PyObject *unused) {
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
static PyObject *py_flush_all(PyObject *self, PyObject *args) {
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

static PyObject *py_take_modules(PyObject *self, PyObject *unused) {
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

static PyObject *py_stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue(
        "{sKsKsKsKsKsKsK}", "chain", (unsigned long long)__atomic_load_n(&n_chain, __ATOMIC_RELAXED),
        "fast", (unsigned long long)__atomic_load_n(&n_fast, __ATOMIC_RELAXED),
        "slow", (unsigned long long)__atomic_load_n(&n_slow, __ATOMIC_RELAXED), "nested",
        (unsigned long long)__atomic_load_n(&n_nested, __ATOMIC_RELAXED), "errors",
        (unsigned long long)__atomic_load_n(&n_errors, __ATOMIC_RELAXED), "modules",
        (unsigned long long)__atomic_load_n(&n_modules, __ATOMIC_RELAXED), "lost",
        (unsigned long long)__atomic_load_n(&n_lost, __ATOMIC_RELAXED));
}

/* Tests (no GPU): call the C callback as CUPTI would, from the calling Python thread. */
static PyObject *py_invoke(PyObject *self, PyObject *args) {
    (void)self;
    int domain, site = 0;
    unsigned int cbid;
    unsigned long long correlation = 0, context = 0;
    Py_buffer cubin = {0};
    if (!PyArg_ParseTuple(args, "iI|iKKy*", &domain, &cbid, &site, &correlation, &context,
                          &cubin))
        return NULL;
    if (domain == DOMAIN_RESOURCE && (cbid == graph_created_cbid || cbid == graph_cloned_cbid)) {
        /* graph callbacks: ``correlation`` is the node, ``context`` the original node */
        GraphData graph = {NULL, NULL, (void *)(uintptr_t)correlation,
                           (void *)(uintptr_t)context, 0, NULL, NULL};
        ResourceData resource = {NULL, NULL, &graph};
        on_callback(NULL, domain, cbid, &resource);
    } else if (domain == DOMAIN_RESOURCE) {
        ModuleResourceData module = {1, (size_t)cubin.len, cubin.buf};
        ResourceData resource = {(void *)(uintptr_t)context, NULL, &module};
        on_callback(NULL, domain, cbid, &resource);
    } else {
        CallbackData data;
        memset(&data, 0, sizeof(data));
        data.callbackSite = site;
        data.context = (void *)(uintptr_t)context;
        data.correlationId = (uint32_t)correlation;
        on_callback(NULL, domain, cbid, &data);
    }
    if (cubin.obj != NULL)
        PyBuffer_Release(&cubin);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_reset(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (subscriber != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the CUPTI hook is subscribed: stop() it first");
        return NULL;
    }
    PyObject *stale = py_drain(self, NULL); /* records of the old configuration: dropped */
    if (stale == NULL)
        return NULL;
    Py_DECREF(stale);
    Py_XDECREF(py_take_modules(self, NULL));
    memset(table, 0, sizeof(table));
    Py_CLEAR(slow_path);
    Py_CLEAR(every_call);
    Py_CLEAR(skip_prefix);
    module_loaded_cbid = context_created_cbid = UINT32_MAX;
    graph_created_cbid = graph_cloned_cbid = UINT32_MAX;
    __atomic_add_fetch(&epoch, 1, __ATOMIC_RELEASE);
    n_fast = n_slow = n_nested = n_errors = n_modules = n_lost = n_chain = 0;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS,
     "configure(entries, slow, every, module_loaded_cbid, context_created_cbid, skip_prefix=None,"
     " graph_node_created_cbid=-1, graph_node_cloned_cbid=-1):"
     " entries are (domain, cbid, kind, multi, wants_exit); slow(kind, correlation, multi) -> "
     "token; every (or None) gets (domain, cbid, site, correlation, context) for every call "
     "instead; frames of files under skip_prefix are looked through."},
    {"subscribe", py_subscribe, METH_VARARGS,
     "subscribe(libcupti_path) -> callbacks CUPTI refused: the C callback becomes CUPTI's."},
    {"unsubscribe", py_unsubscribe, METH_NOARGS, "Stop receiving CUPTI callbacks."},
    {"bump", py_bump, METH_NOARGS, "Invalidate every thread's cached site (new epoch)."},
    {"drain", py_drain, METH_NOARGS, "bytes of (u64 correlation, i64 token) pairs."},
    {"take_modules", py_take_modules, METH_NOARGS, "The cubins loaded since the last call."},
    {"stats", py_stats, METH_NOARGS, "Counters: fast, slow, nested, errors, modules, lost."},
    {"invoke", py_invoke, METH_VARARGS,
     "invoke(domain, cbid, site=0, correlation=0, context=0, cubin=b''): call the C callback "
     "as CUPTI would (tests)."},
    {"reset", py_reset, METH_NOARGS, "Forget the configuration and counters (unsubscribed)."},
    {"register_buffers", py_register_buffers, METH_VARARGS,
     "register_buffers(libcupti_path, size=8 MiB): CUPTI's activity buffers go to C callbacks."},
    {"take_buffers", py_take_buffers, METH_VARARGS,
     "take_buffers(timeout=0.0) -> [(address, valid bytes)]: completed buffers (no GIL held "
     "while waiting); free each with free_buffer()."},
    {"free_buffer", py_free_buffer, METH_VARARGS, "free_buffer(address): a taken buffer is read."},
    {"wake_buffers", py_wake_buffers, METH_NOARGS, "A waiting take_buffers() returns now."},
    {"flush_all", py_flush_all, METH_VARARGS,
     "flush_all(flag=1) -> CUPTI status: cuptiActivityFlushAll with the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_cuptihook",
    "pyrun's CUPTI callback in C (see the source's header comment).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* A forked child has no GPU monitor (CUDA and CUPTI do not survive a fork): the callback,
 * if CUPTI still calls it there, does nothing. References are left as they are (no GIL). */
static void after_fork_in_child(void) {
    memset(table, 0, sizeof(table));
    memset(exit_wanted, 0, sizeof(exit_wanted));
    module_loaded_cbid = context_created_cbid = UINT32_MAX;
    graph_created_cbid = graph_cloned_cbid = UINT32_MAX;
    slow_path = NULL;
    every_call = NULL;
    subscriber = NULL;
}

PyMODINIT_FUNC PyInit__cuptihook(void) {
    if (pthread_key_create(&ring_key, ring_destructor) != 0)
        return PyErr_Format(PyExc_OSError, "pthread_key_create failed");
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0)
        return PyErr_Format(PyExc_OSError, "pthread_atfork failed");
    module_loaded_cbid = context_created_cbid = UINT32_MAX;
    return PyModule_Create(&module_def);
}

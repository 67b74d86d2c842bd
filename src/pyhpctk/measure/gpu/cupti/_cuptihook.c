/* The CUPTI callback of pyrun's GPU layer, in C (pyhpctk.measure.gpu.cupti._cuptihook).
 *
 * Why C: a CUPTI callback that enters Python costs several microseconds per API call (the
 * bindings build an object for every call, entry and exit), more than a small kernel launch
 * itself; and a Python callback that runs while the driver holds its module lock can deadlock
 * with a thread that holds the GIL and waits for that lock. Here:
 *
 * - API entry of a GPU operation (launch, copy, memset, sync, alloc, free): the calling thread
 *   looks up its call site (the program's frames, _cuptihook_sites.c) among the sites it
 *   remembers. A known site with a token for this kind, in the current epoch: the operation
 *   (correlation id, token) goes into the thread's own lock-free chunk list
 *   (_cuptihook_queues.c), no Python runs and, where the interpreter's frames can be read
 *   directly, the GIL is not taken. Otherwise
 *   the Python slow path (GpuMonitor.operation_token) unwinds, records the operation itself and
 *   returns the token to remember (-1: none).
 * - A driver API call made inside a runtime API call of ours (cudaLaunchKernel calls
 *   cuLaunchKernel) is not an operation of its own: the runtime call's correlation id is the
 *   one its activities carry (CUPTI's runtime and kernel records share it), so the inner call
 *   would only wait for an activity that never comes. Each thread counts the runtime calls it
 *   is inside (entry and exit callbacks). The inner call's id still goes to the monitor,
 *   tagged, with the runtime call's token: it searches them only for activities nothing else
 *   claimed, and forgets them after a few buffers (GpuStats.inner_matched counts any match).
 * - With sync=api, a synchronization's entry and exit are timed here and give the SYNC row
 *   CUPTI's SYNCHRONIZATION records gave (_cuptihook_syncs.c).
 * - MODULE_LOADED: the cubin is copied into a queue (_cuptihook_queues.c); Python takes it on
 *   the monitor thread.
 * - Everything else the Python side asked for (PC sampling needs context creation and kernel
 *   exits) goes to a Python callable, with the GIL.
 *
 * The parts: this file is the callback, its configuration and the module's Python face;
 * _cuptihook_sites.c each thread's call sites; _cuptihook_queues.c the operations and modules
 * handed to the monitor thread (per-thread chunk lists, drain(), take_modules());
 * _cuptihook_syncs.c synchronizations timed at the API; _cuptihook_buffers.c CUPTI's activity
 * buffers; _cuptihook_records.c the monitor's per-record work.
 *
 * No CUDA header is needed: the few CUPTI declarations used are in _cuptihook.h.
 */
#include "_cuptihook.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

typedef void (*callback_fn)(void *, int, uint32_t, const void *);
typedef int (*graph_node_id_fn)(void *, uint64_t *);
typedef int (*subscribe_fn)(void **, callback_fn, void *);
typedef int (*enable_fn)(uint32_t, void *, int, uint32_t);
typedef int (*unsubscribe_fn)(void *);

#define MAX_CBID 4096
#define KIND_MASK 0x0f
#define MULTI_FLAG 0x10
#define KIND_GRAPH_NODE 8           /* activity.GRAPH_NODE: a graph node made at this site */
#define NODE_TAG (1ULL << 63)       /* operations.NODE_TAG: the correlation is a node's id */
#define CLONE_TAG (1ULL << 62)      /* operations.CLONE_TAG: clone id, token = original id */
#define INNER_TAG (1ULL << 61)      /* operations.INNER_TAG: a driver call inside a runtime
                                     * call, token = the runtime call's */

/* -- configuration (written by configure() with the GIL, before the subscription) ---------- */

static uint8_t table[3][MAX_CBID]; /* [domain][cbid] → kind | MULTI_FLAG, 0: not ours */
static uint8_t exit_wanted[3][MAX_CBID];
static uint32_t module_loaded_cbid = UINT32_MAX;
static uint32_t context_created_cbid = UINT32_MAX;
static uint32_t graph_created_cbid = UINT32_MAX, graph_cloned_cbid = UINT32_MAX;
static graph_node_id_fn get_graph_node_id;
PyObject *hook_skip_prefix; /* frames of files under it are pyhpctk's own: looked through */
uint64_t hook_config;
static PyObject *slow_path;  /* (kind, correlation, multi) -> token */
static PyObject *every_call; /* (domain, cbid, site, correlation, context) -> None, or NULL */
static int64_t epoch;
static void *subscriber;
static unsubscribe_fn cupti_unsubscribe;
HookCounts hook_counts;

/* -- producer side ------------------------------------------------------------------------- */

/* With the GIL: the Python slow path for this operation; returns its token (-1: none). */
static long long call_slow(int kind, int multi, uint64_t correlation) {
    PyObject *callable = slow_path;
    if (callable == NULL)
        return -1;
    hook_thread_ring(); /* registers the thread-exit destructor that releases the cache */
    hook_cache.busy = 1;
    PyObject *result = PyObject_CallFunction(callable, "iKi", kind,
                                             (unsigned long long)correlation, multi);
    hook_cache.busy = 0;
    COUNT(slow);
    if (result == NULL) {
        COUNT(errors);
        PyErr_WriteUnraisable(callable);
        return -1;
    }
    long long token = PyLong_AsLongLong(result);
    Py_DECREF(result);
    if (token == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        token = -1;
    }
    return token < 0 || token > INT32_MAX ? -1 : token;
}

/* A thread without Python frames: its one site's token, pushed (1), or not known yet (0). */
static int frameless_hit(int kind, uint64_t correlation, int64_t now) {
    ThreadCache *cache = &hook_cache;
    if (!cache->frameless_ready || cache->frameless_epoch != now || cache->frameless_token[kind] < 0)
        return 0;
    hook_push(correlation, cache->frameless_token[kind]);
    COUNT(fast);
    return 1;
}

/* With the GIL: the slow path of a thread without Python frames; caches its token. */
static void frameless_slow(int kind, int multi, uint64_t correlation, int64_t now) {
    ThreadCache *cache = &hook_cache;
    long long token = call_slow(kind, multi, correlation);
    if (!cache->frameless_ready || cache->frameless_epoch != now) {
        cache->frameless_ready = 1;
        cache->frameless_epoch = now;
        for (int k = 0; k < NKINDS; k++)
            cache->frameless_token[k] = -1;
    }
    cache->frameless_token[kind] = token;
}

static void call_every(int domain, uint32_t cbid, int site, uint64_t correlation, void *ctx) {
    PyObject *callable = every_call;
    if (callable == NULL || hook_cache.busy)
        return;
    PyGILState_STATE gil = PyGILState_Ensure();
    hook_cache.busy = 1;
    PyObject *result = PyObject_CallFunction(callable, "iIiKK", domain, cbid, site,
                                             (unsigned long long)correlation,
                                             (unsigned long long)(uintptr_t)ctx);
    hook_cache.busy = 0;
    if (result == NULL) {
        COUNT(errors);
        PyErr_WriteUnraisable(callable);
    } else {
        Py_DECREF(result);
    }
    PyGILState_Release(gil);
}

static int64_t record_operation(int kind, int multi, uint64_t correlation);

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
    if (graph == NULL || hook_cache.busy || every_call != NULL)
        return;
    uint64_t node = node_id(graph->node);
    if (node == 0 || node >= CLONE_TAG)
        return;
    if (cloned) {
        uint64_t original = node_id(graph->originalNode);
        if (original != 0 && original < CLONE_TAG)
            hook_push(node | CLONE_TAG, (int64_t)original);
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
            hook_queue_module((const ResourceData *)data);
        else if (cbid == context_created_cbid && every_call != NULL)
            call_every(domain, cbid, 0, 0, data ? ((const ResourceData *)data)->context : NULL);
        return;
    }
    if (domain < DOMAIN_API_FIRST || domain > DOMAIN_API_LAST || cbid >= MAX_CBID || data == NULL)
        return;
    uint8_t entry = table[domain][cbid];
    if (entry == 0)
        return;
    const CallbackData *call = (const CallbackData *)data;
    ThreadCache *cache = &hook_cache;
    uint64_t config = __atomic_load_n(&hook_config, __ATOMIC_ACQUIRE);
    if (cache->runtime_config != config) { /* counted under another configuration */
        cache->runtime_config = config;
        cache->runtime_depth = 0;
    }
    if (domain == DOMAIN_DRIVER && cache->runtime_depth > 0) {
        if (call->callbackSite == 0) { /* inside a runtime call of ours: its part */
            COUNT(inner);
            if (cache->outer_token >= 0 && every_call == NULL && !cache->busy)
                hook_push((uint64_t)call->correlationId | INNER_TAG, cache->outer_token);
        }
        return;
    }
    if (call->callbackSite != 0) {
        if (domain == DOMAIN_RUNTIME && cache->runtime_depth > 0)
            cache->runtime_depth--;
        if (cache->sync_correlation != 0 && hook_sync_wanted(domain, cbid))
            hook_sync_exit(domain, cbid, call); /* sync=api: the call's SYNC row */
        if (exit_wanted[domain][cbid])
            call_every(domain, cbid, call->callbackSite, call->correlationId, call->context);
        return;
    }
    if (domain == DOMAIN_RUNTIME) {
        cache->runtime_depth++;
        cache->outer_token = -1;
    }
    if (every_call != NULL) {
        call_every(domain, cbid, 0, call->correlationId, call->context);
        return;
    }
    if (cache->busy) { /* a GPU call made by the slow path itself */
        COUNT(nested);
        return;
    }
    int64_t token = record_operation(entry & KIND_MASK, (entry & MULTI_FLAG) != 0,
                                     call->correlationId);
    if (domain == DOMAIN_RUNTIME)
        cache->outer_token = token;
    if (hook_sync_wanted(domain, cbid)) /* sync=api: timed from here to its exit */
        hook_sync_enter(call->correlationId);
}

/* The GIL for the rest of an operation: taken only when needed, kept until done. */
typedef struct {
    int mine;  /* taken here: released in gil_done */
    int held;  /* held here: by this call or by the thread before it */
    PyGILState_STATE state;
} Gil;

static void gil_take(Gil *gil) {
    if (gil->held)
        return;
    gil->held = 1;
    if (!PyGILState_Check()) {
        gil->state = PyGILState_Ensure();
        gil->mine = 1;
    }
}

static void gil_done(Gil *gil) {
    if (gil->held)
        hook_release_doomed();
    if (gil->mine)
        PyGILState_Release(gil->state);
}

/* An operation of ``kind`` made on the calling thread: known site → pushed without Python;
 * else the Python slow path unwinds and returns the site's token. Returns the token. */
static int64_t record_operation(int kind, int multi, uint64_t correlation) {
    int64_t now = __atomic_load_n(&epoch, __ATOMIC_ACQUIRE);
    Gil gil = {0, 0, PyGILState_LOCKED};
    PyThreadState *tstate = PyGILState_GetThisThreadState();
    FrameKey frames[MAXDEPTH + 1]; /* + the thread's ranges */
    uint64_t hash = 0;
    int64_t token = -1;
    int depth = 0; /* a thread Python has never seen (a runtime's C++ worker): no frames */
    if (tstate != NULL) {
        depth = hook_stack(tstate, 0, frames, &hash);
        if (depth == HOOK_NEEDS_GIL) {
            gil_take(&gil);
            depth = hook_stack(tstate, 1, frames, &hash);
        }
    }
    if (depth >= 0 && hook_cache.range != NULL) { /* its ranges: one more (outermost) frame */
        frames[depth].code = (uintptr_t)hook_cache.range;
        frames[depth].instr = 1; /* odd: no instruction's address */
        hash = ((hash ^ (uint64_t)(uintptr_t)hook_cache.range) * 0x9E3779B97F4A7C15ULL) | 1;
        depth++;
    }
    if (depth == 0) { /* no program frame: the thread's one frameless site */
        if (frameless_hit(kind, correlation, now)) {
            if (!gil.held)
                COUNT(unlocked);
        } else {
            gil_take(&gil);
            frameless_slow(kind, multi, correlation, now);
        }
        token = hook_cache.frameless_token[kind];
    } else if (depth == HOOK_TOO_DEEP) {
        COUNT(deep);
        gil_take(&gil);
        token = call_slow(kind, multi, correlation);
    } else {
        Site *site = hook_find(frames, depth, hash);
        if (site != NULL && site->epoch == now && site->token[kind] >= 0) {
            token = site->token[kind];
            hook_push(correlation, token);
            COUNT(fast);
            COUNT(chain);
            if (!gil.held)
                COUNT(unlocked);
        } else {
            gil_take(&gil);
            token = call_slow(kind, multi, correlation);
            if (site == NULL) {
                site = hook_remember(frames, depth, hash, now);
            } else if (site->epoch != now) {
                site->epoch = now;
                for (int k = 0; k < NKINDS; k++)
                    site->token[k] = -1;
            }
            if (site != NULL)
                site->token[kind] = (int32_t)token;
        }
    }
    gil_done(&gil);
    return token;
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
        if (domain < DOMAIN_API_FIRST || domain > DOMAIN_API_LAST || cbid >= MAX_CBID || kind <= 0 ||
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
    hook_sync_forget(); /* sync_apis() comes after configure() */
    Py_INCREF(slow_callable);
    Py_XSETREF(slow_path, slow_callable);
    if (every == Py_None) {
        Py_CLEAR(every_call);
    } else {
        Py_INCREF(every);
        Py_XSETREF(every_call, every);
    }
    if (prefix == Py_None) {
        Py_CLEAR(hook_skip_prefix);
    } else {
        Py_INCREF(prefix);
        Py_XSETREF(hook_skip_prefix, prefix);
    }
    module_loaded_cbid = module_cbid;
    context_created_cbid = context_cbid;
    graph_created_cbid = created_cbid;
    graph_cloned_cbid = cloned_cbid;
    __atomic_add_fetch(&epoch, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&hook_config, 1, __ATOMIC_RELEASE);
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
    for (int domain = DOMAIN_API_FIRST; domain <= DOMAIN_API_LAST; domain++)
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
    hook_sync_bind(library);
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

/* The calling thread's open ranges (an object standing for them; None: none), part of each
 * site from now on (pyhpctk.measure.ranges tells each change). */
static PyObject *py_set_range(PyObject *self, PyObject *range) {
    (void)self;
    PyObject *old = hook_cache.range;
    if (range == Py_None) {
        hook_cache.range = NULL;
    } else {
        Py_INCREF(range);
        hook_cache.range = range;
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *py_stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    const struct {
        const char *name;
        uint64_t *count;
    } counts[] = {
        {"fast", &hook_counts.fast},       {"slow", &hook_counts.slow},
        {"chain", &hook_counts.chain},     {"unlocked", &hook_counts.unlocked},
        {"inner", &hook_counts.inner},     {"nested", &hook_counts.nested},
        {"deep", &hook_counts.deep},       {"sites", &hook_counts.sites},
        {"resets", &hook_counts.resets},   {"errors", &hook_counts.errors},
        {"modules", &hook_counts.modules}, {"lost", &hook_counts.lost},
    };
    PyObject *out = PyDict_New();
    for (size_t i = 0; out != NULL && i < sizeof(counts) / sizeof(counts[0]); i++) {
        PyObject *value =
            PyLong_FromUnsignedLongLong(__atomic_load_n(counts[i].count, __ATOMIC_RELAXED));
        if (value == NULL || PyDict_SetItemString(out, counts[i].name, value) < 0)
            Py_CLEAR(out);
        Py_XDECREF(value);
    }
    return out;
}

/* Tests (no GPU): call the C callback as CUPTI would, from the calling Python thread. */
static PyObject *py_invoke(PyObject *self, PyObject *args) {
    (void)self;
    int domain, site = 0;
    unsigned int cbid;
    unsigned long long correlation = 0, context = 0, stream = 0;
    Py_buffer cubin = {0};
    if (!PyArg_ParseTuple(args, "iI|iKKy*K", &domain, &cbid, &site, &correlation, &context,
                          &cubin, &stream))
        return NULL;
    void *params[1] = {(void *)(uintptr_t)stream}; /* {stream, ...}: a stream API's params */
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
        data.contextUid = (uint32_t)context;
        data.functionParams = params;
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
    PyObject *stale = hook_drain(self, NULL); /* records of the old configuration: dropped */
    if (stale == NULL)
        return NULL;
    Py_DECREF(stale);
    Py_XDECREF(hook_take_modules(self, NULL));
    hook_sync_reset();
    memset(table, 0, sizeof(table));
    Py_CLEAR(slow_path);
    Py_CLEAR(every_call);
    Py_CLEAR(hook_skip_prefix);
    module_loaded_cbid = context_created_cbid = UINT32_MAX;
    graph_created_cbid = graph_cloned_cbid = UINT32_MAX;
    __atomic_add_fetch(&epoch, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&hook_config, 1, __ATOMIC_RELEASE);
    memset(&hook_counts, 0, sizeof(hook_counts));
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
    {"set_range", py_set_range, METH_O,
     "The calling thread's open ranges (an object; None: none): part of its sites."},
    {"drain", hook_drain, METH_NOARGS, "bytes of (u64 correlation, i64 token) pairs."},
    {"take_modules", hook_take_modules, METH_NOARGS, "The cubins loaded since the last call."},
    {"stats", py_stats, METH_NOARGS,
     "Counters: fast (no Python), slow (Python), chain (fast, with frames), unlocked (fast,"
     " without the GIL), inner (driver calls inside runtime calls), nested (made by the slow"
     " path), deep (stacks too deep to remember), sites (remembered), resets (tables emptied),"
     " errors, modules, lost."},
    {"invoke", py_invoke, METH_VARARGS,
     "invoke(domain, cbid, site=0, correlation=0, context=0, cubin=b'', stream=0): call the C "
     "callback as CUPTI would (tests): context is also the context's id, stream the first "
     "parameter of the call."},
    {"reset", py_reset, METH_NOARGS, "Forget the configuration and counters (unsubscribed)."},
    {"sync_apis", hook_sync_apis, METH_VARARGS,
     "sync_apis(entries): the synchronization APIs timed at the API, each (domain, cbid, type,"
     " stream_arg, per_thread): type is CUpti_ActivitySynchronizationType, stream_arg says the"
     " call's first parameter is a stream, per_thread that it is a _ptsz variant. After"
     " configure() (which forgets them), before subscribe()."},
    {"take_syncs", hook_take_syncs, METH_NOARGS,
     "The rows of the synchronizations timed since the last call: bytes of SYNC_ROW_SIZE each"
     " (u64 correlation, start, end; u32 context, stream, type, pad)."},
    {"sync_stats", hook_sync_stats, METH_NOARGS, "(rows made, rows lost for want of memory)."},
    {"register_buffers", hook_register_buffers, METH_VARARGS,
     "register_buffers(libcupti_path, size=8 MiB): CUPTI's activity buffers go to C callbacks."},
    {"take_buffers", hook_take_buffers, METH_VARARGS,
     "take_buffers(timeout=0.0) -> [(address, valid bytes)]: completed buffers (no GIL held "
     "while waiting); free each with free_buffer()."},
    {"free_buffer", hook_free_buffer, METH_VARARGS,
     "free_buffer(address): a taken buffer is read."},
    {"wake_buffers", hook_wake_buffers, METH_NOARGS, "A waiting take_buffers() returns now."},
    {"flush_all", hook_flush_all, METH_VARARGS,
     "flush_all(flag=1) -> CUPTI status: cuptiActivityFlushAll with the GIL released."},
    {"record_offsets", hook_record_offsets, METH_VARARGS,
     "record_offsets(address, valid, sizes, start=0) -> (offsets, stop): where each activity"
     " record starts (bytes of int64), from each kind's size (sizes: uint32 per CUPTI kind, 0"
     " unknown); stop: the first record of an unknown kind, or valid."},
    {"convert_records", hook_convert_records, METH_VARARGS,
     "convert_records(address, valid, offsets, stride, plan, kind, free_kind, names, indices, out)"
     " -> missing: the records of one kind at offsets (int64) of the buffer, each stride bytes,"
     " as activity rows into out (ACTIVITY_DTYPE), following plan (records.plan); kernel names"
     " are looked up among names (sorted uint64 pointers; indices: their int32 function"
     " indices); missing: bytes of the distinct uint64 pointers not found (their rows say -1)."},
    {"activity_sums", hook_activity_sums, METH_VARARGS,
     "activity_sums(rows, targets, groups, width, layout, limits) -> bytes: float64 sums of the"
     " metrics of rows (ACTIVITY_DTYPE) per target group (int64 per row), groups x width;"
     " layout: the metric indices and activity kinds (attribution.SUM_LAYOUT), limits: the"
     " device's (warp, threads, blocks, registers, shared memory per SM)."},
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
    hook_sync_forget();
    memset(exit_wanted, 0, sizeof(exit_wanted));
    module_loaded_cbid = context_created_cbid = UINT32_MAX;
    graph_created_cbid = graph_cloned_cbid = UINT32_MAX;
    slow_path = NULL;
    every_call = NULL;
    subscriber = NULL;
}

PyMODINIT_FUNC PyInit__cuptihook(void) {
    if (hook_queues_init() != 0)
        return PyErr_Format(PyExc_OSError, "pthread_key_create failed");
    if (hook_sync_init() != 0)
        return PyErr_Format(PyExc_OSError, "pthread_key_create failed");
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0)
        return PyErr_Format(PyExc_OSError, "pthread_atfork failed");
    module_loaded_cbid = context_created_cbid = UINT32_MAX;
    PyObject *module = PyModule_Create(&module_def);
    /* How call sites read frames: "interpreter" (no GIL, no frame objects) or "public". */
    if (module != NULL && PyModule_AddStringConstant(module, "FRAME_WALK", hook_frame_walk) < 0)
        Py_CLEAR(module);
    /* the size of a row of take_syncs() (syncapi.SYNC_ROW_DTYPE checks it) */
    if (module != NULL && PyModule_AddIntConstant(module, "SYNC_ROW_SIZE", 40) < 0)
        Py_CLEAR(module);
    return module;
}
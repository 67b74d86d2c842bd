/* What the parts of pyrun's C CUPTI hook share: CUPTI's few declarations, the per-thread
 * cache, the counters. The parts: _cuptihook.c (the callback, its configuration, the module's
 * Python face), _cuptihook_sites.c (each thread's call sites), _cuptihook_queues.c (operations
 * and modules handed to the monitor thread), _cuptihook_syncs.c (synchronizations timed at the
 * API), _cuptihook_buffers.c (CUPTI's activity buffers), _cuptihook_records.c (the monitor's
 * per-record work).
 */
#ifndef PYHPCTK_CUPTIHOOK_H
#define PYHPCTK_CUPTIHOOK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000
#error "pyhpctk needs Python 3.11 or newer"
#endif

#define HOOK_HIDDEN __attribute__((visibility("hidden")))

/* -- CUPTI declarations (cupti_callbacks.h, CUDA 11-13; x86-64 and AArch64 layouts agree) --- */

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

/* CUpti_GraphData, the resource descriptor of the graph callbacks. */
typedef struct {
    void *graph;
    void *originalGraph;
    void *node;
    void *originalNode;
    int nodeType;
    void *dependency;
    void *graphExec;
} GraphData;

/* CUpti_CallbackDomain (cupti_callbacks.h): the driver API is 1, the runtime API 2. */
enum { DOMAIN_DRIVER = 1, DOMAIN_RUNTIME = 2, DOMAIN_RESOURCE = 3 };
#define DOMAIN_API_FIRST DOMAIN_DRIVER
#define DOMAIN_API_LAST DOMAIN_RUNTIME
#define NKINDS 16

/* -- call sites (_cuptihook_sites.c) -------------------------------------------------------- */

/* One frame of a call site: its code object (held by the thread's cache while a site uses it,
 * so no other code object can take its address) and the instruction it is at. */
typedef struct {
    uintptr_t code;
    uintptr_t instr;
} FrameKey;

/* One call site: the program's whole stack, frame by frame, from the innermost program frame
 * (pyhpctk's own frames above it looked through) to the bottom. The same code objects at the
 * same instructions all the way down are the same Python calling context, whatever frame
 * objects they run in. */
typedef struct {
    uint64_t hash;          /* 0: a free slot */
    int64_t epoch;          /* the epoch the tokens belong to */
    uint32_t start;         /* the frames: arena[start .. start + depth) */
    uint32_t depth;
    int32_t token[NKINDS];  /* per operation kind: the site's token, -1 unknown */
} Site;

#define MAXDEPTH 1024        /* deeper stacks are not remembered: Python unwinds every call */
#define SKIP_WAYS 64         /* code objects whose "pyhpctk's own?" answer a thread remembers */

typedef struct Ring Ring;
struct SyncRing;

typedef struct {
    int busy;                /* inside the Python slow path: nested calls are not re-entered */
    int runtime_depth;       /* runtime API calls of ours the thread is inside */
    uint64_t runtime_config; /* the configuration runtime_depth was counted under */
    int64_t outer_token;     /* the token of the runtime call the thread is inside (-1) */
    int frameless_ready;     /* a thread without Python frames: one site */
    int64_t frameless_epoch;
    int64_t frameless_token[NKINDS];
    Site *sites;             /* open addressing, ``slots`` slots (a power of two) */
    uint32_t slots, nsites, resets;
    FrameKey *arena;         /* the sites' frames */
    uint32_t arena_used, arena_size;
    uint64_t skip_config;    /* the configuration skip_code's answers belong to */
    PyObject *skip_code[SKIP_WAYS];
    uint8_t skip_answer[SKIP_WAYS];
    PyObject **doomed;       /* references to release once the cache is consistent again */
    size_t ndoomed, doomed_size;
    Ring *ring;
    uint64_t sync_correlation; /* the synchronization call the thread is inside (0: none) */
    uint64_t sync_start;       /* its CUPTI timestamp at entry */
    struct SyncRing *sync_ring;
    PyObject *range;           /* the thread's open ranges (pyrun --ranges; set_range), or NULL:
                                  part of every site, as one more frame (code = this object) */
} ThreadCache;

extern __thread ThreadCache hook_cache HOOK_HIDDEN;
extern PyObject *hook_skip_prefix HOOK_HIDDEN;
extern uint64_t hook_config HOOK_HIDDEN; /* changes with every configure() and reset() */
extern const char hook_frame_walk[] HOOK_HIDDEN;

/* The program's frames of the calling thread into ``out`` (innermost first), their hash in
 * ``*hash``. Returns the depth (0: no program frame), HOOK_TOO_DEEP, or HOOK_NEEDS_GIL when a
 * frame must be looked at with the GIL (``gil`` 0); with ``gil`` 1 the caller holds it. */
#define HOOK_TOO_DEEP (-1)
#define HOOK_NEEDS_GIL (-2)
HOOK_HIDDEN int hook_stack(PyThreadState *tstate, int gil, FrameKey *out, uint64_t *hash);
/* The calling thread's site with these frames (NULL: none). No GIL needed. */
HOOK_HIDDEN Site *hook_find(const FrameKey *frames, int depth, uint64_t hash);
/* With the GIL: remember a new site (NULL: out of memory). */
HOOK_HIDDEN Site *hook_remember(const FrameKey *frames, int depth, uint64_t hash, int64_t now);
/* With the GIL: release what hook_remember and the skip cache let go of. */
HOOK_HIDDEN void hook_release_doomed(void);
/* Without the GIL, at thread exit: every reference the thread's cache holds, in a new array
 * (``*count`` of them; the caller releases them with the GIL), and the cache's memory freed. */
HOOK_HIDDEN PyObject **hook_surrender(int *count);

/* -- counters -------------------------------------------------------------------------------- */

typedef struct {
    uint64_t fast, slow, nested, errors, modules, lost, chain, inner, deep, unlocked, sites,
        resets;
} HookCounts;

extern HookCounts hook_counts HOOK_HIDDEN;
#define COUNT(name) __atomic_add_fetch(&hook_counts.name, 1, __ATOMIC_RELAXED)

/* -- activity buffers (_cuptihook_buffers.c) ------------------------------------------------ */

HOOK_HIDDEN PyObject *hook_register_buffers(PyObject *self, PyObject *args);
HOOK_HIDDEN PyObject *hook_take_buffers(PyObject *self, PyObject *args);
HOOK_HIDDEN PyObject *hook_free_buffer(PyObject *self, PyObject *args);
HOOK_HIDDEN PyObject *hook_wake_buffers(PyObject *self, PyObject *unused);
HOOK_HIDDEN PyObject *hook_flush_all(PyObject *self, PyObject *args);
HOOK_HIDDEN PyObject *hook_record_offsets(PyObject *self, PyObject *args);

/* -- per-record work of the monitor (_cuptihook_records.c) ---------------------------------- */

HOOK_HIDDEN PyObject *hook_convert_records(PyObject *self, PyObject *args);
HOOK_HIDDEN PyObject *hook_activity_sums(PyObject *self, PyObject *args);

/* -- per-thread chunk lists (operations in _cuptihook_queues.c, synchronizations in
 * _cuptihook_syncs.c)
 * A producer thread appends items to its own list of chunks; the consumer, under the lists'
 * lock, takes what was written. Every chunk type starts with this head, its items at
 * ``offset``. */

typedef struct HookChunk {
    struct HookChunk *next; /* published (release) once the producer has moved on */
    uint32_t count;         /* items written (release by the producer) */
} HookChunk;

typedef struct {
    char *data;            /* malloc'd; the caller frees it */
    size_t used, capacity; /* in items */
} HookTaken;

/* Append to ``out`` every item of the list at ``*head`` past ``*read``, freeing the chunks the
 * producer has left (``*head`` and ``*read`` move on). 0, or -1 out of memory (``out`` stays
 * valid and holds what was taken so far). */
HOOK_HIDDEN int hook_take_chunks(HookChunk **head, uint32_t *read, size_t item, size_t offset,
                                 HookTaken *out);

/* -- operations and modules handed to the monitor thread (_cuptihook_queues.c) ------------- */

HOOK_HIDDEN int hook_queues_init(void); /* at import: 0 or an errno */
/* The calling thread's ring, made and registered on first use (NULL: out of memory); its
 * thread-exit destructor hands the thread's cached references to the consumer. */
HOOK_HIDDEN Ring *hook_thread_ring(void);
/* An operation (correlation id, token) into the calling thread's ring. No GIL needed. */
HOOK_HIDDEN void hook_push(uint64_t correlation, int64_t token);
/* MODULE_LOADED: a copy of the cubin into the queue. No GIL needed. */
HOOK_HIDDEN void hook_queue_module(const ResourceData *resource);
HOOK_HIDDEN PyObject *hook_drain(PyObject *self, PyObject *unused);
HOOK_HIDDEN PyObject *hook_take_modules(PyObject *self, PyObject *unused);

/* -- synchronizations timed at the API (_cuptihook_syncs.c) -------------------------------- */

HOOK_HIDDEN int hook_sync_init(void);             /* at import: 0 or an errno */
HOOK_HIDDEN void hook_sync_bind(void *library);   /* libcupti's timestamp and stream ids */
HOOK_HIDDEN void hook_sync_forget(void);          /* no API gives rows (no GIL needed) */
HOOK_HIDDEN void hook_sync_reset(void);           /* forget, drop the rows (with the GIL) */
HOOK_HIDDEN int hook_sync_wanted(int domain, uint32_t cbid);
HOOK_HIDDEN void hook_sync_enter(uint64_t correlation);
HOOK_HIDDEN void hook_sync_exit(int domain, uint32_t cbid, const CallbackData *call);
HOOK_HIDDEN PyObject *hook_sync_apis(PyObject *self, PyObject *args);
HOOK_HIDDEN PyObject *hook_take_syncs(PyObject *self, PyObject *unused);
HOOK_HIDDEN PyObject *hook_sync_stats(PyObject *self, PyObject *unused);

#endif

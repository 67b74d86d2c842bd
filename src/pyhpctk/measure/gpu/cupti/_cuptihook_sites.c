/* The call sites each thread of a measured program remembers, and the walk of its frames.
 *
 * A GPU operation's site is the calling thread's whole Python stack, as (code object,
 * instruction) pairs from the innermost program frame down (frames of pyhpctk itself on top,
 * the simulated runtime's, are looked through). Equal pairs all the way down are the same
 * calling context, so a model's forward pass, which runs in new frame objects at every step,
 * finds its sites again; nothing above a site is kept alive but code objects.
 *
 * Each thread keeps its sites in a hash table of its own (open addressing, grown to at most
 * MAX_SITES sites and ARENA_MAX frames, then emptied and refilled: memory stays bounded), so
 * a model with thousands of layer instances has each of its launch sites unwound once.
 *
 * Where this interpreter's internal headers are at hand (CPython 3.11-3.13 with the GIL), the
 * frames are read from the thread's own interpreter frames: no frame object is made, no
 * reference taken, and the GIL is not needed, which matters for threads that launch with the
 * GIL released (PyTorch's autograd workers, a library call that released it). A thread only
 * ever reads its own frames, which cannot change while it is inside the CUDA call. Elsewhere
 * the public frame API is used, with the GIL.
 */
#include "_cuptihook.h"

#include <stdlib.h>
#include <string.h>

/* PYHPCTK_INTERPRETER_FRAMES: setup.py's one version gate (FRAMES_SUPPORTED) says this
 * CPython's frames can be read as the engine reads them (pyframes.h); PYHPCTK_PUBLIC_FRAMES
 * builds the public-API walk anyway (tests of the fallback). */
#if defined(PYHPCTK_INTERPRETER_FRAMES) && !defined(PYHPCTK_PUBLIC_FRAMES)
#include "pyframes.h"
#define INTERPRETER_FRAMES 1
#endif

#define MAX_SITES 8192u           /* sites per thread before the table is emptied */
#define FIRST_SLOTS 256u
#define ARENA_MAX (1u << 19)      /* frames per thread (8 MiB) before the table is emptied */

__thread ThreadCache hook_cache;

#ifdef INTERPRETER_FRAMES
const char hook_frame_walk[] = "interpreter";
#else
const char hook_frame_walk[] = "public";
#endif

/* -- references let go of while the cache is being changed -------------------------------- */

/* A reference the cache no longer holds is released at the end of the operation (releasing
 * it can run a finaliser, which can make a CUDA call that comes back into the hook). */
static void doom(PyObject *object) {
    ThreadCache *cache = &hook_cache;
    if (object == NULL)
        return;
    if (cache->ndoomed == cache->doomed_size) {
        size_t size = cache->doomed_size ? 2 * cache->doomed_size : 64;
        PyObject **grown = realloc(cache->doomed, size * sizeof(PyObject *));
        if (grown == NULL) {
            COUNT(lost); /* the reference is leaked, never released twice */
            return;
        }
        cache->doomed = grown;
        cache->doomed_size = size;
    }
    cache->doomed[cache->ndoomed++] = object;
}

void hook_release_doomed(void) {
    ThreadCache *cache = &hook_cache;
    while (cache->ndoomed) /* one at a time: a finaliser may doom more */
        Py_DECREF(cache->doomed[--cache->ndoomed]);
}

/* -- pyhpctk's own frames ---------------------------------------------------------------- */

/* 1: a frame of pyhpctk (looked through), 0: the program's, -1: not known without the GIL. */
static int own_code(PyObject *code, int gil) {
    ThreadCache *cache = &hook_cache;
    PyObject *prefix = hook_skip_prefix;
    if (prefix == NULL)
        return 0;
    uint64_t config = __atomic_load_n(&hook_config, __ATOMIC_ACQUIRE);
    if (cache->skip_config != config) { /* answers of another configuration's prefix */
        if (!gil)
            return -1;
        for (int way = 0; way < SKIP_WAYS; way++) {
            doom(cache->skip_code[way]);
            cache->skip_code[way] = NULL;
        }
        cache->skip_config = config;
    }
    unsigned way = (unsigned)((((uintptr_t)code >> 4) * 0x9E3779B97F4A7C15ULL) >> 58);
    if (cache->skip_code[way] == code)
        return cache->skip_answer[way];
    if (!gil)
        return -1;
    int answer = PyUnicode_Tailmatch(((PyCodeObject *)code)->co_filename, prefix, 0,
                                     PY_SSIZE_T_MAX, -1) == 1;
    PyErr_Clear();
    doom(cache->skip_code[way]);
    Py_INCREF(code);
    cache->skip_code[way] = code;
    cache->skip_answer[way] = (uint8_t)answer;
    return answer;
}

/* -- the walk ------------------------------------------------------------------------------ */

static inline uint64_t mix(uint64_t hash, uintptr_t code, uintptr_t instr) {
    hash = (hash ^ (uint64_t)code) * 0x9E3779B97F4A7C15ULL;
    hash ^= hash >> 31;
    hash = (hash ^ (uint64_t)instr) * 0xC2B2AE3D27D4EB4FULL;
    return hash ^ (hash >> 29);
}

/* splitmix64's finaliser: every bit of the chain's hash reaches the table index's bits. */
static inline uint64_t finish(uint64_t hash, int depth) {
    hash ^= (uint64_t)depth;
    hash = (hash ^ (hash >> 30)) * 0xBF58476D1CE4E5B9ULL;
    hash = (hash ^ (hash >> 27)) * 0x94D049BB133111EBULL;
    return (hash ^ (hash >> 31)) | 1; /* never 0: a free slot */
}

/* Adds one frame; returns 0 to go on, else what hook_stack returns. */
static inline int add_frame(PyObject *code, uintptr_t instr, int gil, int *program, int *depth,
                            FrameKey *out, uint64_t *hash) {
    if (!*program) {
        int own = own_code(code, gil);
        if (own < 0)
            return HOOK_NEEDS_GIL;
        if (own)
            return 0;
        *program = 1;
    }
    if (*depth == MAXDEPTH)
        return HOOK_TOO_DEEP;
    out[*depth].code = (uintptr_t)code;
    out[*depth].instr = instr;
    *hash = mix(*hash, (uintptr_t)code, instr);
    (*depth)++;
    return 0;
}

#ifdef INTERPRETER_FRAMES

int hook_stack(PyThreadState *tstate, int gil, FrameKey *out, uint64_t *hash) {
    uint64_t h = 0x84222325CBF29CE4ULL;
    int depth = 0, program = 0;
    for (_PyInterpreterFrame *frame = pyframe_top(tstate); frame != NULL;
         frame = frame->previous) {
        PyCodeObject *code;
        uint32_t offset;
        if (pyframe_read(frame, &code, &offset) <= 0)
            continue; /* frames CPython's own walkers (PyFrame_GetBack) do not show */
        uintptr_t instr = (uintptr_t)(_PyCode_CODE(code) + offset);
        int stop = add_frame((PyObject *)code, instr, gil, &program, &depth, out, &h);
        if (stop)
            return stop;
    }
    *hash = finish(h, depth);
    return depth;
}

#else /* the public frame API: the GIL is needed, frame objects are made */

int hook_stack(PyThreadState *tstate, int gil, FrameKey *out, uint64_t *hash) {
    (void)tstate;
    if (!gil)
        return HOOK_NEEDS_GIL;
    uint64_t h = 0x84222325CBF29CE4ULL;
    int depth = 0, program = 0, stop = 0;
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    while (frame != NULL && !stop) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        Py_DECREF(code); /* the frame holds it */
        stop = add_frame((PyObject *)code, (uintptr_t)PyFrame_GetLasti(frame), gil, &program,
                         &depth, out, &h);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    if (stop)
        return stop;
    *hash = finish(h, depth);
    return depth;
}

#endif

/* -- the table ------------------------------------------------------------------------------ */

Site *hook_find(const FrameKey *frames, int depth, uint64_t hash) {
    ThreadCache *cache = &hook_cache;
    if (cache->sites == NULL)
        return NULL;
    uint32_t mask = cache->slots - 1;
    for (uint32_t at = (uint32_t)hash & mask;; at = (at + 1) & mask) {
        Site *site = &cache->sites[at];
        if (site->hash == 0)
            return NULL;
        if (site->hash == hash && site->depth == (uint32_t)depth &&
            memcmp(cache->arena + site->start, frames, (size_t)depth * sizeof(FrameKey)) == 0)
            return site;
    }
}

static Site *free_slot(Site *sites, uint32_t slots, uint64_t hash) {
    uint32_t mask = slots - 1, at = (uint32_t)hash & mask;
    while (sites[at].hash != 0)
        at = (at + 1) & mask;
    return &sites[at];
}

/* Every site forgotten (the table is full): their code objects let go of. */
static void forget_all(ThreadCache *cache) {
    for (uint32_t i = 0; i < cache->arena_used; i++)
        doom((PyObject *)cache->arena[i].code);
    if (cache->sites != NULL)
        memset(cache->sites, 0, (size_t)cache->slots * sizeof(Site));
    cache->arena_used = 0;
    cache->nsites = 0;
    cache->resets++;
    COUNT(resets);
}

static int grow_slots(ThreadCache *cache) {
    uint32_t slots = cache->slots ? 2 * cache->slots : FIRST_SLOTS;
    Site *sites = calloc(slots, sizeof(Site));
    if (sites == NULL)
        return -1;
    for (uint32_t i = 0; i < cache->slots; i++)
        if (cache->sites[i].hash != 0)
            *free_slot(sites, slots, cache->sites[i].hash) = cache->sites[i];
    free(cache->sites);
    cache->sites = sites;
    cache->slots = slots;
    return 0;
}

static int grow_arena(ThreadCache *cache, uint32_t needed) {
    uint32_t size = cache->arena_size ? cache->arena_size : 4096;
    while (size < needed)
        size *= 2;
    if (size == cache->arena_size)
        return 0;
    FrameKey *arena = realloc(cache->arena, (size_t)size * sizeof(FrameKey));
    if (arena == NULL)
        return -1;
    cache->arena = arena;
    cache->arena_size = size;
    return 0;
}

Site *hook_remember(const FrameKey *frames, int depth, uint64_t hash, int64_t now) {
    ThreadCache *cache = &hook_cache;
    if (cache->nsites >= MAX_SITES || cache->arena_used + (uint32_t)depth > ARENA_MAX)
        forget_all(cache);
    if (((cache->nsites + 1) * 2 > cache->slots && grow_slots(cache) < 0) ||
        grow_arena(cache, cache->arena_used + (uint32_t)depth) < 0) {
        COUNT(lost);
        return NULL;
    }
    Site *site = free_slot(cache->sites, cache->slots, hash);
    site->hash = hash;
    site->epoch = now;
    site->start = cache->arena_used;
    site->depth = (uint32_t)depth;
    for (int k = 0; k < NKINDS; k++)
        site->token[k] = -1;
    memcpy(cache->arena + cache->arena_used, frames, (size_t)depth * sizeof(FrameKey));
    for (int i = 0; i < depth; i++)
        Py_INCREF((PyObject *)frames[i].code);
    cache->arena_used += (uint32_t)depth;
    cache->nsites++;
    COUNT(sites);
    return site;
}

PyObject **hook_surrender(int *count) {
    ThreadCache *cache = &hook_cache;
    size_t total = cache->arena_used + SKIP_WAYS + cache->ndoomed + 1;
    PyObject **held = calloc(total ? total : 1, sizeof(PyObject *));
    int n = 0;
    if (held != NULL) { /* else leaked: never released without the GIL */
        for (uint32_t i = 0; i < cache->arena_used; i++)
            held[n++] = (PyObject *)cache->arena[i].code;
        for (int way = 0; way < SKIP_WAYS; way++)
            if (cache->skip_code[way] != NULL)
                held[n++] = cache->skip_code[way];
        for (size_t i = 0; i < cache->ndoomed; i++)
            held[n++] = cache->doomed[i];
        if (cache->range != NULL)
            held[n++] = cache->range;
    }
    cache->range = NULL;
    free(cache->sites);
    free(cache->arena);
    free(cache->doomed);
    cache->sites = NULL;
    cache->arena = NULL;
    cache->doomed = NULL;
    cache->slots = cache->nsites = cache->arena_used = cache->arena_size = 0;
    cache->ndoomed = cache->doomed_size = 0;
    memset(cache->skip_code, 0, sizeof(cache->skip_code));
    *count = n;
    return held;
}

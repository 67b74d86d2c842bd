/* pyrun's sampling engine: native frames on drain()'s side (issue #17).
 *
 * A record names a native frame by (module registry id, offset); drain() names each module the
 * first time a record names it (the session's load-module id of its path, through the
 * load_module callback) and returns the frame as 1 << 63 | lm << 48 | offset. The thread stack
 * bounds the unwinder checks its reads against are also taken here, outside the handler.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "engine.h"

static int64_t *lm_of;          /* registry id -> the session's lm id; -1: not asked yet */
static uint32_t lm_cap;
static uint32_t *wanted;        /* registry ids a staged record names that have no lm id yet */
static uint32_t wanted_used, wanted_cap;

void engine_forget_modules(void) {
    for (uint32_t i = 0; i < lm_cap; i++) lm_of[i] = -1;
    wanted_used = 0;
}

static int grow_lms(uint32_t id) {
    if (id < lm_cap) return 0;
    uint32_t cap = lm_cap ? lm_cap : 64;
    while (cap <= id) cap *= 2;
    int64_t *grown = realloc(lm_of, cap * sizeof(int64_t));
    if (grown == NULL) return -1;
    for (uint32_t i = lm_cap; i < cap; i++) grown[i] = -1;
    lm_of = grown;
    lm_cap = cap;
    return 0;
}

/* Phase 1 (no Python call): a staged record names module `id`. */
void engine_note_module(uint32_t id) {
    if (id == ENGINE_NO_MODULE || grow_lms(id) != 0 || lm_of[id] != -1) return;
    if (wanted_used == wanted_cap) {
        uint32_t cap = wanted_cap ? 2 * wanted_cap : 64;
        uint32_t *grown = realloc(wanted, cap * sizeof(uint32_t));
        if (grown == NULL) return;
        wanted = grown;
        wanted_cap = cap;
    }
    lm_of[id] = -2; /* asked for once */
    wanted[wanted_used++] = id;
}

/* Phase 2: the session's load-module id of every module noted (0: its frames are left out). */
int engine_resolve_modules(PyObject *load_module) {
    for (uint32_t i = 0; i < wanted_used; i++) {
        uint32_t id = wanted[i];
        char path[PATH_MAX];
        int64_t lm = 0;
        int kind;
        if (load_module != Py_None && engine_module_info(id, path, sizeof(path), &lm, &kind) == 0 &&
            kind != MOD_VDSO) {
            PyObject *value = PyObject_CallOneArg(load_module, PyUnicode_DecodeFSDefault(path));
            if (value == NULL) {
                wanted_used = 0;
                return -1;
            }
            lm = PyLong_AsLongLong(value);
            Py_DECREF(value);
            if (lm == -1 && PyErr_Occurred()) {
                wanted_used = 0;
                return -1;
            }
        } else {
            lm = 0;
        }
        lm_of[id] = lm > 0 && lm < (1 << 15) ? lm : 0;
    }
    wanted_used = 0;
    return 0;
}

/* Phase 3: the ip drain() returns for a native frame (0: leave it out). */
uint64_t engine_native_ip(uint32_t id, uintptr_t offset) {
    if (id >= lm_cap || lm_of[id] <= 0) return 0;
    return (1ull << 63) | ((uint64_t)lm_of[id] << 48) | ((uint64_t)offset & ((1ull << 48) - 1));
}

/* The calling thread's stack [lo, hi) from its pthread attributes (0, 0 when unknown). */
void engine_stack_bounds(uintptr_t *lo, uintptr_t *hi) {
    pthread_attr_t attr;
    void *base;
    size_t size;
    *lo = *hi = 0;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
    if (pthread_attr_getstack(&attr, &base, &size) == 0) {
        *lo = (uintptr_t)base;
        *hi = (uintptr_t)base + size;
    }
    pthread_attr_destroy(&attr);
}

/* The thread that starts the engine: its slot came from the monitor's first scan. */
void engine_own_stack_bounds(void) {
    uintptr_t lo, hi;
    engine_stack_bounds(&lo, &hi);
    pid_t tid = engine_gettid();
    engine_lock();
    Slot *slot = engine_slot_for_tid(tid, 0, 0);
    if (slot != NULL) {
        slot->stack_hi = 0; /* the handler reads lo and hi only when hi is set */
        slot->stack_lo = lo;
        slot->stack_hi = hi;
    }
    engine_unlock();
}

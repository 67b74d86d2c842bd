/* pyhpctk.measure._engine: pyrun's sampling engine, the Python side of it (see engine.h).
 *
 * drain() runs under the GIL, in phases:
 *  1. with the table lock and without calling Python, copy every ring's records into a staging
 *     buffer and pin each code object a record names that is not pinned yet: a strong
 *     reference, after checking (with reads that cannot fault: process_vm_readv on our own
 *     pid) that the pointer still is a live code object with the fingerprint the handler saw.
 *     A code object that died before this is never read: its frame becomes <unknown code>,
 *     counted. On 3.12+ a code watcher pins a dying code object that a pending record names,
 *     so there this only happens for one freed while being popped;
 *  2. give each newly pinned code object its fid (the Python callback FunctionTable.register);
 *  3. turn each record's frames into fid << 32 | line (a (code, instruction) -> line cache in
 *     front of PyCode_Addr2Line), keep each thread's resolved path, and return per thread a
 *     list of entries (common, new ips, timer, GIL state, CPU ns, wall ns, time ns): an entry
 *     shares its first `common` frames with the previous one and names the rest. Unless
 *     tracing, the samples of one drain with the same path, timer and GIL state are one entry
 *     (entries.c).
 * Code objects stay pinned for the life of the measurement, as the FunctionTable keeps them.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine.h"

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#error "pyrun's sampling engine supports CPython 3.11, 3.12 and 3.13"
#endif
#ifdef Py_GIL_DISABLED
#error "pyrun's sampling engine needs the GIL (a free-threaded build falls back to the sampler thread)"
#endif

/* -- pinned code objects and the line cache (open addressing, only insertions) -------------- */

typedef struct {
    void *key;        /* the code object's address */
    PyObject *code;   /* strong reference; NULL: the address was not a live code object */
    int64_t fid;      /* -1: not registered yet */
    uint32_t check;
} CodeEntry;

typedef struct {
    void *code;
    uint32_t instr;
    int32_t line;
} LineEntry;

static CodeEntry *codes;
static size_t codes_cap, codes_used;
static LineEntry *lines;
static size_t lines_cap, lines_used;

static inline size_t hash_pointer(const void *p, uint32_t salt) {
    uint64_t h = ((uint64_t)(uintptr_t)p ^ ((uint64_t)salt << 40)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 31));
}

static CodeEntry *code_find(void *key) {
    if (codes_cap == 0) return NULL;
    for (size_t i = hash_pointer(key, 0) & (codes_cap - 1);; i = (i + 1) & (codes_cap - 1)) {
        if (codes[i].key == key) return &codes[i];
        if (codes[i].key == NULL) return NULL;
    }
}

static CodeEntry *code_insert(void *key) {
    if (2 * (codes_used + 1) > codes_cap) {
        size_t cap = codes_cap ? 2 * codes_cap : 1024;
        CodeEntry *table = calloc(cap, sizeof(CodeEntry));
        if (table == NULL) return NULL;
        for (size_t j = 0; j < codes_cap; j++) {
            if (codes[j].key == NULL) continue;
            size_t i = hash_pointer(codes[j].key, 0) & (cap - 1);
            while (table[i].key != NULL) i = (i + 1) & (cap - 1);
            table[i] = codes[j];
        }
        free(codes);
        codes = table;
        codes_cap = cap;
    }
    size_t i = hash_pointer(key, 0) & (codes_cap - 1);
    while (codes[i].key != NULL) i = (i + 1) & (codes_cap - 1);
    codes[i].key = key;
    codes[i].code = NULL;
    codes[i].fid = -1;
    codes_used++;
    return &codes[i];
}

static int line_of(PyObject *code, uint32_t instr) {
    if (2 * (lines_used + 1) > lines_cap) {
        size_t cap = lines_cap ? 2 * lines_cap : 4096;
        LineEntry *table = calloc(cap, sizeof(LineEntry));
        if (table == NULL) return PyCode_Addr2Line((PyCodeObject *)code, (int)instr * 2);
        for (size_t j = 0; j < lines_cap; j++) {
            if (lines[j].code == NULL) continue;
            size_t i = hash_pointer(lines[j].code, lines[j].instr) & (cap - 1);
            while (table[i].code != NULL) i = (i + 1) & (cap - 1);
            table[i] = lines[j];
        }
        free(lines);
        lines = table;
        lines_cap = cap;
    }
    size_t i = hash_pointer(code, instr) & (lines_cap - 1);
    for (;; i = (i + 1) & (lines_cap - 1)) {
        if (lines[i].code == code && lines[i].instr == instr) return lines[i].line;
        if (lines[i].code == NULL) break;
    }
    int line = PyCode_Addr2Line((PyCodeObject *)code, (int)instr * 2);
    lines[i].code = code;
    lines[i].instr = instr;
    lines[i].line = line < 0 ? 0 : line;
    lines_used++;
    return lines[i].line;
}

/* Whether `address` is (still) a live code object with fingerprint `check`, read with
 * process_vm_readv, which fails with EFAULT where a plain read would crash. A freed small
 * object's first word is its allocator's free-list link, so a refcount outside 1..2^32-1 (an
 * address, or 0) means freed. */
static int live_code(void *address, uint32_t check) {
    PyCodeObject copy;
    struct iovec local = {&copy, sizeof(copy)}, remote = {address, sizeof(copy)};
    if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)sizeof(copy)) return 0;
    Py_ssize_t refcnt = ((PyObject *)&copy)->ob_refcnt;
    if (((PyObject *)&copy)->ob_type != &PyCode_Type || refcnt <= 0 || refcnt > 0xFFFFFFFFll)
        return 0;
    return engine_code_check(&copy) == check;
}

/* Phase 1 for one frame: its code object pinned (or known as gone). Returns the entry. */
static void **pending_keys; /* pinned code objects without a fid yet */
static size_t pending_used, pending_cap;

static void note_pending(void *key) {
    if (pending_used == pending_cap) {
        size_t cap = pending_cap ? 2 * pending_cap : 256;
        void **grown = realloc(pending_keys, cap * sizeof(void *));
        if (grown == NULL) return; /* it stays <unknown code> */
        pending_keys = grown;
        pending_cap = cap;
    }
    pending_keys[pending_used++] = key;
}

static CodeEntry *pin(RawFrame *frame) {
    if (frame->code == CODE_TRUNCATED || frame->code == CODE_GC || IS_TASK(frame->code)) return NULL;
    if (IS_NATIVE(frame->code)) {
        engine_note_module(frame->instr);
        return NULL;
    }
    CodeEntry *entry = code_find(frame->code);
    if (entry != NULL && entry->code != NULL) return entry; /* pinned: alive, never replaced */
    if (!live_code(frame->code, frame->check)) {
        if (entry == NULL && (entry = code_insert(frame->code)) != NULL) entry->check = frame->check;
        atomic_fetch_add(&engine.unknown_frames, 1);
        return entry;
    }
    if (entry == NULL && (entry = code_insert(frame->code)) == NULL) return NULL;
    entry->code = (PyObject *)frame->code;
    entry->check = frame->check;
    entry->fid = -1;
    Py_INCREF(entry->code);
    note_pending(frame->code);
    return entry;
}

/* -- staging ------------------------------------------------------------------------------------ */

static uint8_t *staging;
static size_t staging_cap;

static int stage(size_t used, size_t more) {
    if (used + more <= staging_cap) return 0;
    size_t cap = staging_cap ? staging_cap : 1 << 16;
    while (cap < used + more) cap *= 2;
    uint8_t *buffer = realloc(staging, cap);
    if (buffer == NULL) return -1;
    staging = buffer;
    staging_cap = cap;
    return 0;
}

typedef struct {
    uint32_t slot;
    uint32_t count;  /* records */
    size_t offset;   /* in staging */
    size_t bytes;
    int ended;
} StagedSlot;

/* Phase 1: copy every ring out (table lock held, no Python call). */
static Py_ssize_t stage_rings(StagedSlot *out) {
    Py_ssize_t nslots = 0;
    size_t used = 0;
    engine_lock();
    uint32_t slots = engine_slots_used();
    for (uint32_t i = 0; i < slots; i++) {
        Slot *slot = &engine_slots[i];
        int state = atomic_load_explicit(&slot->state, memory_order_acquire);
        if (state == SLOT_FREE || slot->ring == NULL) continue;
        uint64_t head = atomic_load_explicit(&slot->head, memory_order_acquire);
        uint64_t tail = atomic_load_explicit(&slot->tail, memory_order_relaxed);
        StagedSlot *staged = &out[nslots];
        staged->slot = i;
        staged->count = 0;
        staged->offset = used;
        staged->ended = state == SLOT_ENDED;
        while (tail < head) {
            RecordHeader *record = (RecordHeader *)(slot->ring + (tail & (slot->cap - 1)));
            uint64_t bytes = (uint64_t)record->words * 8;
            if (bytes == 0 || bytes > head - tail) { /* never written so: drop what is left */
                atomic_fetch_add(&engine.torn_records, 1);
                tail = head;
                break;
            }
            if (record->kind != REC_PAD) {
                if (stage(used, bytes) != 0) break;
                memcpy(staging + used, record, bytes);
                RawFrame *frames = (RawFrame *)(staging + used + sizeof(RecordHeader));
                for (uint32_t f = 0; f < record->depth - record->common; f++)
                    pin(&frames[f]);
                used += bytes;
                staged->count++;
            }
            tail += bytes;
        }
        atomic_store_explicit(&slot->tail, tail, memory_order_release);
        staged->bytes = used - staged->offset;
        if (staged->count || staged->ended || !slot->reported) nslots++;
    }
    engine_unlock();
    return nslots;
}

/* -- phase 3: resolved frames (the entries: entries.c) ------------------------------------------ */

uint64_t engine_frame_ip(RawFrame *frame, int64_t unknown_fid, int64_t truncated_fid) {
    if (frame->code == CODE_TRUNCATED) return (uint64_t)truncated_fid << 32;
    if (frame->code == CODE_GC) return (uint64_t)(engine_gc_fid >= 0 ? engine_gc_fid : unknown_fid) << 32;
    if (IS_TASK(frame->code)) return ENGINE_TASK_BIT | TASK_ADDRESS(frame->code);
    if (IS_NATIVE(frame->code)) return engine_native_ip(frame->instr, NATIVE_OFFSET(frame->code));
    CodeEntry *entry = code_find(frame->code);
    if (entry == NULL || entry->code == NULL || entry->check != frame->check || entry->fid < 0)
        return (uint64_t)unknown_fid << 32;
    if (entry->fid == 0) return 0; /* pyrun's own frames */
    return ((uint64_t)entry->fid << 32) | (uint32_t)line_of(entry->code, frame->instr);
}

/* -- code objects that die while a record names them -------------------------------------------- */

/* Whether a record waiting in a ring names `code` (table lock taken; the handler never takes it,
 * and no drain runs: the caller holds the GIL and drain() copies the rings without releasing it). */
static int pending_names(void *code) {
    int found = 0;
    engine_lock();
    uint32_t used = engine_slots_used();
    for (uint32_t i = 0; i < used && !found; i++) {
        Slot *slot = &engine_slots[i];
        if (atomic_load(&slot->state) == SLOT_FREE || slot->ring == NULL) continue;
        uint64_t head = atomic_load_explicit(&slot->head, memory_order_acquire);
        for (uint64_t at = atomic_load(&slot->tail); at < head && !found;) {
            RecordHeader *record = (RecordHeader *)(slot->ring + (at & (slot->cap - 1)));
            if (record->kind != REC_PAD) {
                RawFrame *frames = (RawFrame *)((uint8_t *)record + sizeof(RecordHeader));
                for (uint32_t f = 0; f < record->depth - record->common && !found; f++)
                    found = frames[f].code == code;
            }
            at += (uint64_t)record->words * 8;
        }
    }
    engine_unlock();
    return found;
}

/* A code object is being destroyed: if a pending record names it, take a reference (pin it as
 * drain() would) and return 1: it stays alive. */
static int keep_if_pending(PyObject *code) {
    if (codes_cap == 0 && !atomic_load(&engine.enabled)) return 0;
    CodeEntry *entry = code_find(code);
    if ((entry != NULL && entry->code != NULL) || !pending_names(code)) return 0;
    if (entry == NULL) entry = code_insert(code);
    if (entry == NULL) return 0;
    entry->code = code;
    entry->check = engine_code_check(code);
    entry->fid = -1;
    Py_INCREF(code);
    note_pending(code);
    return 1;
}

#if PY_VERSION_HEX >= 0x030C0000
/* 3.12+: a code watcher may resurrect the object (code_dealloc checks the reference count after
 * notifying its watchers). */
static int on_code_event(PyCodeEvent event, PyCodeObject *code) {
    if (event == PY_CODE_EVENT_DESTROY) keep_if_pending((PyObject *)code);
    return 0;
}
static int watcher_id = -1;
#else
/* 3.11 has no code watchers: PyCode_Type's deallocator is wrapped instead, and a code object a
 * pending record names is kept (its reference count back at 1, held by the engine). */
static destructor code_dealloc;
static void on_code_dealloc(PyObject *code) {
    Py_SET_REFCNT(code, 1);
    if (keep_if_pending(code)) {
        Py_SET_REFCNT(code, 1); /* the engine's reference is the only one */
        return;
    }
    Py_SET_REFCNT(code, 0);
    code_dealloc(code);
}
#endif

/* -- the module --------------------------------------------------------------------------------- */

static int busy; /* drain() is not reentrant */

static void forget_codes(void) {
    /* detached first: a deallocation below runs the code hook, which must find an empty table */
    CodeEntry *old = codes;
    size_t cap = codes_cap;
    codes = NULL;
    codes_cap = codes_used = 0;
    for (size_t i = 0; i < cap; i++) Py_XDECREF(old[i].code);
    free(old);
    free(lines);
    lines = NULL;
    lines_cap = lines_used = 0;
    pending_used = 0;
}

static int choose_signal(void) {
    for (int signo = SIGRTMIN + 8; signo <= SIGRTMAX - 2; signo++) {
        struct sigaction old;
        if (sigaction(signo, NULL, &old) != 0) continue;
        if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) return signo;
    }
    return -1;
}

PyDoc_STRVAR(start_doc,
"start(cpu_period_ns, wall_period_ns, trace, perf=2, native=True, async_tasks=False)\n"
"    -> signal number\n\n"
"Sample every thread: on its CPU time (a perf_events task-clock counter, or without perf or\n"
"where it is refused a timer on the thread's CPU clock; period 0: none) and on the monotonic\n"
"clock, each delivering a free realtime signal to that thread. Raises OSError when no\n"
"realtime signal is free or the monitor thread cannot start. async_tasks: each sample marks\n"
"its outermost coroutine frame (a task marker, 1 << 62 | the coroutine's address).");

static PyObject *engine_start(PyObject *module, PyObject *args) {
    long long cpu_period, wall_period;
    int trace, use_perf = 2, native = 1, async_tasks = 0;
    if (!PyArg_ParseTuple(args, "LLp|ipp", &cpu_period, &wall_period, &trace, &use_perf, &native,
                          &async_tasks))
        return NULL;
    if (atomic_load(&engine.enabled)) return PyLong_FromLong(engine.signo);
    if (engine.signo == 0) {
        int signo = choose_signal();
        if (signo < 0) {
            PyErr_SetString(PyExc_OSError, "no realtime signal is free for sampling");
            return NULL;
        }
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = engine_on_signal;
        action.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&action.sa_mask);
        sigaddset(&action.sa_mask, SIGTRAP); /* a sample never nests in another (handler.c) */
        if (sigaction(signo, &action, NULL) != 0) return PyErr_SetFromErrno(PyExc_OSError);
        engine.signo = signo;
    }
    engine_guard_faults();
    forget_codes();
    engine_forget_modules();
    atomic_store(&engine.native_ns, 0);
    atomic_store(&engine.native_frames, 0);
    atomic_store(&engine.native_timed, 0);
#if defined(__x86_64__)
    engine.native = native;
#else
    engine.native = 0; /* the native unwinder reads x86-64 call-frame information only */
#endif
    if (engine.native) {
        Py_BEGIN_ALLOW_THREADS
        engine_native_refresh(1);
        Py_END_ALLOW_THREADS
    }
    engine.period_ns[TIMER_CPU] = cpu_period;
    engine.use_perf = use_perf > 0;
    engine_perf_budget();
    engine.use_sigtrap = use_perf > 1 && engine_trap_take() == 0;
    engine.period_ns[TIMER_WALL] = wall_period;
    engine.trace = trace;
    engine.async_tasks = async_tasks;
    engine_account_start();
    atomic_store(&engine.enabled, 1);
    if (engine_threads_start() != 0) {
        atomic_store(&engine.enabled, 0);
        PyErr_SetString(PyExc_OSError, "cannot start the sampling engine's monitor thread");
        return NULL;
    }
    engine_own_stack_bounds(); /* the starting thread was found by the monitor's first scan */
    return PyLong_FromLong(engine.signo);
}

static void block_signal(sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, engine.signo);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

PyDoc_STRVAR(register_doc,
"register_thread(program_ns=-1) -> bool\n\n"
"Measure the calling thread (pyrun's thread hook calls it). ``program_ns``: the thread's CPU\n"
"clock when the hook began, all of it the program's (the thread's start in the interpreter);\n"
"the thread's first record then carries it, and the time since (the hook's own work) is\n"
"pyrun's. -1: the thread's records start now.");

static PyObject *engine_register(PyObject *module, PyObject *args) {
    long long program_ns = -1;
    if (!PyArg_ParseTuple(args, "|L:register_thread", &program_ns)) return NULL;
    if (!atomic_load(&engine.enabled)) Py_RETURN_FALSE;
    pid_t tid = engine_gettid();
    sigset_t old;
    block_signal(&old);
    engine_lock();
    engine_forget_ended(tid);
    int64_t now = engine_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    Slot *slot = engine_slot_for_tid(tid, 0, 0); /* the monitor found it first: from its birth */
    if (slot == NULL) {
        /* Records carry [0, program_ns) and [now, ...): the hook's own work is pyrun's. */
        int split = program_ns >= 0 && program_ns <= now;
        slot = engine_slot_for_tid(tid, 1, split ? now - program_ns : now);
        if (slot != NULL && split) engine.account.own_window_ns += now - program_ns;
    }
    int ok = slot != NULL;
    if (ok) {
        slot->python = 1;
        atomic_store(&slot->ident, (unsigned long)pthread_self());
        engine_stack_bounds(&slot->stack_lo, &slot->stack_hi);
        ok = engine_arm(slot, TIMER_CPU) == 0 && engine_arm(slot, TIMER_WALL) == 0;
    }
    engine_unlock();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(thread_end_doc,
"thread_end() -> bool\n\n"
"The calling thread ends: stop its timers and record its time since its last sample at the\n"
"last sample's stack. drain() then returns its last entries, marked ended.");

static PyObject *engine_thread_end(PyObject *module, PyObject *unused) {
    if (engine.signo == 0) Py_RETURN_FALSE;
    pid_t tid = engine_gettid();
    sigset_t old;
    block_signal(&old);
    engine_lock();
    engine_mark_ended(tid);
    Slot *slot = engine_slot_for_tid(tid, 0, 0);
    if (slot != NULL) {
        engine_disarm(slot);
        engine_append_tail(slot, engine_clock_ns(CLOCK_THREAD_CPUTIME_ID),
                           engine_clock_ns(CLOCK_MONOTONIC), engine_clock_ns(CLOCK_REALTIME));
        atomic_store(&slot->state, SLOT_ENDED);
    }
    engine_unlock();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return PyBool_FromLong(slot != NULL);
}

PyDoc_STRVAR(exclude_doc,
"exclude_thread(tid)\n\nNever sample kernel thread `tid` (pyrun's own threads); drop its slot.");

static PyObject *engine_exclude(PyObject *module, PyObject *arg) {
    long tid = PyLong_AsLong(arg);
    if (tid == -1 && PyErr_Occurred()) return NULL;
    engine_lock();
    Slot *slot = engine_slot_for_tid((pid_t)tid, 0, 0);
    engine_account_exclude((pid_t)tid, slot);
    if (slot != NULL) {
        engine_disarm(slot);
        /* another thread's handler may be writing its ring: let it finish before the slot can
         * be handed to a new thread */
        if ((pid_t)tid != engine_gettid())
            for (int spins = 0; atomic_load(&engine.in_handler) != 0 && spins < 100000; spins++)
                sched_yield();
        engine_free_slot(slot);
    }
    engine_unlock();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(stop_doc,
"stop()\n\nStop sampling: delete every timer, wait for running handlers, record each live\n"
"thread's time since its last sample (threads whose CPU clock can still be read), and discard\n"
"signals still pending. drain() then returns everything, every thread marked ended.");

static PyObject *engine_stop(PyObject *module, PyObject *unused) {
    if (!atomic_load(&engine.enabled)) Py_RETURN_NONE;
    atomic_store(&engine.enabled, 0);
    Py_BEGIN_ALLOW_THREADS
    engine_threads_stop();
    engine_lock();
    for (uint32_t i = 0; i < ENGINE_MAX_SLOTS; i++)
        if (atomic_load(&engine_slots[i].state) == SLOT_LIVE) engine_disarm(&engine_slots[i]);
    engine_unlock();
    for (int spins = 0; atomic_load(&engine.in_handler) != 0 && spins < 1000000; spins++)
        sched_yield();
    int64_t wall = engine_clock_ns(CLOCK_MONOTONIC), now = engine_clock_ns(CLOCK_REALTIME);
    engine_lock();
    for (uint32_t i = 0; i < ENGINE_MAX_SLOTS; i++) {
        Slot *slot = &engine_slots[i];
        if (atomic_load(&slot->state) != SLOT_LIVE) continue;
        int64_t cpu = engine_clock_ns(engine_thread_cpu_clock(slot->tid));
        engine_append_tail(slot, cpu < 0 ? 0 : cpu, wall, now);
        atomic_store(&slot->state, SLOT_ENDED);
    }
    engine_unlock();
    engine_account_stop();
    /* Discard the engine's signals still pending anywhere (a perf counter's overflow queued just
     * before it was closed): ignoring a signal discards its pending instances, in every thread.
     * One pending at an exec would kill the new program (its disposition is then SIG_DFL). */
    struct sigaction ours, ignore;
    memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    if (sigaction(engine.signo, &ignore, &ours) == 0) sigaction(engine.signo, &ours, NULL);
    engine_trap_discard();
    engine_native_free_retired();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyDoc_STRVAR(take_sigtrap_doc,
"take_sigtrap(default=False)\n\nAfter the program set a SIGTRAP disposition of its own\n"
"(signal.signal): put the engine's handler first again, which passes every SIGTRAP that is not\n"
"one of its samples on to that disposition (default: to SIGTRAP's default action instead).");

static PyObject *engine_take_sigtrap(PyObject *module, PyObject *args) {
    int to_default = 0;
    if (!PyArg_ParseTuple(args, "|p", &to_default)) return NULL;
    if (engine_trap_displaced() && engine_trap_take() != 0) return PyErr_SetFromErrno(PyExc_OSError);
    engine_trap_pass_on(to_default);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(program_traps_doc,
"program_traps() -> int\n\nSIGTRAPs the engine passed on to the program's disposition since\n"
"the last call (pyrun's Python handler for SIGTRAP runs the program's only for those).");

static PyObject *engine_program_traps(PyObject *module, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(engine_trap_passed());
}

PyDoc_STRVAR(sigtrap_taken_doc,
"sigtrap_taken() -> bool\n\nWhether the engine's handler is on SIGTRAP in this process (it\n"
"sampled through SIGTRAP counters once): it then passes the program's SIGTRAPs on.");

static PyObject *engine_sigtrap_taken(PyObject *module, PyObject *unused) {
    return PyBool_FromLong(engine_trap_taken());
}

PyDoc_STRVAR(poison_doc,
"poison_next_sample()\n\nFor tests: the next sample of any thread reads an unmapped page, as a\n"
"frame chain read at the wrong moment can; the fault must be caught (stats()['faults']).");

static PyObject *engine_poison(PyObject *module, PyObject *unused) {
    long page = sysconf(_SC_PAGESIZE);
    void *address = mmap(NULL, (size_t)page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    munmap(address, (size_t)page); /* nothing maps it again before the sample, almost surely */
    atomic_store(&engine.poison, (uintptr_t)address);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(drain_doc,
"drain(register, unknown_fid, truncated_fid, load_module=None, gc_fid=-1)\n"
"    -> [(ident, tid, python, ended, entries)]\n\n"
"Take every record out of the rings (call with the GIL, from one thread at a time).\n"
"gc_fid names the frame of a sample taken inside a garbage collection (gc_callback).\n"
"register(code) -> fid names a code object first seen (0: a frame to leave out);\n"
"load_module(path) -> lm id a native module first seen (0: leave its frames out). Each entry\n"
"is (common, ips, timer, gil, cpu_ns, wall_ns, time_ns): the path is the previous entry's\n"
"first `common` frames followed by `ips` (outermost first): fid << 32 | line for a Python\n"
"frame, 1 << 63 | lm << 48 | offset for a native one, 1 << 62 | address for a task\n"
"marker (async_tasks). timer: 0 CPU, 1 wall,\n"
"2 a thread's end (both deltas); gil: 0 no Python thread, 1 held, 2 waiting, 3 released.");

static int resolve_pending(PyObject *callback) {
    for (size_t i = 0; i < pending_used; i++) {
        CodeEntry *entry = code_find(pending_keys[i]);
        if (entry == NULL || entry->code == NULL || entry->fid >= 0) continue;
        PyObject *code = entry->code;
        Py_INCREF(code);
        PyObject *fid = PyObject_CallOneArg(callback, code);
        Py_DECREF(code);
        if (fid == NULL) return -1;
        long long value = PyLong_AsLongLong(fid);
        Py_DECREF(fid);
        if (value == -1 && PyErr_Occurred()) return -1;
        entry = code_find(pending_keys[i]); /* the callback may have grown the table */
        if (entry != NULL) entry->fid = value;
    }
    pending_used = 0;
    return 0;
}

static PyObject *engine_drain(PyObject *module, PyObject *args) {
    PyObject *callback, *load_module = Py_None;
    long long unknown_fid, truncated_fid, gc_fid = -1;
    if (!PyArg_ParseTuple(args, "OLL|OL", &callback, &unknown_fid, &truncated_fid, &load_module,
                          &gc_fid))
        return NULL;
    engine_gc_fid = gc_fid;
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError, "drain() is already running");
        return NULL;
    }
    busy = 1;
    PyObject *result = NULL;
    static StagedSlot staged[ENGINE_MAX_SLOTS]; /* drain() runs once at a time */
    if (engine.native) {
        Py_BEGIN_ALLOW_THREADS
        engine_native_refresh(0); /* modules dlopen'ed since: named before their frames */
        Py_END_ALLOW_THREADS
    }
    engine_guard_faults(); /* first again, if faulthandler.enable() or another took SIGSEGV */
    Py_ssize_t nslots = stage_rings(staged);
    if (resolve_pending(callback) < 0 || engine_resolve_modules(load_module) < 0) goto done;
    result = PyList_New(0);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < nslots; i++) {
        Slot *slot = &engine_slots[staged[i].slot];
        PyObject *entries = engine_slot_entries(slot, staging + staged[i].offset, staged[i].bytes,
                                                staged[i].count, unknown_fid, truncated_fid);
        if (entries == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        int report = PyList_GET_SIZE(entries) > 0 || (staged[i].ended && slot->reported);
        if (report) {
            slot->reported = 1;
            PyObject *item = Py_BuildValue(
                "(kiiiN)", atomic_load(&slot->ident), (int)slot->tid, slot->python,
                staged[i].ended, entries);
            if (item == NULL || PyList_Append(result, item) < 0) {
                Py_XDECREF(item);
                Py_CLEAR(result);
                goto done;
            }
            Py_DECREF(item);
        } else {
            Py_DECREF(entries);
        }
        if (staged[i].ended) {
            engine_lock();
            engine_free_slot(slot);
            engine_unlock();
        }
    }
done:
    busy = 0;
    return result;
}

PyDoc_STRVAR(after_fork_doc,
"after_fork_child()\n\nIn a forked child: forget the parent's threads, timers and code objects.");

static PyObject *engine_after_fork(PyObject *module, PyObject *unused) {
    atomic_store(&engine.enabled, 0);
    forget_codes();
    engine_forget_modules();
    busy = 0;
    Py_RETURN_NONE;
}

static PyObject *engine_stats(PyObject *module, PyObject *unused) {
    unsigned long long samples = 0, dropped = 0;
    int live = 0;
    for (uint32_t i = 0; i < ENGINE_MAX_SLOTS; i++) {
        Slot *slot = &engine_slots[i];
        samples += slot->samples;
        dropped += slot->dropped;
        live += atomic_load(&slot->state) == SLOT_LIVE;
    }
    PyObject *stats = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:i,s:i,s:i,s:K,s:L,s:K,s:K,s:K}", "faults",
        (unsigned long long)atomic_load(&engine.faults), "misdelivered",
        (unsigned long long)atomic_load(&engine.misdelivered), "samples", samples, "dropped",
        dropped, "unknown_frames", (unsigned long long)atomic_load(&engine.unknown_frames),
        "bad_stacks", (unsigned long long)atomic_load(&engine.bad_stacks), "torn_records",
        (unsigned long long)atomic_load(&engine.torn_records), "live_threads", live,
        "signal", engine.signo, "sigtrap", engine.use_sigtrap, "perf_threads",
        atomic_load(&engine.perf_threads), "perf_max", engine.perf_max, "perf_refused",
        (unsigned long long)atomic_load(&engine.perf_refused), "file_limit",
        (long long)engine.file_limit, "native_ns",
        (unsigned long long)atomic_load(&engine.native_ns), "native_frames",
        (unsigned long long)atomic_load(&engine.native_frames), "native_timed",
        (unsigned long long)atomic_load(&engine.native_timed));
    if (stats != NULL && engine_account_stats(stats) < 0) Py_CLEAR(stats);
    return stats;
}

static PyMethodDef methods[] = {
    {"start", engine_start, METH_VARARGS, start_doc},
    {"register_thread", engine_register, METH_VARARGS, register_doc},
    {"thread_end", engine_thread_end, METH_NOARGS, thread_end_doc},
    {"exclude_thread", engine_exclude, METH_O, exclude_doc},
    {"stop", engine_stop, METH_NOARGS, stop_doc},
    {"own_thread_end", engine_own_thread_end, METH_NOARGS,
     "own_thread_end() -> bool: one of pyrun's own (excluded) threads ends: count its CPU time."},
    {"own_cpu", engine_own_cpu, METH_O,
     "own_cpu(ns): CPU time a program thread spent on pyrun's work after its thread_end()."},
    {"poison_next_sample", engine_poison, METH_NOARGS, poison_doc},
    {"take_sigtrap", engine_take_sigtrap, METH_VARARGS, take_sigtrap_doc},
    {"program_traps", engine_program_traps, METH_NOARGS, program_traps_doc},
    {"sigtrap_taken", engine_sigtrap_taken, METH_NOARGS, sigtrap_taken_doc},
    {"drain", engine_drain, METH_VARARGS, drain_doc},
    {"gc_callback", engine_gc_callback, METH_VARARGS,
     "gc_callback(phase, info): for gc.callbacks; samples inside a collection get a <gc> frame"},
    {"restart_paths", engine_restart_paths, METH_NOARGS,
     "restart_paths(): each thread's next drained batch names its whole path (after a mark)."},
    {"after_fork_child", engine_after_fork, METH_NOARGS, after_fork_doc},
    {"stats", engine_stats, METH_NOARGS, "stats() -> dict: samples, dropped, unknown frames..."},
    {NULL, NULL, 0, NULL},
};

static void atfork_prepare(void) { engine_lock(); }
static void atfork_parent(void) { engine_unlock(); }
static void atfork_child(void) {
    engine_after_fork_child();
    engine_native_after_fork_child();
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_engine",
    "pyrun's sampling engine: per-thread timers, a signal handler that reads the interrupted\n"
    "thread's Python frames, lock-free rings (docs/pyrun.md).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__engine(void) {
    static int initialised;
    if (!initialised) {
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        initialised = 1;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (watcher_id < 0) {
        watcher_id = PyCode_AddWatcher(on_code_event);
        if (watcher_id < 0) return NULL;
    }
#else
    if (code_dealloc == NULL) {
        code_dealloc = PyCode_Type.tp_dealloc;
        PyCode_Type.tp_dealloc = on_code_dealloc;
    }
#endif
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "MAX_DEPTH", ENGINE_MAX_DEPTH) < 0 ||
        PyModule_AddIntConstant(module, "GIL_NO_PYTHON", GIL_NO_PYTHON) < 0 ||
        PyModule_AddIntConstant(module, "GIL_HELD", GIL_HELD) < 0 ||
        PyModule_AddIntConstant(module, "GIL_WAITING", GIL_WAITING) < 0 ||
        PyModule_AddIntConstant(module, "GIL_RELEASED", GIL_RELEASED) < 0 ||
        PyModule_AddIntConstant(module, "NATIVE_SUPPORTED", NATIVE_SUPPORTED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

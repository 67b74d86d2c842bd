/* pyrun's sampling engine: the signal handler, which runs on the sampled thread itself.
 *
 * Async-signal-safe throughout: no allocation, no lock, no Python call that could run code or
 * take a lock (PyGILState_GetThisThreadState and the "current thread state" getters read
 * thread-local storage only), errno saved and restored. Structure layouts come from this
 * interpreter's own internal headers (Py_BUILD_CORE_MODULE): the extension is compiled per
 * interpreter, so they are the running version's.
 *
 * Reading the thread's own frames from a handler on that thread is what faulthandler's
 * traceback dump does. A frame can be half pushed or half popped at the interrupt, so every
 * pointer followed is checked: frames and code objects non-null and aligned, the code object's
 * type is PyCode_Type before any code field is read, the instruction pointer lies inside the
 * code, the chain is bounded. Frames that have not started (incomplete) and the C-stack shim
 * frames of 3.12+ are skipped, as CPython's own frame walkers skip them.
 */
#define Py_BUILD_CORE_MODULE 1
#include <Python.h>
#include "internal/pycore_frame.h"
#include "internal/pycore_gil.h"
#include "internal/pycore_pystate.h"
#include "internal/pycore_runtime.h"
#if PY_VERSION_HEX >= 0x030C0000
#include "internal/pycore_interp.h"
#endif

#include <errno.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <string.h>
#include <ucontext.h>

#include "engine.h"
#include "pyframes.h" /* the one reader of CPython's frames (the CUPTI hook's too) */

Engine engine;
Slot engine_slots[ENGINE_MAX_SLOTS];
_Atomic uint64_t engine_fd_slot[ENGINE_FD_TABLE];

int64_t engine_clock_ns(clockid_t clock) {
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* -- the interpreter's state, per version ----------------------------------------------------- */

/* The thread state the GIL is attached to in this thread (NULL while detached). */
static inline PyThreadState *attached_tstate(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#elif PY_VERSION_HEX >= 0x030C0000
    return _PyThreadState_GetCurrent();
#else
    return _PyThreadState_UncheckedGet(); /* _PyRuntime.gilstate.tstate_current: the holder */
#endif
}

static inline struct _gil_runtime_state *gil_of(PyThreadState *tstate) {
#if PY_VERSION_HEX >= 0x030C0000
    PyInterpreterState *interp = tstate->interp;
    return interp == NULL ? NULL : interp->ceval.gil;
#else
    (void)tstate;
    return &_PyRuntime.ceval.gil;
#endif
}

uint32_t engine_code_check(void *object) {
    PyCodeObject *code = (PyCodeObject *)object;
    uint64_t h = (uint64_t)(uintptr_t)code->co_name * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uintptr_t)code->co_filename * 0xC2B2AE3D27D4EB4Full;
    h ^= (uint64_t)(uint32_t)code->co_firstlineno * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    return (uint32_t)h ^ (uint32_t)(h >> 32);
}

/* -- the GIL state ------------------------------------------------------------------------------ */

/* Whether the interrupted thread is blocked in a futex call on the GIL's mutex or condition
 * variable (inside take_gil, or drop_gil's wait for the next holder): the futex address is the
 * first argument register, and the interrupted instruction is the system call (restarted: at
 * it; interrupted: after it). No unwinding, no symbols: it works on a stripped interpreter. */
static int blocked_on_gil(PyThreadState *tstate, void *context) {
    struct _gil_runtime_state *gil = gil_of(tstate);
    if (gil == NULL || context == NULL) return 0;
    const ucontext_t *uc = (const ucontext_t *)context;
    uintptr_t lo = (uintptr_t)gil, hi = lo + sizeof(*gil);
#if defined(__x86_64__)
    uintptr_t address = (uintptr_t)uc->uc_mcontext.gregs[REG_RDI];
    const uint8_t *pc = (const uint8_t *)uc->uc_mcontext.gregs[REG_RIP];
    if (address < lo || address >= hi) return 0;
    if (pc[0] == 0x0f && pc[1] == 0x05) return 1; /* at `syscall` (being restarted) */
    if (((uintptr_t)pc & 0xfff) >= 2 && pc[-2] == 0x0f && pc[-1] == 0x05) return 1;
    return 0;
#elif defined(__aarch64__)
    uintptr_t address = (uintptr_t)uc->uc_mcontext.regs[0];
    const uint32_t *pc = (const uint32_t *)uc->uc_mcontext.pc;
    if (address < lo || address >= hi) return 0;
    if (pc[0] == 0xd4000001u) return 1; /* svc #0 */
    if (((uintptr_t)pc & 0xfff) >= 4 && pc[-1] == 0xd4000001u) return 1;
    return 0;
#else
    (void)uc; (void)lo; (void)hi;
    return 0;
#endif
}

static int gil_state(PyThreadState *tstate, void *context) {
    if (tstate == NULL) return GIL_NO_PYTHON;
    if (attached_tstate() == tstate) return GIL_HELD;
    return blocked_on_gil(tstate, context) ? GIL_WAITING : GIL_RELEASED;
}

/* -- the stack ---------------------------------------------------------------------------------- */

/* This sample's Python frames into slot->python (innermost first), at most `limit` of them
 * (*truncated: frames beyond it were left out); *gc_at: the index of `gc_frame` (the frame that
 * ran when a collection began) when it is met. group_end[i] is 1 where pyframes[i] is the first
 * frame one invocation of the eval loop ran (3.11: is_entry; 3.12+: the frame above a C-stack
 * shim), which is where native frames interleave. Returns the count, or -1 for a chain that is
 * not one. */
static int read_python(Slot *slot, PyThreadState *tstate, int limit, int *truncated,
                       const void *gc_frame, int *gc_at) {
    _PyInterpreterFrame *top = tstate == NULL ? NULL : pyframe_top(tstate);
    int n = 0;
    int64_t walked = 0;
    *truncated = 0;
    slot->task_at = -1;
    for (_PyInterpreterFrame *f = top; f != NULL; f = f->previous) {
        if (++walked > ENGINE_WALK_LIMIT || ((uintptr_t)f & 7)) return -1;
        if ((const void *)f == gc_frame && *gc_at < 0) *gc_at = n; /* frames < n: the GC's */
        if (pyframe_is_shim(f)) {
            if (n > 0) slot->group_end[n - 1] = 1;
            continue;
        }
        PyCodeObject *code;
        uint32_t instr;
        int ok = pyframe_read(f, &code, &instr);
        if (ok < 0) return -1;
        if (ok == 0) continue;
        if (n >= limit) {
            *truncated = 1;
            continue;
        }
        slot->pyframes[n].code = code;
        slot->pyframes[n].instr = instr;
        slot->pyframes[n].check = engine_code_check(code);
        slot->group_end[n] = (uint8_t)pyframe_is_entry(f);
        if (engine.async_tasks) { /* walking outwards: the last one found is the outermost */
            uintptr_t coro = pyframe_coroutine(f, code);
            if (coro) {
                slot->task_at = n;
                slot->task_coro = coro;
            }
        }
        n++;
    }
    if (n > 0) slot->group_end[n - 1] = 1;
    return n;
}

typedef struct {
    Slot *slot;
    uint32_t depth, old_depth, first_diff;
    int next_python; /* the next Python frame to place (index into slot->pyframes, going inward) */
    int gc_at;       /* CODE_GC goes right after the Python frame of this index (-1: none) */
} Merge;

static void put(Merge *m, void *code, uint32_t instr, uint32_t check) {
    RawFrame *prev = m->slot->prev;
    uint32_t at = m->depth++;
    if (m->first_diff == UINT32_MAX &&
        (at >= m->old_depth || prev[at].code != code || prev[at].instr != instr))
        m->first_diff = at;
    prev[at].code = code;
    prev[at].instr = instr;
    prev[at].check = check;
}

/* The Python frames of the next eval-loop invocation, outermost first; with async-aware
 * samples, a task marker just outside the outermost coroutine frame. */
static void put_group(Merge *m) {
    Slot *slot = m->slot;
    for (int first = 1; m->next_python >= 0; first = 0) {
        if (!first && slot->group_end[m->next_python]) break;
        int at = m->next_python--;
        if (at == slot->task_at) put(m, CODE_TASK(slot->task_coro), 0, 0);
        RawFrame *f = &slot->pyframes[at];
        put(m, f->code, f->instr, f->check);
        if (at == m->gc_at) {
            put(m, CODE_GC, 0, 0);
            m->gc_at = -1;
        }
    }
}

/* Read the thread's stack into slot->prev (outermost first): its Python frames and, with native
 * frames on, its native frames, each eval-loop frame replaced by the Python frames it runs
 * (matched from the innermost: an unwind that stopped early leaves the outer Python frames
 * first), frames of the interpreter's own binary and the vDSO left out, and the thread's entry
 * frames in libc before the first frame kept (docs/pyrun.md, "Native frames"). Keeps the
 * innermost ENGINE_MAX_DEPTH - 1 frames under a CODE_TRUNCATED marker when deeper. Sets *common
 * to the number of outer frames equal to the previous content. Returns the depth, or -1 for a
 * chain that is not one (the slot then keeps an empty stack). */
static int read_stack(Slot *slot, PyThreadState *tstate, void *context, uint32_t *common) {
    int nn = 0;
    if (engine.native) {
        int64_t started = engine_clock_ns(CLOCK_MONOTONIC);
        nn = engine_native_stack(context, slot, slot->native, ENGINE_NATIVE_DEPTH);
        int64_t took = engine_clock_ns(CLOCK_MONOTONIC) - started;
        if (took >= 0 && took < 200000) { /* longer: the thread was preempted meanwhile */
            atomic_fetch_add_explicit(&engine.native_ns, (uint64_t)took, memory_order_relaxed);
            atomic_fetch_add_explicit(&engine.native_timed, 1, memory_order_relaxed);
        }
        atomic_fetch_add_explicit(&engine.native_frames, (uint64_t)nn, memory_order_relaxed);
    }
    int truncated, gc_at = -1;
    int in_gc = tstate != NULL && atomic_load_explicit(&engine_gc_tstate, memory_order_relaxed) ==
                                      (void *)tstate;
    const void *gc_frame = in_gc ? atomic_load_explicit(&engine_gc_frame, memory_order_relaxed)
                                 : NULL;
    /* room for the truncation marker, the <gc> marker and, async-aware, a task marker */
    int room = ENGINE_MAX_DEPTH - 2 - engine.async_tasks - nn;
    int np = read_python(slot, tstate, room, &truncated, gc_frame, &gc_at);
    if (np < 0) return -1;
    if (in_gc && (gc_at < 0 || gc_at >= np)) gc_at = 0; /* no frame of its own: the innermost */
    int groups = 0, evals = 0;
    for (int i = 0; i < np; i++) groups += slot->group_end[i];
    for (int i = 0; i < nn; i++) evals += slot->native[i].eval;
    int matched = groups < evals ? groups : evals, unmatched_evals = evals - matched;
    Merge m = {slot, 0, slot->prev_depth, UINT32_MAX, np - 1, in_gc && np > 0 ? gc_at : -1};
    if (truncated) put(&m, CODE_TRUNCATED, 0, 0);
    for (int g = 0; g < groups - matched; g++) put_group(&m);
    int started = m.depth > 0, interpreter_calls = 0; /* the frame outside is the interpreter's */
    for (int i = nn - 1; i >= 0; i--) {
        NativeFrame *f = &slot->native[i];
        /* the loader called by the interpreter itself is its own work: a libpython's read of a
         * thread-local (__tls_get_addr: the thread state, CPython 3.12+) or its lazy binding */
        int own = f->kind == MOD_INTERPRETER || (f->kind == MOD_LOADER && interpreter_calls);
        int entry = (f->kind == MOD_SYSTEM || f->kind == MOD_LOADER) && !started;
        if (f->eval) {
            if (unmatched_evals > 0) unmatched_evals--;
            else put_group(&m);
            started = 1;
        } else if (!own && !entry && f->kind != MOD_VDSO) {
            put(&m, CODE_NATIVE(f->offset), f->module, 0);
            started = 1;
        }
        interpreter_calls = f->eval || own;
    }
    while (m.next_python >= 0) put_group(&m);
    if (in_gc && np == 0) put(&m, CODE_GC, 0, 0);
    if (m.first_diff == UINT32_MAX) m.first_diff = m.depth < m.old_depth ? m.depth : m.old_depth;
    slot->prev_depth = m.depth;
    *common = m.first_diff;
    return (int)m.depth;
}

/* -- garbage collection (issue #36 item 4) ----------------------------------------------------- */

_Atomic(void *) engine_gc_tstate;
_Atomic(void *) engine_gc_frame;
int64_t engine_gc_fid = -1;

/* gc.callbacks' entry: a collection begins ("start") or ends ("stop") on this thread, with the
 * GIL held. Only this thread's handler compares its thread state with engine_gc_tstate while it
 * is set (a handler on another thread sees another thread state), so no fence but the compiler's
 * is needed: the handler interrupts this very thread. */
PyObject *engine_gc_callback(PyObject *module, PyObject *args) {
    PyObject *phase, *info;
    if (!PyArg_ParseTuple(args, "UO:gc_callback", &phase, &info)) return NULL;
    PyThreadState *tstate = PyThreadState_Get();
    if (PyUnicode_CompareWithASCIIString(phase, "start") == 0) {
        atomic_store_explicit(&engine_gc_frame, (void *)pyframe_top(tstate), memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
        atomic_store_explicit(&engine_gc_tstate, (void *)tstate, memory_order_relaxed);
    } else {
        atomic_store_explicit(&engine_gc_tstate, NULL, memory_order_relaxed);
    }
    Py_RETURN_NONE;
}

/* -- the ring ----------------------------------------------------------------------------------- */

/* Room for `bytes` contiguous bytes; returns where to write (NULL: full) and the head to
 * publish once written. A PAD record fills the end of the buffer when the record does not. */
static uint8_t *ring_reserve(Slot *slot, uint64_t bytes, uint64_t *publish) {
    uint64_t head = atomic_load_explicit(&slot->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&slot->tail, memory_order_acquire);
    uint64_t cap = slot->cap, pos = head & (cap - 1), pad = 0;
    if (slot->ring == NULL || bytes > cap / 2) return NULL;
    if (cap - pos < bytes) pad = cap - pos;
    if (head + pad + bytes - tail > cap) return NULL;
    if (pad) {
        RecordHeader *filler = (RecordHeader *)(slot->ring + pos);
        filler->words = (uint32_t)(pad / 8);
        filler->kind = REC_PAD;
        pos = 0;
    }
    *publish = head + pad + bytes;
    return slot->ring + pos;
}

static int write_record(Slot *slot, int kind, int timer, int gil, uint32_t depth,
                        uint32_t common, int64_t cpu, int64_t wall, int64_t now) {
    int full = slot->force_full && common > 0;
    if (full) common = 0;
    uint32_t nframes = depth - common;
    uint64_t bytes = RECORD_WORDS(nframes) * 8, publish;
    uint8_t *at = ring_reserve(slot, bytes, &publish);
    if (at == NULL) {
        slot->dropped++;
        slot->force_full = 1;
        return 0;
    }
    RecordHeader *header = (RecordHeader *)at;
    header->words = (uint32_t)(bytes / 8);
    header->kind = (uint8_t)kind;
    header->timer = (uint8_t)timer;
    header->gil = (uint8_t)gil;
    header->full = (uint8_t)full;
    header->depth = depth;
    header->common = common;
    header->cpu_ns = cpu;
    header->wall_ns = wall;
    header->time_ns = now;
    if (nframes) memcpy(at + sizeof(RecordHeader), slot->prev + common, nframes * sizeof(RawFrame));
    atomic_store_explicit(&slot->head, publish, memory_order_release);
    slot->force_full = 0;
    slot->samples++;
    return 1;
}

/* A record of the time since the last sample, at the last sample's stack (a thread's end, or
 * the end of measurement). Called with no handler able to run on the slot. */
void engine_append_tail(Slot *slot, int64_t cpu_now, int64_t wall_now, int64_t time_now) {
    int64_t cpu = 0, wall = 0;
    if (engine.period_ns[TIMER_CPU] && cpu_now > slot->last_cpu_ns) cpu = cpu_now - slot->last_cpu_ns;
    if (engine.period_ns[TIMER_WALL] && wall_now > slot->last_wall_ns)
        wall = wall_now - slot->last_wall_ns;
    if (cpu == 0 && wall == 0) return;
    if (write_record(slot, REC_TAIL, NTIMERS, GIL_NO_PYTHON, slot->prev_depth, slot->prev_depth,
                     cpu, wall, time_now)) {
        if (cpu) slot->last_cpu_ns = cpu_now;
        if (wall) slot->last_wall_ns = wall_now;
    }
}

/* -- faults ----------------------------------------------------------------------------------- */

/* The frame chain is read while the interpreter may be rewriting it, and a pointer read a
 * moment before can name memory unmapped since (a data-stack chunk freed as the frame at its
 * start returns: seen as SIGSEGV in pyframe_read under PyTorch at 1 kHz, on the H200 and on the
 * CPU). So the handler reads under a guard: a SIGSEGV or SIGBUS raised on a thread whose guard is
 * set jumps back to take_sample, which counts a bad stack and goes on. Any other fault goes to
 * the handler that was there before ours (faulthandler's, or the default action). */
static struct sigaction previous_segv, previous_bus;

static void on_fault(int signo, siginfo_t *info, void *context) {
    pid_t tid = engine_gettid();
    uint32_t used = engine_slots_used();
    for (uint32_t i = 0; i < used; i++) {
        Slot *slot = &engine_slots[i];
        if (atomic_load_explicit(&slot->guarded, memory_order_relaxed) && slot->tid == tid) {
            atomic_store_explicit(&slot->guarded, 0, memory_order_relaxed);
            siglongjmp(slot->guard, 1); /* SA_NODEFER: no mask to restore */
        }
    }
    const struct sigaction *old = signo == SIGBUS ? &previous_bus : &previous_segv;
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction != NULL) {
        old->sa_sigaction(signo, info, context);
    } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(signo);
    } else { /* the default action, taken when the faulting instruction runs again */
        struct sigaction fallback;
        memset(&fallback, 0, sizeof(fallback));
        fallback.sa_handler = SIG_DFL;
        sigaction(signo, &fallback, NULL);
    }
}

/* Put on_fault first for SIGSEGV and SIGBUS (again, if a handler installed later displaced it:
 * that one is then called for faults that are not ours). Call without the engine's lock. */
void engine_guard_faults(void) {
    static const int signals[2] = {SIGSEGV, SIGBUS};
    for (int i = 0; i < 2; i++) {
        struct sigaction now;
        if (sigaction(signals[i], NULL, &now) != 0) continue;
        if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fault) continue;
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        sigaction(signals[i], &action, signals[i] == SIGBUS ? &previous_bus : &previous_segv);
    }
}

/* -- the handler -------------------------------------------------------------------------------- */

/* The reads that can fault, under the slot's guard: the frame chain's depth (-1 for a bad stack
 * or a caught fault), the GIL state and the frames in common with the last sample. A function of
 * its own, so that no local of the caller lives across the sigsetjmp (gcc's -Wclobbered). */
static __attribute__((noinline)) int guarded_read(Slot *slot, PyThreadState *tstate,
                                                  void *context, int *gil_out,
                                                  uint32_t *common) {
    volatile int gil = GIL_NO_PYTHON;
    volatile int depth = -1;
    if (sigsetjmp(slot->guard, 0) == 0) {
        atomic_store_explicit(&slot->guarded, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
        uintptr_t poison = atomic_load_explicit(&engine.poison, memory_order_relaxed);
        if (poison != 0 && atomic_compare_exchange_strong(&engine.poison, &poison, 0))
            (void)*(volatile const int *)poison; /* a test's unmapped page: faults */
        gil = gil_state(tstate, context);
        depth = read_stack(slot, tstate, context, common);
    } else {
        atomic_fetch_add_explicit(&engine.faults, 1, memory_order_relaxed);
        depth = -1;
    }
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(&slot->guarded, 0, memory_order_relaxed);
    *gil_out = gil;
    return depth;
}

static void take_sample(Slot *slot, int timer, void *context) {
    int64_t cpu = 0, wall = 0, cpu_now = 0, wall_now = 0;
    if (timer == TIMER_CPU) {
        cpu_now = engine_clock_ns(CLOCK_THREAD_CPUTIME_ID);
        cpu = cpu_now - slot->last_cpu_ns;
    } else {
        wall_now = engine_clock_ns(CLOCK_MONOTONIC);
        wall = wall_now - slot->last_wall_ns;
    }
    int64_t now = engine.trace ? engine_clock_ns(CLOCK_REALTIME) : 0;
    PyThreadState *tstate = PyGILState_GetThisThreadState();
    int gil = GIL_NO_PYTHON;
    uint32_t common = 0;
    int depth = guarded_read(slot, tstate, context, &gil, &common);
    if (depth < 0) {
        atomic_fetch_add_explicit(&engine.bad_stacks, 1, memory_order_relaxed);
        slot->prev_depth = 0;
        slot->force_full = 1;
        depth = 0;
        common = 0;
    }
    if (write_record(slot, REC_SAMPLE, timer, gil, (uint32_t)depth, common, cpu, wall, now)) {
        if (timer == TIMER_CPU) slot->last_cpu_ns = cpu_now;
        else slot->last_wall_ns = wall_now;
    }
}

/* A perf counter stays enabled from one overflow to the next: armed with a budget of
 * ENGINE_PERF_BUDGET overflows (PERF_EVENT_IOC_REFRESH), it gets one back per sample here, so a
 * thread that blocks the signal holds at most that many pending and its counter stops until
 * they are handled: never a growing queue of realtime signals eating the user's
 * RLIMIT_SIGPENDING. (A budget of one, the counter stopped at each overflow and restarted here,
 * costs the kernel a cross-call and an hrtimer cancel and restart per sample: about 5 us on the
 * development VM, benchmarks/RESULTS.md.) Every 1 to 15 samples the period is redrawn uniformly
 * in [p/2, 3p/2] (PERF_EVENT_IOC_PERIOD restarts the counter's hrtimer, the same price again): a
 * fixed period would alias with loops whose iterations last about as long (a share of them
 * would never be sampled), as the Python sampler's stratified wake-ups avoided; a phase drawn
 * afresh every few samples spreads the samples over such a loop as well. */
static void rearm_counter(Slot *slot, int fd, int refresh) {
    uint64_t x = slot->random;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    slot->random = x;
    if (slot->redraw_in == 0) {
        uint64_t period = (uint64_t)engine.period_ns[TIMER_CPU];
        uint64_t next = period / 2 + x % (period + 1);
        ioctl(fd, PERF_EVENT_IOC_PERIOD, &next);
        slot->redraw_in = (uint32_t)((x >> 40) % 15);
    } else {
        slot->redraw_in--;
    }
    if (refresh) ioctl(fd, PERF_EVENT_IOC_REFRESH, 1);
}

/* -- counters that signal with SIGTRAP ---------------------------------------------------------- */

/* A perf counter opened with sigtrap=1 signals its own thread with SIGTRAP (si_code TRAP_PERF,
 * si_perf_data its sig_data) on every overflow, through task work run on the thread's return to
 * user space: no interprocessor interrupt (a VM exit on a virtual machine), no fasync and no
 * PERF_EVENT_IOC_REFRESH per sample. SIGTRAP is not a realtime signal, so at most one is
 * pending: a thread that blocks it never queues more. On the development VM a sample cost the
 * program 13-14 us that way against 21-28 us through O_ASYNC (benchmarks/RESULTS.md).
 *
 * SIGTRAP stays the program's: the engine's handler is first, and passes every SIGTRAP that is
 * not a TRAP_PERF of its counters (a breakpoint, a kill, a counter of the program's own) to the
 * disposition the program chose, before pyrun or since (engine_trap_take). A signal of a counter
 * the engine no longer samples with is recognised and dropped, never passed on. */
#ifndef TRAP_PERF
#define TRAP_PERF 6
#endif
static struct sigaction previous_traps[2]; /* the program's disposition, double-buffered */
static _Atomic int previous_at;
static int trap_installed;

/* siginfo_t::si_perf_data (glibc 2.36 does not name it): the word after si_addr. */
static uint64_t trap_data(const siginfo_t *info) {
    uint64_t data;
    memcpy(&data, (const char *)&info->si_addr + sizeof(void *), sizeof(data));
    return data;
}

static _Atomic uint64_t passed_on; /* SIGTRAPs given to the program's disposition */

static void chain_trap(int signo, siginfo_t *info, void *context) {
    const struct sigaction *old = &previous_traps[atomic_load(&previous_at)];
    atomic_fetch_add(&passed_on, 1);
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction != NULL) {
        old->sa_sigaction(signo, info, context);
    } else if (old->sa_handler == SIG_IGN) {
        return;
    } else if (old->sa_handler != SIG_DFL && old->sa_handler != NULL) {
        old->sa_handler(signo);
    } else { /* the default action, as without the engine: blocked in here, delivered on return */
        struct sigaction fallback;
        memset(&fallback, 0, sizeof(fallback));
        fallback.sa_handler = SIG_DFL;
        sigaction(SIGTRAP, &fallback, NULL);
        raise(SIGTRAP);
    }
}

/* Put engine_on_signal first on SIGTRAP, keeping what was there as the program's disposition:
 * at start, after the program set one (signal.signal, through pyrun's hooks), and when the
 * monitor finds that a library displaced it. Each handler blocks the other signal of the
 * engine, so that samples of one thread never nest. */
int engine_trap_take(void) {
    struct sigaction action, old;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = engine_on_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (engine.signo > 0) sigaddset(&action.sa_mask, engine.signo);
    if (sigaction(SIGTRAP, &action, &old) != 0) return -1;
    if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == engine_on_signal) return 0;
    int next = 1 - atomic_load(&previous_at);
    previous_traps[next] = old;
    atomic_store(&previous_at, next);
    trap_installed = 1;
    return 0;
}

/* What the program's disposition is taken to be from now on: what SIGTRAP had before the
 * engine's handler went first again, or its default action (`to_default`: the program asked
 * for SIG_DFL, and pyrun held SIG_IGN meanwhile). Counting what is passed on starts afresh. */
void engine_trap_pass_on(int to_default) {
    if (to_default) {
        int next = 1 - atomic_load(&previous_at);
        memset(&previous_traps[next], 0, sizeof(previous_traps[next]));
        previous_traps[next].sa_handler = SIG_DFL;
        atomic_store(&previous_at, next);
    }
    atomic_store(&passed_on, 0);
}

uint64_t engine_trap_passed(void) { return atomic_exchange(&passed_on, 0); }

int engine_trap_taken(void) { return trap_installed; }

/* Whether SIGTRAP's handler is no longer the engine's (a library of the program set its own). */
int engine_trap_displaced(void) {
    struct sigaction now;
    if (!trap_installed || sigaction(SIGTRAP, NULL, &now) != 0) return 0;
    return !(now.sa_flags & SA_SIGINFO) || now.sa_sigaction != engine_on_signal;
}

/* Discard a SIGTRAP of ours still pending in any thread (before an exec, which would inherit it
 * with SIGTRAP's default action: a core dump). */
void engine_trap_discard(void) {
    if (!trap_installed) return; /* ignoring a signal discards its pending instances, everywhere */
    struct sigaction ours, ignore;
    memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    if (sigaction(SIGTRAP, &ignore, &ours) == 0) sigaction(SIGTRAP, &ours, NULL);
}

void engine_on_signal(int signo, siginfo_t *info, void *context) {
    int saved_errno = errno;
    int trap = signo == SIGTRAP;
    if (trap && (info == NULL || info->si_code != TRAP_PERF ||
                 !(trap_data(info) & ENGINE_FD_VALID))) {
        chain_trap(signo, info, context); /* not one of our counters' */
        errno = saved_errno;
        return;
    }
    atomic_fetch_add(&engine.in_handler, 1); /* seq_cst: engine_stop() reads it after clearing */
    uint64_t value = 0;
    if (trap) {
        value = trap_data(info);
    } else if (info != NULL && info->si_code == SI_TIMER) {
        value = (uint64_t)(uintptr_t)info->si_value.sival_ptr | ENGINE_FD_VALID;
    } else if (info != NULL && (info->si_code == POLL_IN || info->si_code == POLL_HUP) &&
               info->si_fd >= 0 && info->si_fd < ENGINE_FD_TABLE) {
        value = atomic_load_explicit(&engine_fd_slot[info->si_fd], memory_order_acquire);
    }
    if (atomic_load(&engine.enabled) && (value & ENGINE_FD_VALID)) {
        value &= ~ENGINE_FD_VALID;
        uint32_t index = (uint32_t)(value & 0x7fff);
        int timer = (int)((value >> 15) & 1);
        uint64_t gen = value >> 16;
        if (index < ENGINE_MAX_SLOTS) {
            Slot *slot = &engine_slots[index];
            if (atomic_load_explicit(&slot->gen, memory_order_acquire) == gen &&
                atomic_load_explicit(&slot->state, memory_order_acquire) == SLOT_LIVE) {
                unsigned long self = (unsigned long)pthread_self();
                unsigned long known = atomic_load_explicit(&slot->ident, memory_order_relaxed);
                if (known == 0 && engine_gettid() == slot->tid) { /* first sample: check once */
                    atomic_store_explicit(&slot->ident, self, memory_order_relaxed);
                    known = self;
                }
                if (known == self) take_sample(slot, timer, context);
                else atomic_fetch_add(&engine.misdelivered, 1);
                if (trap) rearm_counter(slot, slot->perf_fd, 0);
                else if (info->si_code != SI_TIMER) rearm_counter(slot, info->si_fd, 1);
            }
        }
    }
    atomic_fetch_sub(&engine.in_handler, 1);
    errno = saved_errno;
}

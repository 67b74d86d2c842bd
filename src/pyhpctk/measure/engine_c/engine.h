/* pyrun's sampling engine (pyhpctk.measure._engine): declarations shared by its C files.
 *
 * The engine samples every thread of the process from a signal handler that runs ON the sampled
 * thread (docs/pyrun.md, "Sampling"):
 *
 * - threads.c: one slot per kernel thread, its POSIX timers (timer_create with SIGEV_THREAD_ID:
 *   on the thread's own CPU clock for CPUTIME, on CLOCK_MONOTONIC for wall-clock events), and
 *   the monitor thread that finds threads Python never started (BLAS and OpenMP pools) in
 *   /proc/self/task;
 * - handler.c: the async-signal-safe handler. It reads the thread's clocks, its GIL state and
 *   its chain of _PyInterpreterFrame (code object and instruction offset of every frame, read
 *   with this interpreter's own structure layouts), and appends one record to the slot's ring;
 * - unwind.c, modules.c, natives.c: native frames (issue #17): the handler's eh_frame unwinder,
 *   the table of modules it reads (built outside the handler), and drain()'s naming of them;
 * - account.c: the process's CPU time that no record carries (threads that ended before the
 *   monitor found them, time after a thread's last sample), told at the end of measurement;
 * - module.c: the Python module. drain() moves records out of the rings on a thread that holds
 *   the GIL, turns (code object, instruction) into fid << 32 | line through caches, and hands
 *   the Python side compact batches; a code watcher (3.12+) keeps code objects that a pending
 *   record names alive, and 3.11 validates them instead;
 * - entries.c: drain()'s batches for one thread: records resolved into paths and, without
 *   tracing, each drain's samples grouped by (path, timer, GIL state) into one entry a group.
 *
 * Ring discipline: one producer per ring (the handler on the slot's thread, or code on that
 * thread with the engine's signal blocked, or any thread once every timer is gone and no handler
 * runs), one consumer (drain(), under the GIL). head and tail only grow; records are contiguous
 * (a PAD record fills the end of the buffer when the next record does not fit).
 */
#ifndef PYHPCTK_ENGINE_H
#define PYHPCTK_ENGINE_H

#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define ENGINE_MAX_SLOTS 4096       /* threads measured at once */
#define ENGINE_MAX_DEPTH 2048       /* frames kept per sample: the innermost, under a marker */
#define ENGINE_WALK_LIMIT 1000000   /* a frame chain longer than this is not a chain */
#define ENGINE_RING_BYTES (256 * 1024)

enum { TIMER_CPU = 0, TIMER_WALL = 1, NTIMERS = 2 };

/* GIL state of a thread at a sample (issue #16, item 4). */
enum {
    GIL_NO_PYTHON = 0, /* the thread has no Python thread state */
    GIL_HELD = 1,
    GIL_WAITING = 2,   /* blocked on the GIL's mutex or condition variable */
    GIL_RELEASED = 3,  /* has a thread state, runs without the GIL (a C call, a blocking call) */
};

enum { REC_PAD = 0, REC_SAMPLE = 1, REC_TAIL = 2 };

/* Marker "code objects" of a recorded frame: not objects, never dereferenced. Code objects are
 * 8-byte aligned, so the low bits of RawFrame.code are free to tag other kinds of frames: native
 * frames under the Python ones (issue #17) can be recorded as (pc | tag, 0, 0) in the same
 * records, from the interrupted context the handler already receives (its `context`). */
#define CODE_TRUNCATED ((void *)1) /* the outer frames of a stack deeper than the limit */
/* The garbage collector (issue #36 item 4): the thread was inside a collection at the sample
 * (between gc.callbacks' "start" and "stop", told by engine_gc_callback). It is placed under the
 * Python frame that ran when the collection began, above the frames the collection ran (its
 * finalizers, the native code it called). */
#define CODE_GC ((void *)3)

/* A native frame (unwind.c): code = offset << 3 | CODE_NATIVE_TAG (the offset in its module's
 * own address space), instr = the module's registry id, check = 0. */
#define CODE_NATIVE_TAG 2u
#define CODE_NATIVE(offset) ((void *)(((uintptr_t)(offset) << 3) | CODE_NATIVE_TAG))
#define IS_NATIVE(code) (((uintptr_t)(code) & 7) == CODE_NATIVE_TAG)
#define NATIVE_OFFSET(code) ((uintptr_t)(code) >> 3)
#define ENGINE_NATIVE_DEPTH 256   /* native frames kept per sample: the innermost */

/* A task marker (pyrun --async-aware, issue #37 item 4): code = the address of the coroutine
 * object whose frame is the outermost coroutine frame of the sample | CODE_TASK_TAG, instr 0,
 * check 0, placed just outside that frame. drain() hands it on as ENGINE_TASK_BIT | address, and
 * the Python side puts the chain of tasks awaiting that coroutine's task there. */
#define CODE_TASK_TAG 4u
#define CODE_TASK(coro) ((void *)((uintptr_t)(coro) | CODE_TASK_TAG))
#define IS_TASK(code) (((uintptr_t)(code) & 7) == CODE_TASK_TAG)
#define TASK_ADDRESS(code) ((uintptr_t)(code) & ~(uintptr_t)7)
#define ENGINE_TASK_BIT (1ull << 62)
#define ENGINE_NO_MODULE 0xffffffffu

/* One frame as the handler reads it. check: a fingerprint of the code object (its co_name and
 * co_filename pointers and first line), with which drain() recognises a code object that died
 * and was replaced at the same address (3.11, which has no code watchers). */
typedef struct {
    void *code;
    uint32_t instr; /* instruction offset in code units */
    uint32_t check;
} RawFrame;

/* A record in a ring: this header, then `depth - common` frames, outermost first. */
typedef struct {
    uint32_t words;  /* size in 8-byte words, header included */
    uint8_t kind;    /* REC_* */
    uint8_t timer;   /* TIMER_* that fired */
    uint8_t gil;     /* GIL_* */
    uint8_t full;    /* 1: common is 0 because the previous record was lost */
    uint32_t depth;  /* frames of the whole stack */
    uint32_t common; /* outer frames equal to the previous record's */
    int64_t cpu_ns;  /* thread CPU time since the previous CPU-timer record */
    int64_t wall_ns; /* wall-clock time since the previous wall-timer record */
    int64_t time_ns; /* CLOCK_REALTIME at the sample (traces) */
} RecordHeader;

#define RECORD_WORDS(nframes) \
    ((sizeof(RecordHeader) + (size_t)(nframes) * sizeof(RawFrame) + 7) / 8)

enum { SLOT_FREE = 0, SLOT_LIVE = 1, SLOT_ENDED = 2 };

typedef struct Slot {
    _Atomic uint64_t gen;   /* bumped when the slot is freed: a stale timer signal is ignored */
    _Atomic int state;      /* SLOT_* */
    pid_t tid;
    int python;             /* registered by the thread itself through pyrun's hooks */
    _Atomic unsigned long ident; /* pthread_self() of the thread, 0 until known */
    timer_t timers[NTIMERS];
    int armed[NTIMERS];
    int perf_fd;            /* the CPU "timer" as a perf_events task-clock counter, or -1 */
    int perf_trap;          /* ... that raises SIGTRAP (sigtrap=1) */
    int perf_refused;       /* a timer instead, near the open-file limit (counted once) */
    /* producer side (the handler on the thread) */
    int64_t last_cpu_ns;
    int64_t last_wall_ns;
    int64_t cpu_baseline;   /* last_cpu_ns when the slot was taken: records carry the rest */
    RawFrame *prev;         /* the stack of the last record written, outermost first */
    RawFrame *pyframes;     /* scratch: this sample's Python frames, innermost first */
    uint8_t *group_end;     /* scratch: 1 where pyframes[i] is the first frame of an eval call */
    int task_at;            /* scratch: pyframes[task_at] is the outermost coroutine frame (-1) */
    uintptr_t task_coro;    /* scratch: ... of this coroutine object (async-aware only) */
    struct NativeFrame *native; /* scratch: this sample's native frames, innermost first */
    uintptr_t stack_lo, stack_hi; /* the thread's stack, when it registered itself (else 0) */
    struct Recipe *recipes; /* the handler's cache of CFA rule rows (unwind.c) */
    uint32_t prev_depth;
    int force_full;
    uint64_t dropped;       /* samples not written: the ring was full (deltas carried) */
    uint64_t random;        /* xorshift state: the CPU period is drawn in [p/2, 3p/2] */
    uint32_t redraw_in;     /* samples before the next draw of the CPU period */
    uint64_t samples;
    /* the ring */
    uint8_t *ring;
    uint64_t cap;           /* bytes, a power of two */
    _Atomic uint64_t head;  /* producer: bytes written */
    _Atomic uint64_t tail;  /* consumer: bytes read */
    /* consumer side (drain(), under the GIL) */
    uint32_t *resolved_at;  /* per raw depth: resolved frames above it */
    uint64_t *resolved_ip;  /* the resolved path, outermost first */
    uint32_t resolved_depth;
    uint32_t raw_depth;
    int reported;           /* the Python side knows this thread */
    int restart;            /* the next batch's first entry names its whole path (a mark) */
    _Atomic int guarded;    /* the handler reads the thread's frames: a fault jumps to guard */
    sigjmp_buf guard;
} Slot;

#define ENGINE_MAX_EXCLUDED 8

/* The process's CPU time over measurement windows (start() to stop()), split (account.c). Read
 * and written under the table lock, never in the handler. */
typedef struct {
    int64_t process_start;   /* CLOCK_PROCESS_CPUTIME_ID at start() */
    int64_t sampled_start;   /* engine_sampled_ns() at start() */
    int64_t freed_ns;        /* CPU that the records of freed slots carried (this process) */
    int64_t own_window_ns;   /* CPU of pyrun's own threads closed in this window */
    int64_t monitor_cpu_ns;  /* the monitor thread's CPU clock when it ended */
    int64_t own_base[ENGINE_MAX_EXCLUDED], own_last[ENGINE_MAX_EXCLUDED];
    int own_active[ENGINE_MAX_EXCLUDED];
    /* over the windows closed in this process that sampled CPU time */
    int64_t process_ns, sampled_ns, own_ns;
    int cpu_windows;
} CpuAccount;

typedef struct {
    _Atomic int enabled;       /* the handler records only while set */
    int native;                /* record native frames (issue #17) */
    int async_tasks;           /* mark each sample's outermost coroutine frame (issue #37) */
    _Atomic int in_handler;    /* handlers running now (stop() waits for 0) */
    int signo;
    int trace;
    int64_t period_ns[NTIMERS]; /* 0: that timer is not used */
    int use_perf;              /* CPU sampling through perf_events task-clock (else timers) */
    int use_sigtrap;           /* those counters signal with SIGTRAP (sigtrap=1, Linux 5.13+) */
    _Atomic int perf_threads;  /* threads sampled through perf_events now */
    int perf_max;              /* counters held at most: a share of the open-file limit */
    long file_limit;           /* RLIMIT_NOFILE's soft limit when sampling began (-1: none) */
    _Atomic uint64_t perf_refused; /* threads sampled by a timer as a counter's descriptor
                                      would have come near the open-file limit */
    pid_t monitor_tid;
    pid_t excluded_tid[ENGINE_MAX_EXCLUDED]; /* pyrun's own threads (the drain thread) */
    int nexcluded;
    pid_t ended_tid[ENGINE_MAX_SLOTS]; /* threads past thread_end(), still running: never
                                          re-adopted (as many as can be measured at once) */
    int nended;
    _Atomic uint64_t unknown_frames; /* frames whose code object was gone before drain() */
    _Atomic uint64_t bad_stacks;     /* samples whose frame chain failed a check (3.12: a sample
                                        inside the eval loop's entry, before it sets its
                                        cframe's current frame, reads stack garbage) */
    _Atomic uint64_t torn_records;   /* records of length 0 or past the head: two writers in
                                        one ring (never, handlers do not nest) */
    _Atomic uint64_t misdelivered;   /* signals that reached another thread than the slot's */
    _Atomic uint64_t native_ns;      /* time spent unwinding native stacks (monotonic clock) */
    _Atomic uint64_t native_timed;   /* unwinds timed in native_ns (not preempted) */
    _Atomic uint64_t faults;         /* samples whose reads faulted (caught: bad stacks) */
    _Atomic uintptr_t poison;        /* tests: an unmapped address the next sample reads */
    _Atomic uint64_t native_frames;  /* native frames found */
    CpuAccount account;
} Engine;

extern Engine engine;
extern Slot engine_slots[ENGINE_MAX_SLOTS];

/* perf_events counters: the slot value (as in si_value) of each file descriptor, bit 63 set. */
#define ENGINE_FD_TABLE 65536
#define ENGINE_FD_VALID (1ull << 63)
#define ENGINE_PERF_MAX_THREADS 256 /* beyond: timers (each counter holds a file descriptor) */
/* Counters hold at most 1/ENGINE_PERF_LIMIT_SHARE of the open-file limit, and none is opened
 * while the process's descriptors reach into the last 1/ENGINE_PERF_HEADROOM of it: the program
 * keeps (almost) the headroom it has without pyrun. */
#define ENGINE_PERF_LIMIT_SHARE 16
#define ENGINE_PERF_HEADROOM 8
#define ENGINE_PERF_BUDGET 2 /* overflows a counter may signal before the handler has run */
extern _Atomic uint64_t engine_fd_slot[ENGINE_FD_TABLE];

/* -- native frames (unwind.c) ----------------------------------------------------------------- */

/* MOD_LOADER: the dynamic loader (ld.so), a system module whose frames the interpreter's own
 * calls into it (__tls_get_addr for its thread-locals, lazy binding) are the interpreter's. */
enum { MOD_OTHER = 0, MOD_INTERPRETER = 1, MOD_SYSTEM = 2, MOD_VDSO = 3, MOD_LOADER = 4 };
#define ENGINE_MODULE_SEGS 6
#define ENGINE_CFA_STACK 8
#define NREGS 17 /* x86-64 DWARF registers 0-15 and the return address (16) */

typedef struct NativeFrame {
    uintptr_t offset;
    uint32_t module;  /* registry id */
    uint8_t kind;     /* MOD_* */
    uint8_t eval;     /* the pc is in _PyEval_EvalFrameDefault */
} NativeFrame;

typedef struct {
    uintptr_t bias, text_lo, text_hi;
    uintptr_t seg_lo[ENGINE_MODULE_SEGS], seg_hi[ENGINE_MODULE_SEGS];
    const uint8_t *eh_hdr;
    uint32_t id;
    uint8_t nseg, kind;
} NativeModule;

typedef struct { uintptr_t lo, hi; } MemRange;

typedef struct NativeTable {
    NativeModule *mods;   /* sorted by text_lo */
    MemRange *maps;       /* readable mappings, sorted */
    uint32_t nmods, nmaps;
    uint32_t gen;         /* a new number per table: keys the threads' caches of rows */
    uintptr_t eval_lo, eval_hi;
    struct NativeTable *next; /* retired tables */
} NativeTable;

typedef struct {
    char *path;
    uintptr_t bias;
    int64_t lm;  /* the session's load-module id, -1 until drain() asks */
    int kind;
} EngineModule;

enum { RULE_UNSPECIFIED = 0, RULE_SAME, RULE_UNDEFINED, RULE_OFFSET, RULE_VAL_OFFSET,
       RULE_REGISTER, RULE_EXPRESSION };
typedef struct { uint8_t how; int64_t value; } Rule;
typedef struct {
    Rule reg[NREGS];
    uint32_t cfa_reg;
    int64_t cfa_off;
    const uint8_t *cfa_expr, *cfa_expr_end;
} Row;
#define ENGINE_RECIPES 256 /* cached CFA rows per thread */
typedef struct Recipe {
    uintptr_t pc;
    uint32_t gen;
    int32_t cfa_off;
    int32_t value[NREGS];
    uint8_t how[NREGS];
    uint8_t cfa_reg;
    const uint8_t *cfa_expr, *cfa_expr_end;
} Recipe;
typedef struct {
    const uint8_t *insns, *insns_end, *cie_insns, *cie_end;
    uintptr_t pc_lo, pc_hi;
    uint64_t code_align;
    int64_t data_align;
    uint32_t ra_reg;
    uint8_t encoding;
} Fde;

extern _Atomic(NativeTable *) engine_native_table;
int engine_native_refresh(int maps); /* 1: the table changed */
int engine_find_fde(const NativeModule *m, uintptr_t pc, Fde *fde);
void engine_native_free_retired(void);
void engine_native_after_fork_child(void);
int engine_native_stack(const void *context, Slot *slot, NativeFrame *out, int max);
int engine_module_info(uint32_t id, char *path, size_t size, int64_t *lm, int *kind);
void engine_module_set_lm(uint32_t id, int64_t lm);
void engine_modules_forget_lms(void);

#if defined(__x86_64__) && defined(__linux__)
#define NATIVE_SUPPORTED 1
#else
#define NATIVE_SUPPORTED 0
#endif

/* module.c, entries.c: drain()'s entries */
uint64_t engine_frame_ip(RawFrame *frame, int64_t unknown_fid, int64_t truncated_fid);
#ifdef Py_PYTHON_H
PyObject *engine_slot_entries(Slot *slot, const uint8_t *at, size_t bytes, uint32_t count,
                              int64_t unknown_fid, int64_t truncated_fid);
PyObject *engine_restart_paths(PyObject *module, PyObject *unused);
#endif

/* natives.c */
void engine_forget_modules(void);
void engine_note_module(uint32_t id);
uint64_t engine_native_ip(uint32_t id, uintptr_t offset);
void engine_stack_bounds(uintptr_t *lo, uintptr_t *hi);
void engine_own_stack_bounds(void);
#ifdef Py_PYTHON_H
int engine_resolve_modules(PyObject *load_module);
#endif

/* handler.c */
extern _Atomic(void *) engine_gc_tstate; /* the thread state collecting garbage now, or NULL */
extern _Atomic(void *) engine_gc_frame;  /* its innermost Python frame when the collection began */
extern int64_t engine_gc_fid;            /* drain(): the fid of CODE_GC frames (-1: unknown code) */
#ifdef Py_PYTHON_H
PyObject *engine_gc_callback(PyObject *module, PyObject *args);
#endif
void engine_on_signal(int signo, siginfo_t *info, void *context);
int engine_trap_take(void);
void engine_trap_pass_on(int to_default);
uint64_t engine_trap_passed(void);
int engine_trap_taken(void);
int engine_trap_displaced(void);
void engine_trap_discard(void);
int engine_handler_init(void);
int64_t engine_clock_ns(clockid_t clock);
void engine_append_tail(Slot *slot, int64_t cpu_now, int64_t wall_now, int64_t time_now);
uint32_t engine_code_check(void *code);

/* account.c (call with the table lock held, except start and stop, which take it) */
void engine_account_start(void);
void engine_account_stop(void);
void engine_account_exclude(pid_t tid, const Slot *slot);
void engine_account_refresh(void);
void engine_account_free(const Slot *slot);
void engine_account_forget(void);
#ifdef Py_PYTHON_H
PyObject *engine_own_thread_end(PyObject *module, PyObject *unused);
PyObject *engine_own_cpu(PyObject *module, PyObject *arg);
int engine_account_stats(PyObject *stats);
#endif

/* threads.c */
int engine_threads_start(void);
void engine_perf_budget(void);
void engine_threads_stop(void);
Slot *engine_slot_for_tid(pid_t tid, int create, int64_t cpu_baseline);
int engine_arm(Slot *slot, int index);
void engine_close_deferred(void);
void engine_disarm(Slot *slot);
void engine_free_slot(Slot *slot);
void engine_mark_ended(pid_t tid);
void engine_forget_ended(pid_t tid);
void engine_lock(void);
uint32_t engine_slots_used(void);
void engine_unlock(void);
void engine_after_fork_child(void);
pid_t engine_gettid(void);
void engine_guard_faults(void);
clockid_t engine_thread_cpu_clock(pid_t tid);

#endif

/* pyrun's sampling engine: slots, per-thread timers and the monitor thread.
 *
 * Each kernel thread that is measured has a slot (engine.h) and one POSIX timer per clock in
 * use: CPUTIME arms a timer on the thread's own CPU clock (MAKE_THREAD_CPUCLOCK(tid, SCHED)),
 * which only advances while that thread runs, so each tick is a period of that thread's CPU
 * time; wall-clock events arm one on CLOCK_MONOTONIC. Both deliver the engine's realtime
 * signal to that thread alone (SIGEV_THREAD_ID), with the slot's index, the timer and the
 * slot's generation in si_value: a signal of a timer deleted in the meantime carries an old
 * generation and is ignored.
 *
 * Python threads arm their own timers when they start (pyrun's thread hook). Every other thread
 * (BLAS and OpenMP pools, threads of C++ libraries) is found by the monitor, a native thread
 * with every signal blocked: it lists /proc/self/task every 20 ms while threads or modules come
 * and go, backing off to every 100 ms once they have not for a while (the number of threads,
 * the link count of the directory, tells the native frames' refresh that stacks came or went
 * before the listing arms the newcomers); a new thread gets a slot and timers, created from
 * the monitor (timer_create may name any thread of the process), and a thread gone from the list is
 * disarmed and marked ended. A thread found after measurement began counts its CPU time from
 * its creation (its clock starts at 0); threads that existed before count from the start.
 *
 * The table lock guards allocation, freeing and the tid lookup; the signal handler never takes
 * it (it reaches its slot through si_value).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine.h"

#define MONITOR_POLL_MIN_NS 20000000ll  /* listing of the threads, while they come and go */
#define MONITOR_POLL_MAX_NS 100000000ll /* ... and once they have not for a while */

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t monitor_thread;
static int monitor_running;
static _Atomic int monitor_stop;
static uint32_t high_water; /* slots [0, high_water) have been used */
static uint64_t random_state = 0x9E3779B97F4A7C15ull;

void engine_lock(void) { pthread_mutex_lock(&table_lock); }
uint32_t engine_slots_used(void) { return high_water; }
void engine_unlock(void) { pthread_mutex_unlock(&table_lock); }

pid_t engine_gettid(void) { return (pid_t)syscall(SYS_gettid); }

/* Linux's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED): the CPU clock of thread `tid`. */
clockid_t engine_thread_cpu_clock(pid_t tid) {
    return (clockid_t)(((~(unsigned int)tid) << 3) | 6u);
}

static uint64_t next_random(void) {
    random_state ^= random_state << 13;
    random_state ^= random_state >> 7;
    random_state ^= random_state << 17;
    return random_state;
}

static int excluded(pid_t tid) {
    if (tid == engine.monitor_tid) return 1;
    for (int i = 0; i < engine.nexcluded; i++)
        if (engine.excluded_tid[i] == tid) return 1;
    return 0;
}

static int slot_buffers(Slot *slot) {
    if (slot->ring == NULL) {
        slot->ring = malloc(ENGINE_RING_BYTES); /* large: mmap'ed, pages touched as used */
        slot->cap = ENGINE_RING_BYTES;
    }
    if (slot->prev == NULL) slot->prev = malloc(ENGINE_MAX_DEPTH * sizeof(RawFrame));
    if (slot->pyframes == NULL) slot->pyframes = malloc(ENGINE_MAX_DEPTH * sizeof(RawFrame));
    if (slot->group_end == NULL) slot->group_end = malloc(ENGINE_MAX_DEPTH);
    if (slot->native == NULL) slot->native = malloc(ENGINE_NATIVE_DEPTH * sizeof(NativeFrame));
    if (slot->recipes == NULL) slot->recipes = calloc(ENGINE_RECIPES, sizeof(Recipe)); /* optional */
    if (slot->resolved_at == NULL)
        slot->resolved_at = malloc((ENGINE_MAX_DEPTH + 1) * sizeof(uint32_t));
    if (slot->resolved_ip == NULL) slot->resolved_ip = malloc(ENGINE_MAX_DEPTH * sizeof(uint64_t));
    return slot->ring && slot->prev && slot->pyframes && slot->group_end && slot->native &&
                   slot->resolved_at && slot->resolved_ip
               ? 0
               : -1;
}

/* The live slot of `tid`; with `create`, a new one (CPU clock counted from cpu_baseline) if it
 * has none. Call with the table lock held. */
Slot *engine_slot_for_tid(pid_t tid, int create, int64_t cpu_baseline) {
    Slot *free_slot = NULL;
    for (uint32_t i = 0; i < high_water; i++) {
        Slot *slot = &engine_slots[i];
        int state = atomic_load(&slot->state);
        if (state == SLOT_LIVE && slot->tid == tid) return slot;
        if (state == SLOT_FREE && free_slot == NULL) free_slot = slot;
    }
    if (!create) return NULL;
    if (free_slot == NULL) {
        if (high_water >= ENGINE_MAX_SLOTS) return NULL;
        free_slot = &engine_slots[high_water++];
    }
    Slot *slot = free_slot;
    if (slot_buffers(slot) != 0) return NULL;
    slot->tid = tid;
    slot->python = 0;
    atomic_store(&slot->ident, 0);
    slot->armed[0] = slot->armed[1] = 0;
    slot->perf_fd = -1;
    slot->perf_refused = 0;
    slot->last_cpu_ns = slot->cpu_baseline = cpu_baseline;
    slot->last_wall_ns = engine_clock_ns(CLOCK_MONOTONIC);
    slot->prev_depth = 0;
    slot->stack_lo = slot->stack_hi = 0;
    slot->force_full = 0;
    slot->dropped = 0;
    slot->samples = 0;
    slot->random = next_random() | 1;
    slot->redraw_in = 0;
    atomic_store(&slot->head, 0);
    atomic_store(&slot->tail, 0);
    slot->resolved_depth = 0;
    slot->raw_depth = 0;
    slot->resolved_at[0] = 0;
    slot->reported = 0;
    atomic_store_explicit(&slot->state, SLOT_LIVE, memory_order_release);
    return slot;
}

/* Whether `fd` is (still) a perf_events file descriptor: the program may have closed ours and
 * reused the number, and then it is not ours to close. */
static int is_perf_fd(int fd) {
    char path[64], target[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0) return 0;
    target[n] = 0;
    return strcmp(target, "anon_inode:[perf_event]") == 0;
}

/* How many counters sampling may hold: ENGINE_PERF_MAX_THREADS, or 1/ENGINE_PERF_LIMIT_SHARE
 * of the open-file limit (RLIMIT_NOFILE's soft one, read when sampling starts) if less. */
void engine_perf_budget(void) {
    struct rlimit limit;
    engine.file_limit = -1;
    engine.perf_max = ENGINE_PERF_MAX_THREADS;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
    engine.file_limit = (long)limit.rlim_cur;
    long share = engine.file_limit / ENGINE_PERF_LIMIT_SHARE;
    if (share < engine.perf_max) engine.perf_max = (int)share;
}

/* Whether a counter's descriptor `fd` (or its failure, -1) says the process is near its
 * open-file limit: out of descriptors, or `fd` in the last 1/ENGINE_PERF_HEADROOM of the
 * limit (the kernel hands out the lowest free number, so the program holds about that many).
 * The descriptor is closed and the thread gets a timer, which holds none; counted. */
static void refuse_perf(Slot *slot) {
    if (slot->perf_refused) return;
    slot->perf_refused = 1;
    atomic_fetch_add(&engine.perf_refused, 1);
}

static int near_file_limit(Slot *slot, int fd) {
    int near = fd < 0 ? errno == EMFILE || errno == ENFILE
                      : engine.file_limit > 0 &&
                            fd >= engine.file_limit - engine.file_limit / ENGINE_PERF_HEADROOM;
    if (!near) return 0;
    if (fd >= 0) close(fd);
    refuse_perf(slot);
    return 1;
}

/* CPU sampling through a perf_events task-clock counter of the thread: its overflow, every
 * period of the thread's CPU time measured by an hrtimer, sends the engine's signal to that
 * thread (O_ASYNC, F_SETSIG, F_SETOWN_EX). POSIX CPU-clock timers are only checked at the
 * scheduler tick (CONFIG_HZ, 250/s here), which caps their rate and aliases with loops. */
static int arm_perf(Slot *slot, uint64_t value) {
    if (!engine.use_perf) return -1;
    if (atomic_load(&engine.perf_threads) >= engine.perf_max) {
        if (engine.perf_max < ENGINE_PERF_MAX_THREADS) refuse_perf(slot);
        return -1;
    }
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.size = sizeof(attr);
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    attr.sample_period = (uint64_t)engine.period_ns[TIMER_CPU];
    attr.wakeup_events = 1;
    attr.disabled = 1;
#ifdef PERF_ATTR_SIZE_VER7
    if (engine.use_sigtrap) { /* the cheaper route (handler.c): SIGTRAP on every overflow */
        attr.sigtrap = 1;
        attr.remove_on_exec = 1;
        attr.sig_data = value | ENGINE_FD_VALID;
        int fd = (int)syscall(SYS_perf_event_open, &attr, slot->tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (near_file_limit(slot, fd)) return -1;
        if (fd >= 0 && (fd >= ENGINE_FD_TABLE || ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) != 0)) {
            close(fd);
            return -1;
        }
        if (fd >= 0) {
            slot->perf_fd = fd;
            slot->perf_trap = 1;
            atomic_fetch_add(&engine.perf_threads, 1);
            return 0;
        }
        if (errno == EACCES || errno == EPERM || errno == ENOSYS || errno == ENOENT) {
            engine.use_perf = 0;
            return -1;
        }
        if (errno != EINVAL && errno != E2BIG && errno != EOPNOTSUPP) return -1; /* it ended */
        engine.use_sigtrap = 0; /* a kernel before 5.13 does not know these fields */
        attr.sigtrap = 0;
        attr.remove_on_exec = 0;
        attr.sig_data = 0;
    }
#endif
    int fd = (int)syscall(SYS_perf_event_open, &attr, slot->tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (near_file_limit(slot, fd)) return -1;
    if (fd < 0) {
        if (errno == EACCES || errno == EPERM || errno == ENOSYS || errno == ENOENT)
            engine.use_perf = 0; /* not allowed here: timers from now on */
        return -1;
    }
    struct f_owner_ex owner = {F_OWNER_TID, slot->tid};
    if (fd >= ENGINE_FD_TABLE || fcntl(fd, F_SETFL, O_ASYNC | O_NONBLOCK) != 0 ||
        fcntl(fd, F_SETSIG, engine.signo) != 0 || fcntl(fd, F_SETOWN_EX, &owner) != 0) {
        close(fd);
        return -1;
    }
    atomic_store_explicit(&engine_fd_slot[fd], value | ENGINE_FD_VALID, memory_order_release);
    /* Enabled for ENGINE_PERF_BUDGET overflows; the handler gives one back per sample
     * (handler.c, rearm_counter), so a thread that blocks the signal has at most that many
     * pending, never a growing queue of realtime signals eating the user's RLIMIT_SIGPENDING. */
    if (ioctl(fd, PERF_EVENT_IOC_REFRESH, ENGINE_PERF_BUDGET) != 0) {
        atomic_store(&engine_fd_slot[fd], 0);
        close(fd);
        return -1;
    }
    slot->perf_fd = fd;
    slot->perf_trap = 0;
    atomic_fetch_add(&engine.perf_threads, 1);
    return 0;
}

/* SIGTRAP counters of live threads, disabled, whose closing waits for their threads' end:
 * between 6.10 and 6.14 (and stable kernels that took the change) closing a sigtrap counter
 * waits, uninterruptibly, until its thread has run the task work of an overflow taken in the
 * kernel, which a thread asleep in a system call does only when it wakes. Closing another
 * live thread's counter could then hang pyrun's stop (a thread blocked for good) or deadlock
 * (a thread waiting for the engine's lock). A thread's own counter, or one of a thread that
 * has ended, closes at once. */
static struct { int fd; pid_t tid; } deferred[ENGINE_MAX_SLOTS];
static int ndeferred;

static void close_perf(int fd) {
    atomic_store(&engine_fd_slot[fd], 0);
    if (is_perf_fd(fd)) {
        ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
        close(fd);
    }
}

static int thread_alive(pid_t tid) {
    return !(syscall(SYS_tgkill, getpid(), tid, 0) != 0 && errno == ESRCH);
}

/* Close the deferred counters whose threads have ended (call with the table lock held). */
void engine_close_deferred(void) {
    for (int i = ndeferred - 1; i >= 0; i--) {
        if (thread_alive(deferred[i].tid)) continue;
        close_perf(deferred[i].fd);
        deferred[i] = deferred[--ndeferred];
    }
}

static void disarm_perf(Slot *slot) {
    int fd = slot->perf_fd;
    if (fd < 0) return;
    slot->perf_fd = -1;
    if (slot->perf_trap && slot->tid != engine_gettid() && ndeferred < ENGINE_MAX_SLOTS &&
        thread_alive(slot->tid)) {
        if (is_perf_fd(fd)) ioctl(fd, PERF_EVENT_IOC_DISABLE, 0); /* does not wait */
        deferred[ndeferred].fd = fd;
        deferred[ndeferred].tid = slot->tid;
        ndeferred++;
    } else {
        close_perf(fd);
    }
    atomic_fetch_sub(&engine.perf_threads, 1);
}

/* Arm timer `index` (TIMER_CPU / TIMER_WALL) of a live slot, first expiry at a random point of
 * the first period (threads started together do not tick together). */
int engine_arm(Slot *slot, int index) {
    int64_t period = engine.period_ns[index];
    if (period <= 0 || slot->armed[index]) return 0;
    uint32_t number = (uint32_t)(slot - engine_slots);
    uint64_t value = (atomic_load(&slot->gen) << 16) | ((uint64_t)index << 15) | number;
    if (index == TIMER_CPU && arm_perf(slot, value) == 0) {
        slot->armed[index] = 1;
        return 0;
    }
    struct sigevent event;
    memset(&event, 0, sizeof(event));
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = engine.signo;
    event.sigev_value.sival_ptr = (void *)(uintptr_t)value;
#ifdef sigev_notify_thread_id
    event.sigev_notify_thread_id = slot->tid;
#else
    event._sigev_un._tid = slot->tid;
#endif
    clockid_t clock = index == TIMER_CPU ? engine_thread_cpu_clock(slot->tid) : CLOCK_MONOTONIC;
    if (timer_create(clock, &event, &slot->timers[index]) != 0) return -1;
    int64_t first = 1 + (int64_t)(next_random() % (uint64_t)period);
    struct itimerspec spec;
    spec.it_interval.tv_sec = period / 1000000000;
    spec.it_interval.tv_nsec = period % 1000000000;
    spec.it_value.tv_sec = first / 1000000000;
    spec.it_value.tv_nsec = first % 1000000000;
    if (timer_settime(slot->timers[index], 0, &spec, NULL) != 0) {
        timer_delete(slot->timers[index]);
        return -1;
    }
    slot->armed[index] = 1;
    return 0;
}

void engine_disarm(Slot *slot) {
    for (int i = 0; i < NTIMERS; i++) {
        if (slot->armed[i] && !(i == TIMER_CPU && slot->perf_fd >= 0))
            timer_delete(slot->timers[i]);
        slot->armed[i] = 0;
    }
    disarm_perf(slot);
}

/* The consumer is done with an ended slot. Call with the table lock held. */
void engine_free_slot(Slot *slot) {
    engine_disarm(slot);
    engine_account_free(slot); /* the CPU time its records carried */
    atomic_fetch_add(&slot->gen, 1);
    atomic_store_explicit(&slot->state, SLOT_FREE, memory_order_release);
}

/* A thread that called thread_end() runs on for a while (its files are written, the thread
 * is torn down): the monitor must not take it for a new thread, or its last moments would
 * become a second profile. Its tid stays listed until it leaves /proc/self/task (a tid can
 * only be reused after that) or registers again. Call both with the table lock held. */
static int ended_index(pid_t tid) {
    for (int i = 0; i < engine.nended; i++)
        if (engine.ended_tid[i] == tid) return i;
    return -1;
}

void engine_mark_ended(pid_t tid) {
    int max = (int)(sizeof(engine.ended_tid) / sizeof(pid_t));
    if (ended_index(tid) < 0 && engine.nended < max) engine.ended_tid[engine.nended++] = tid;
}

void engine_forget_ended(pid_t tid) {
    int i = ended_index(tid);
    if (i >= 0) engine.ended_tid[i] = engine.ended_tid[--engine.nended];
}

/* -- the monitor thread ------------------------------------------------------------------------- */

/* The number of threads: the link count of /proc/self/task, through a descriptor the monitor
 * opened (fstat: no path walk through procfs at every poll). The program may close that
 * descriptor and reuse its number: a descriptor that is no longer that directory is let go
 * (not closed: it is not ours any more) and the path is used from then on. */
static int monitor_dir_fd = -1;
static dev_t monitor_dir_dev;
static ino_t monitor_dir_ino;

static int task_count(void) {
    struct stat st;
    if (monitor_dir_fd >= 0) {
        if (fstat(monitor_dir_fd, &st) == 0 && st.st_dev == monitor_dir_dev &&
            st.st_ino == monitor_dir_ino)
            return (int)st.st_nlink;
        monitor_dir_fd = -1;
    }
    if (stat("/proc/self/task", &st) != 0) return -1;
    return (int)st.st_nlink;
}

static void open_task_dir(void) {
    struct stat st;
    monitor_dir_fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (monitor_dir_fd >= 0 && fstat(monitor_dir_fd, &st) != 0) {
        close(monitor_dir_fd);
        monitor_dir_fd = -1;
    }
    if (monitor_dir_fd >= 0) {
        monitor_dir_dev = st.st_dev;
        monitor_dir_ino = st.st_ino;
    }
}

static void close_task_dir(void) {
    if (monitor_dir_fd >= 0) close(monitor_dir_fd);
    monitor_dir_fd = -1;
}

/* List /proc/self/task: new threads get slots and timers, vanished ones are marked ended.
 * Returns whether a thread was found or lost (the monitor then polls quickly). */
static int scan_threads(int initial) {
    static uint8_t seen[ENGINE_MAX_SLOTS];
    uint8_t ended_seen[sizeof(engine.ended_tid) / sizeof(pid_t)] = {0};
    int changed = 0;
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL) return 0;
    engine_lock();
    memset(seen, 0, sizeof(seen));
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        pid_t tid = (pid_t)atoi(entry->d_name);
        if (tid <= 0 || excluded(tid)) continue;
        int ended = ended_index(tid);
        if (ended >= 0) { /* past thread_end(): its profile is written */
            ended_seen[ended] = 1;
            continue;
        }
        Slot *slot = engine_slot_for_tid(tid, 0, 0);
        if (slot == NULL) {
            int64_t baseline = 0;
            if (initial) {
                baseline = engine_clock_ns(engine_thread_cpu_clock(tid));
                if (baseline < 0) continue; /* it ended meanwhile */
            }
            slot = engine_slot_for_tid(tid, 1, baseline);
            if (slot == NULL) continue;
            if (engine_arm(slot, TIMER_CPU) != 0 || engine_arm(slot, TIMER_WALL) != 0) {
                engine_disarm(slot); /* an exiting thread: forget it */
                engine_free_slot(slot);
                continue;
            }
            changed = 1;
        }
        seen[slot - engine_slots] = 1;
    }
    closedir(dir);
    engine_account_refresh(); /* pyrun's own threads' clocks, while they can be read */
    engine_close_deferred();
    for (int i = engine.nended - 1; i >= 0; i--) /* gone: its tid may be reused */
        if (!ended_seen[i]) engine.ended_tid[i] = engine.ended_tid[--engine.nended];
    for (uint32_t i = 0; i < high_water; i++) {
        Slot *slot = &engine_slots[i];
        if (atomic_load(&slot->state) == SLOT_LIVE && !seen[i] && !excluded(slot->tid)) {
            engine_disarm(slot);
            atomic_store_explicit(&slot->state, SLOT_ENDED, memory_order_release);
            changed = 1;
        }
    }
    engine_unlock();
    return changed;
}

static void *monitor_main(void *unused) {
    (void)unused;
    prctl(PR_SET_NAME, "pyrun-monitor", 0, 0, 0); /* top, ps -L and py-spy show it as pyrun's */
    __atomic_store_n(&engine.monitor_tid, engine_gettid(), __ATOMIC_RELEASE);
    open_task_dir();
    int last_count = -1;
    int64_t pause_ns = MONITOR_POLL_MIN_NS;
    while (!atomic_load(&monitor_stop)) {
        struct timespec pause = {0, (long)pause_ns};
        nanosleep(&pause, NULL);
        if (atomic_load(&monitor_stop)) break;
        int count = task_count();
        /* modules dlopen'ed or dlclose'd, and new threads' stacks, before they are sampled */
        int modules = engine.native ? engine_native_refresh(count != last_count) : 0;
        /* listed at every poll, not only when the count moved: a thread that ends while
         * another starts leaves the count as it was (a program that runs short native
         * threads one after another would go unseen; account.c counts what is missed) */
        int changed = scan_threads(0);
        /* a library put a SIGTRAP handler of its own: the engine's goes first again, passing
         * the library's signals on to it (until now it got the samples' signals too) */
        if (engine_trap_displaced()) engine_trap_take();
        if (changed && count == last_count && engine.native)
            modules |= engine_native_refresh(1); /* the newcomers' stacks */
        /* each wake-up costs tens of microseconds of CPU on a virtual machine: poll quickly
         * while threads or modules come and go, then back off */
        if (count != last_count || changed || modules) pause_ns = MONITOR_POLL_MIN_NS;
        else if (pause_ns < MONITOR_POLL_MAX_NS) pause_ns *= 2;
        if (pause_ns > MONITOR_POLL_MAX_NS) pause_ns = MONITOR_POLL_MAX_NS;
        last_count = count;
    }
    close_task_dir();
    /* its CPU time is pyrun's, not the program's (account.c); stop() joins it before reading */
    engine.account.monitor_cpu_ns = engine_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    return NULL;
}

/* List the threads that exist now, then start the monitor (every signal blocked in it). */
int engine_threads_start(void) {
    if (monitor_running) return 0;
    random_state ^= (uint64_t)engine_clock_ns(CLOCK_MONOTONIC) * 0x2545F4914F6CDD1Dull;
    random_state ^= (uint64_t)getpid() << 32;
    if (random_state == 0) random_state = 1;
    atomic_store(&monitor_stop, 0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int error = pthread_create(&monitor_thread, NULL, monitor_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (error != 0) return -1;
    monitor_running = 1;
    while (__atomic_load_n(&engine.monitor_tid, __ATOMIC_ACQUIRE) == 0)
        sched_yield(); /* so the scan leaves the monitor out */
    scan_threads(1);
    return 0;
}

void engine_threads_stop(void) {
    if (!monitor_running) return;
    atomic_store(&monitor_stop, 1);
    pthread_join(monitor_thread, NULL);
    monitor_running = 0;
    engine.monitor_tid = 0;
}

/* In a forked child: no timer, no monitor and no other thread survived; forget them (their
 * timer ids mean nothing here: deleting one could delete a new timer of the child). */
void engine_after_fork_child(void) {
    pthread_mutex_init(&table_lock, NULL);
    close_task_dir(); /* the parent's monitor's, inherited: it lists the parent's threads */
    monitor_running = 0;
    engine.monitor_tid = 0;
    engine.nexcluded = 0;
    engine.nended = 0;
    engine_account_forget(); /* the child's CPU clock starts afresh */
    atomic_store(&engine.perf_threads, 0);
    atomic_store(&engine.perf_refused, 0); /* the child's own threads are counted afresh */
    for (int i = 0; i < ndeferred; i++) /* copies of the parent's: closing them waits for nothing */
        if (is_perf_fd(deferred[i].fd)) close(deferred[i].fd);
    ndeferred = 0;
    /* handlers that ran on other threads at the fork never finish here */
    atomic_store(&engine.in_handler, 0);
    for (uint32_t i = 0; i < high_water; i++) {
        Slot *slot = &engine_slots[i];
        if (slot->perf_fd >= 0) { /* the parent's counter, inherited: it counts the parent */
            atomic_store(&engine_fd_slot[slot->perf_fd], 0);
            if (is_perf_fd(slot->perf_fd)) close(slot->perf_fd);
            slot->perf_fd = -1;
        }
        slot->armed[0] = slot->armed[1] = 0;
        atomic_fetch_add(&slot->gen, 1);
        atomic_store(&slot->state, SLOT_FREE);
    }
}

/* pyrun's sampling engine: the process's CPU time that no profile holds (issue #16, item 3).
 *
 * A native thread that lives less than the monitor's poll (20 to 100 ms) is never seen, and a
 * thread that ends without thread_end() (any thread Python did not start) loses its time after
 * its last sample. Neither can be sampled after the fact, but both can be counted: the kernel's
 * CPU clock of the process (CLOCK_PROCESS_CPUTIME_ID) keeps the time of threads that ended. Over
 * a measurement window (start() to stop()) it is split into
 *  - sampled: the CPU time the records carry. A slot's records add up to last_cpu_ns less the
 *    slot's baseline (the handler moves last_cpu_ns only when its record was written, so a
 *    record that did not fit its ring leaves its delta to the next one); slots freed since are
 *    summed in freed_ns as they are freed;
 *  - own: the CPU time of pyrun's own threads, which are never sampled: the monitor (its whole
 *    life lies in the window) and the excluded threads (the drain, the GPU layer's threads),
 *    each from the window's start or its exclusion to its end: told by the thread itself
 *    (own_thread_end()), read at stop(), or, for one that ended without a word, its clock as the
 *    monitor's last scan read it; what a program thread spends after its thread_end()
 *    encoding and writing its own files (session.py tells it: own_cpu()); and what its thread
 *    hook spends before register_thread() (module.c), whose first record carries the thread's
 *    time before the hook instead: its start in the interpreter is the program's;
 *  - the rest: CPU time that ran in threads the engine never sampled, or after a thread's last
 *    sample. This is what pyrun tells the user (engine.py, EngineSampler.report).
 * Nothing here runs in the signal handler: the figures are read and written under the table
 * lock, at start and stop, at an exclusion, at each scan of the monitor and when a slot is freed.
 * A forked child starts with its own process clock and no slots (engine_account_forget).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <string.h>

#include "engine.h"

/* The CPU time every record written since the process began measuring carries. */
static int64_t sampled_ns(void) {
    int64_t total = engine.account.freed_ns;
    uint32_t used = engine_slots_used();
    for (uint32_t i = 0; i < used; i++) {
        const Slot *slot = &engine_slots[i];
        if (atomic_load(&slot->state) != SLOT_FREE) total += slot->last_cpu_ns - slot->cpu_baseline;
    }
    return total;
}

/* Own thread `i` is measured from now (its clock's reading `now`; < 0: it has ended). */
static void own_open(int i, int64_t now) {
    engine.account.own_active[i] = now >= 0;
    engine.account.own_base[i] = engine.account.own_last[i] = now < 0 ? 0 : now;
}

static void own_close(int i) {
    CpuAccount *account = &engine.account;
    if (!account->own_active[i]) return;
    account->own_window_ns += account->own_last[i] - account->own_base[i];
    account->own_active[i] = 0;
}

void engine_account_start(void) {
    engine_lock();
    CpuAccount *account = &engine.account;
    account->process_start = engine_clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    account->sampled_start = sampled_ns();
    account->own_window_ns = 0;
    account->monitor_cpu_ns = 0; /* the monitor starts after this: all its time is in the window */
    for (int i = 0; i < engine.nexcluded; i++)
        own_open(i, engine_clock_ns(engine_thread_cpu_clock(engine.excluded_tid[i])));
    engine_unlock();
}

/* Close the window (the monitor joined, every live slot's tail written): add it to the
 * process's figures when it sampled CPU time. */
void engine_account_stop(void) {
    engine_lock();
    CpuAccount *account = &engine.account;
    int64_t process = engine_clock_ns(CLOCK_PROCESS_CPUTIME_ID) - account->process_start;
    int64_t sampled = sampled_ns() - account->sampled_start;
    engine_account_refresh();
    for (int i = 0; i < engine.nexcluded; i++) own_close(i);
    account->own_window_ns += account->monitor_cpu_ns;
    account->monitor_cpu_ns = 0;
    if (engine.period_ns[TIMER_CPU] > 0) {
        account->process_ns += process;
        account->sampled_ns += sampled;
        account->own_ns += account->own_window_ns;
        account->cpu_windows++;
    }
    account->own_window_ns = 0;
    engine_unlock();
}

/* Thread `tid` is one of pyrun's own from now on (listed once); `slot` was its slot (NULL:
 * none), whose records carried its time up to last_cpu_ns: pyrun's own time starts there. */
void engine_account_exclude(pid_t tid, const Slot *slot) {
    for (int i = 0; i < engine.nexcluded; i++)
        if (engine.excluded_tid[i] == tid) return;
    if (engine.nexcluded >= ENGINE_MAX_EXCLUDED) return;
    int index = engine.nexcluded++;
    engine.excluded_tid[index] = tid;
    if (!atomic_load(&engine.enabled)) own_open(index, -1); /* start() reads its clock */
    else own_open(index, slot != NULL ? slot->last_cpu_ns
                                      : engine_clock_ns(engine_thread_cpu_clock(tid)));
}

/* Read the clock of each own thread still measured: one that ends without a word keeps this. */
void engine_account_refresh(void) {
    for (int i = 0; i < engine.nexcluded; i++) {
        if (!engine.account.own_active[i]) continue;
        int64_t now = engine_clock_ns(engine_thread_cpu_clock(engine.excluded_tid[i]));
        if (now >= 0) engine.account.own_last[i] = now;
    }
}

void engine_account_free(const Slot *slot) {
    if (atomic_load(&slot->state) != SLOT_FREE)
        engine.account.freed_ns += slot->last_cpu_ns - slot->cpu_baseline;
}

void engine_account_forget(void) { memset(&engine.account, 0, sizeof(engine.account)); }

PyObject *engine_own_thread_end(PyObject *module, PyObject *unused) {
    pid_t tid = engine_gettid();
    int64_t now = engine_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    int found = 0;
    engine_lock();
    for (int i = 0; i < engine.nexcluded; i++) {
        if (engine.excluded_tid[i] != tid || !engine.account.own_active[i]) continue;
        if (now >= 0) engine.account.own_last[i] = now;
        own_close(i);
        found = 1;
    }
    engine_unlock();
    return PyBool_FromLong(found);
}

/* own_cpu(ns): CPU time a program thread spent on pyrun's work after its thread_end() (its
 * files encoded and written, session.py): pyrun's, not the program's lost time. */
PyObject *engine_own_cpu(PyObject *module, PyObject *arg) {
    long long ns = PyLong_AsLongLong(arg);
    if (ns == -1 && PyErr_Occurred()) return NULL;
    engine_lock();
    if (ns > 0 && atomic_load(&engine.enabled)) engine.account.own_window_ns += ns;
    engine_unlock();
    Py_RETURN_NONE;
}

/* stats(): the figures, in ns, once a window that sampled CPU time has closed. */
int engine_account_stats(PyObject *stats) {
    engine_lock();
    CpuAccount account = engine.account;
    engine_unlock();
    if (account.cpu_windows == 0) return 0;
    struct {
        const char *name;
        int64_t value;
    } figures[] = {
        {"cpu_process_ns", account.process_ns},
        {"cpu_sampled_ns", account.sampled_ns},
        {"cpu_pyrun_threads_ns", account.own_ns},
        {"cpu_unsampled_ns", account.process_ns - account.sampled_ns - account.own_ns},
    };
    for (size_t i = 0; i < sizeof(figures) / sizeof(figures[0]); i++) {
        PyObject *value = PyLong_FromLongLong(figures[i].value);
        if (value == NULL || PyDict_SetItemString(stats, figures[i].name, value) < 0) {
            Py_XDECREF(value);
            return -1;
        }
        Py_DECREF(value);
    }
    return 0;
}

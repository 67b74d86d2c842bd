/* pyrun's sampling engine: the table of native modules its unwinder reads (issue #17).
 *
 * The module table (each module's code range, readable segments and .eh_frame_hdr, from
 * dl_iterate_phdr, and the readable mappings of /proc/self/maps) is built outside the handler:
 * by the thread that starts the engine, by the monitor thread (every 20 ms it asks the loader
 * whether a module was added or removed) and by drain(). It is published as one immutable block;
 * an old block is freed only once no handler runs (engine.in_handler seen at 0 after the new one
 * was published). Each module is also entered, once, in the process-wide registry (path, load
 * bias): a record names a native frame by (registry id, offset in the file's address space), so
 * a module dlclose'd between the sample and drain() is still named correctly. unwind.c reads the
 * table from the handler.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

extern char _PyEval_EvalFrameDefault[]; /* its address only: the eval loop's code range */

/* -- the registry of modules (append-only, under registry_lock; never read by the handler) ---- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t refresh_lock = PTHREAD_MUTEX_INITIALIZER;
static EngineModule *registry;
static uint32_t registry_used, registry_cap;

static uint32_t registry_id(const char *path, uintptr_t bias, int kind) {
    for (uint32_t i = 0; i < registry_used; i++)
        if (registry[i].bias == bias && strcmp(registry[i].path, path) == 0) return i;
    if (registry_used == registry_cap) {
        uint32_t cap = registry_cap ? 2 * registry_cap : 64;
        EngineModule *grown = realloc(registry, cap * sizeof(EngineModule));
        if (grown == NULL) return ENGINE_NO_MODULE;
        registry = grown;
        registry_cap = cap;
    }
    char *copy = strdup(path);
    if (copy == NULL) return ENGINE_NO_MODULE;
    registry[registry_used] = (EngineModule){copy, bias, -1, kind};
    return registry_used++;
}

int engine_module_info(uint32_t id, char *path, size_t size, int64_t *lm, int *kind) {
    pthread_mutex_lock(&registry_lock);
    int ok = id < registry_used;
    if (ok) {
        snprintf(path, size, "%s", registry[id].path);
        *lm = registry[id].lm;
        *kind = registry[id].kind;
    }
    pthread_mutex_unlock(&registry_lock);
    return ok ? 0 : -1;
}

void engine_module_set_lm(uint32_t id, int64_t lm) {
    pthread_mutex_lock(&registry_lock);
    if (id < registry_used) registry[id].lm = lm;
    pthread_mutex_unlock(&registry_lock);
}

/* The session starts afresh (engine start, a forked child): load-module ids are the session's. */
void engine_modules_forget_lms(void) {
    pthread_mutex_lock(&registry_lock);
    for (uint32_t i = 0; i < registry_used; i++) registry[i].lm = -1;
    pthread_mutex_unlock(&registry_lock);
}

/* -- the module table the handler reads --------------------------------------------------------- */

_Atomic(NativeTable *) engine_native_table;
static NativeTable *graveyard; /* tables a handler may still have held: freed at stop */
static unsigned long long last_adds = ~0ull, last_subs = ~0ull;

typedef struct {
    NativeModule *mods;
    char **names; /* dlpi_name of each, copied */
    uint32_t used, cap;
    unsigned long long adds, subs;
    uintptr_t vdso;
} Collect;

static int module_kind(const char *path) {
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    if (strncmp(name, "ld-linux", 8) == 0 || strncmp(name, "ld-musl", 7) == 0) return MOD_LOADER;
    static const char *system[] = {"libc.so", "libc-", "libpthread", "libc.musl"};
    for (size_t i = 0; i < sizeof(system) / sizeof(system[0]); i++)
        if (strncmp(name, system[i], strlen(system[i])) == 0) return MOD_SYSTEM;
    return MOD_OTHER;
}

static int collect_module(struct dl_phdr_info *info, size_t size, void *data) {
    Collect *c = data;
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
    NativeModule m;
    memset(&m, 0, sizeof(m));
    m.bias = (uintptr_t)info->dlpi_addr;
    m.text_lo = UINTPTR_MAX;
    uintptr_t image_lo = UINTPTR_MAX, image_hi = 0; /* what its PT_LOAD segments map */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = m.bias + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type == PT_LOAD && lo < image_lo) image_lo = lo;
        if (ph->p_type == PT_LOAD && hi > image_hi) image_hi = hi;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            if (lo < m.text_lo) m.text_lo = lo;
            if (hi > m.text_hi) m.text_hi = hi;
        }
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_R) && m.nseg < ENGINE_MODULE_SEGS) {
            m.seg_lo[m.nseg] = lo;
            m.seg_hi[m.nseg++] = m.bias + ph->p_vaddr + ph->p_filesz; /* beyond: maybe unmapped */
        }
        if (ph->p_type == PT_GNU_EH_FRAME) m.eh_hdr = (const uint8_t *)lo;
    }
    if (m.text_hi == 0) return 0;
    /* The vDSO is the module whose image holds the ELF header the kernel names
     * (AT_SYSINFO_EHDR); the loader often sits a few pages above it (its text 12 KiB past the
     * vDSO's header here), so nearness is not enough: ld.so's frames were taken for the vDSO's
     * and left out, their time given to their libc caller (issue #36, perf's comparison). */
    if (c->vdso && image_lo <= c->vdso && c->vdso < image_hi) m.kind = MOD_VDSO;
    if (c->used == c->cap) {
        uint32_t cap = c->cap ? 2 * c->cap : 128;
        NativeModule *grown = realloc(c->mods, cap * sizeof(NativeModule));
        char **names = realloc(c->names, cap * sizeof(char *));
        if (grown != NULL) c->mods = grown;
        if (names != NULL) c->names = names;
        if (grown == NULL || names == NULL) return 0;
        c->cap = cap;
    }
    c->names[c->used] = strdup(info->dlpi_name ? info->dlpi_name : "");
    c->mods[c->used++] = m;
    return 0;
}

/* Name the modules collected (after dl_iterate_phdr: realpath's system calls are not made with
 * the loader's lock held) and enter them in the registry; drop those that cannot be named. */
static void name_modules(Collect *c) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < c->used; i++) {
        NativeModule m = c->mods[i];
        char exe[PATH_MAX], real[PATH_MAX];
        const char *path = c->names[i];
        if (path == NULL) continue;
        if (path[0] == 0) { /* the main program */
            ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
            exe[n > 0 ? n : 0] = 0;
            path = exe;
        } else if (realpath(path, real) != NULL) {
            path = real;
        }
        int vdso = m.kind == MOD_VDSO; /* collect_module's finding */
        m.kind = (uint8_t)module_kind(path);
        const char *base = strrchr(path, '/');
        if (path == exe && strncmp(base ? base + 1 : path, "python", 6) == 0)
            m.kind = MOD_INTERPRETER; /* the interpreter's executable (libpython: by address) */
        if (vdso) m.kind = MOD_VDSO;
        pthread_mutex_lock(&registry_lock);
        m.id = registry_id(path, m.bias, m.kind);
        pthread_mutex_unlock(&registry_lock);
        free(c->names[i]);
        if (m.id != ENGINE_NO_MODULE) c->mods[kept++] = m;
    }
    free(c->names);
    c->names = NULL;
    c->used = kept;
}

static int peek_counts(struct dl_phdr_info *info, size_t size, void *data) {
    unsigned long long *counts = data;
    counts[0] = info->dlpi_adds;
    counts[1] = info->dlpi_subs;
    return 1; /* the first module is enough */
}

static int by_text(const void *a, const void *b) {
    uintptr_t x = ((const NativeModule *)a)->text_lo, y = ((const NativeModule *)b)->text_lo;
    return x < y ? -1 : x > y;
}

static int by_lo(const void *a, const void *b) {
    uintptr_t x = ((const MemRange *)a)->lo, y = ((const MemRange *)b)->lo;
    return x < y ? -1 : x > y;
}

/* The readable mappings of /proc/self/maps (thread stacks among them), sorted. */
static MemRange *read_maps(uint32_t *count) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL) return NULL;
    uint32_t used = 0, cap = 256;
    MemRange *ranges = malloc(cap * sizeof(MemRange));
    char line[512];
    while (ranges != NULL && fgets(line, sizeof(line), maps) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r') continue;
        if (used == cap) {
            MemRange *grown = realloc(ranges, 2 * cap * sizeof(MemRange));
            if (grown == NULL) break;
            ranges = grown;
            cap *= 2;
        }
        ranges[used++] = (MemRange){lo, hi};
    }
    fclose(maps);
    if (ranges != NULL) qsort(ranges, used, sizeof(MemRange), by_lo);
    *count = used;
    return ranges;
}

static void free_table(NativeTable *table) {
    free(table->mods);
    free(table->maps);
    free(table);
}

/* Free `old` once no handler can hold it: a handler that starts after the new table was
 * published reads the new one, so in_handler seen at 0 once is enough. */
static void retire(NativeTable *old) {
    if (old == NULL) return;
    for (int i = 0; i < 2000; i++) {
        if (atomic_load(&engine.in_handler) == 0) {
            free_table(old);
            return;
        }
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
    }
    old->next = graveyard;
    graveyard = old;
}

/* Rebuild the table if the loader's module list changed (or `maps` asks for the mappings anew:
 * a new thread's stack). Never from a handler. Returns 1 when it built a new table. */
int engine_native_refresh(int maps) {
#if defined(__x86_64__)
    /* Under the table lock, which pyrun's fork handler takes: a fork never happens while this
     * thread holds the loader's lock in dl_iterate_phdr (a forked child would inherit it held:
     * glibc resets its dlopen lock in the child, not dl_iterate_phdr's). */
    engine_lock();
    pthread_mutex_lock(&refresh_lock);
    unsigned long long counts[2] = {0, 0};
    dl_iterate_phdr(peek_counts, counts);
    NativeTable *old = atomic_load(&engine_native_table);
    if (old != NULL && counts[0] == last_adds && counts[1] == last_subs && !maps) {
        pthread_mutex_unlock(&refresh_lock);
        engine_unlock();
        return 0;
    }
    NativeTable *table = calloc(1, sizeof(NativeTable));
    Collect c = {NULL, NULL, 0, 0, 0, 0, (uintptr_t)getauxval(AT_SYSINFO_EHDR)};
    if (table != NULL) dl_iterate_phdr(collect_module, &c);
    name_modules(&c);
    if (table == NULL || c.used == 0) {
        free(table);
        free(c.mods);
        pthread_mutex_unlock(&refresh_lock);
        engine_unlock();
        return 0;
    }
    qsort(c.mods, c.used, sizeof(NativeModule), by_text);
    table->mods = c.mods;
    table->nmods = c.used;
    table->maps = read_maps(&table->nmaps);
    uintptr_t eval = (uintptr_t)_PyEval_EvalFrameDefault;
    for (uint32_t i = 0; i < c.used; i++) {
        NativeModule *m = &c.mods[i];
        if (eval < m->text_lo || eval >= m->text_hi) continue;
        Fde fde;
        m->kind = MOD_INTERPRETER;
        if (engine_find_fde(m, eval, &fde) == 0) {
            table->eval_lo = fde.pc_lo;
            table->eval_hi = fde.pc_hi;
        }
        pthread_mutex_lock(&registry_lock);
        registry[m->id].kind = MOD_INTERPRETER;
        pthread_mutex_unlock(&registry_lock);
    }
    static uint32_t generation;
    table->gen = ++generation;
    last_adds = c.adds;
    last_subs = c.subs;
    atomic_store(&engine_native_table, table);
    pthread_mutex_unlock(&refresh_lock);
    engine_unlock();
    retire(old);
    return 1;
#else
    (void)maps;
    return 0;
#endif
}

void engine_native_free_retired(void) {
    pthread_mutex_lock(&refresh_lock);
    while (graveyard != NULL) {
        NativeTable *next = graveyard->next;
        free_table(graveyard);
        graveyard = next;
    }
    pthread_mutex_unlock(&refresh_lock);
}

void engine_native_after_fork_child(void) {
    pthread_mutex_init(&registry_lock, NULL);
    pthread_mutex_init(&refresh_lock, NULL);
}

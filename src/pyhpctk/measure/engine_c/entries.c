/* drain()'s phase 3 for one thread: its staged records into the entries the Python side walks
 * (module.c calls engine_slot_entries under the GIL, after the code objects got their fids).
 *
 * Each record's frames are resolved (engine_frame_ip) into the thread's resolved path, kept in
 * the slot from one record to the next and from one drain to the next. Without tracing, the
 * samples of one drain are then grouped by (path, timer, GIL state), whatever their order: each
 * group becomes one entry with the summed CPU and wall time, in the order of its first sample,
 * so that the CCT's nodes are made in the order the samples first reached them. The paths are
 * hash-consed into a per-drain trie (a node per distinct prefix), so that finding a record's
 * group costs only the frames that differ from the previous record. The Python side follows the
 * entries as a walk from one path to the next (common prefix, then new frames) and ends on the
 * last entry's path: where the last sample's group is not the last entry, one more entry with
 * no time goes back to it (its path is the one the next drain starts from). With tracing every
 * sample is its own entry, in order (each is a trace record).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef struct {
    uint32_t parent; /* trie node; the root (the empty path) is node 0, its own parent */
    uint32_t depth;
    uint64_t ip;
} TrieNode;

typedef struct {
    uint32_t leaf; /* trie node */
    int timer, gil;
    int64_t cpu, wall, time;
} Group;

/* Per-drain scratch, reused (drain() runs once at a time, under the GIL). */
static TrieNode *nodes;
static uint32_t nodes_used, nodes_cap;
static uint32_t *node_index; /* open addressing over (parent, ip): node + 1, 0 empty */
static size_t node_index_cap;
static Group *groups;
static uint32_t groups_used, groups_cap;
static uint32_t *group_index; /* open addressing over (leaf, timer, gil): group + 1 */
static size_t group_index_cap;
static uint32_t *at_depth; /* the trie node of each prefix of the current resolved path */
static uint64_t *walk;     /* scratch for one entry's new frames */

static inline size_t mix(uint64_t a, uint64_t b) {
    uint64_t h = (a * 0x9E3779B97F4A7C15ull) ^ (b + 0x632BE59BD9B4E019ull + (a >> 17));
    h *= 0xBF58476D1CE4E5B9ull;
    return (size_t)(h ^ (h >> 29));
}

/* An empty table of `cap` slots (a power of two) in *index. */
static int index_reset(uint32_t **index, size_t *cap, size_t want) {
    size_t size = 1024;
    while (size < 2 * want) size *= 2;
    if (size != *cap) {
        uint32_t *table = realloc(*index, size * sizeof(uint32_t));
        if (table == NULL) return -1;
        *index = table;
        *cap = size;
    }
    memset(*index, 0, *cap * sizeof(uint32_t));
    return 0;
}

static int grow(void **array, uint32_t *cap, uint32_t used, size_t size) {
    if (used < *cap) return 0;
    uint32_t more = *cap ? 2 * *cap : 256;
    void *grown = realloc(*array, (size_t)more * size);
    if (grown == NULL) return -1;
    *array = grown;
    *cap = more;
    return 0;
}

/* The trie node of `ip` under `parent`, made on first use; UINT32_MAX: no memory. */
static uint32_t trie_child(uint32_t parent, uint64_t ip) {
    size_t mask = node_index_cap - 1;
    size_t i = mix(parent, ip) & mask;
    for (; node_index[i]; i = (i + 1) & mask) {
        TrieNode *node = &nodes[node_index[i] - 1];
        if (node->parent == parent && node->ip == ip) return node_index[i] - 1;
    }
    if (2 * ((size_t)nodes_used + 1) > node_index_cap) { /* rehash into a larger table */
        if (index_reset(&node_index, &node_index_cap, 2 * ((size_t)nodes_used + 1)) != 0)
            return UINT32_MAX;
        mask = node_index_cap - 1;
        for (uint32_t n = 1; n < nodes_used; n++) {
            size_t j = mix(nodes[n].parent, nodes[n].ip) & mask;
            while (node_index[j]) j = (j + 1) & mask;
            node_index[j] = n + 1;
        }
        for (i = mix(parent, ip) & mask; node_index[i]; i = (i + 1) & mask) {}
    }
    if (grow((void **)&nodes, &nodes_cap, nodes_used, sizeof(TrieNode)) != 0) return UINT32_MAX;
    nodes[nodes_used] = (TrieNode){parent, nodes[parent].depth + 1, ip};
    node_index[i] = nodes_used + 1;
    return nodes_used++;
}

/* The group of a sample on trie node `leaf` with that timer and GIL state (a new one with
 * tracing, or for the first such sample); UINT32_MAX: no memory. */
static uint32_t group_of(uint32_t leaf, int timer, int gil, const RecordHeader *record) {
    size_t mask = group_index_cap - 1, i = mix(leaf, (uint64_t)(timer << 8 | gil)) & mask;
    if (!engine.trace) {
        for (; group_index[i]; i = (i + 1) & mask) {
            Group *group = &groups[group_index[i] - 1];
            if (group->leaf == leaf && group->timer == timer && group->gil == gil) {
                group->cpu += record->cpu_ns;
                group->wall += record->wall_ns;
                return group_index[i] - 1;
            }
        }
        group_index[i] = groups_used + 1; /* the table has room for every record */
    }
    if (grow((void **)&groups, &groups_cap, groups_used, sizeof(Group)) != 0) return UINT32_MAX;
    groups[groups_used] = (Group){leaf, timer, gil, record->cpu_ns, record->wall_ns,
                                  record->time_ns};
    return groups_used++;
}

/* The entry (common, ips, timer, gil, cpu, wall, time) that walks from trie node `from` to
 * `group`'s path. */
static PyObject *entry_tuple(uint32_t from, const Group *group, int64_t cpu, int64_t wall) {
    uint32_t a = from, b = group->leaf, n = 0;
    while (nodes[a].depth > nodes[b].depth) a = nodes[a].parent;
    while (nodes[b].depth > nodes[a].depth) {
        walk[n++] = nodes[b].ip;
        b = nodes[b].parent;
    }
    while (a != b) {
        walk[n++] = nodes[b].ip;
        a = nodes[a].parent;
        b = nodes[b].parent;
    }
    PyObject *path = PyTuple_New(n);
    if (path == NULL) return NULL;
    for (uint32_t j = 0; j < n; j++) { /* walk[] holds them innermost first */
        PyObject *ip = PyLong_FromUnsignedLongLong(walk[n - 1 - j]);
        if (ip == NULL) {
            Py_DECREF(path);
            return NULL;
        }
        PyTuple_SET_ITEM(path, j, ip);
    }
    return Py_BuildValue("(INiiLLL)", nodes[a].depth, path, group->timer, group->gil,
                         (long long)cpu, (long long)wall, (long long)group->time);
}

static int scratch_ready(uint32_t count) {
    if (at_depth == NULL) at_depth = malloc(ENGINE_MAX_DEPTH * sizeof(uint32_t));
    if (walk == NULL) walk = malloc(ENGINE_MAX_DEPTH * sizeof(uint64_t));
    if (at_depth == NULL || walk == NULL) return -1;
    nodes_used = 0;
    groups_used = 0;
    if (grow((void **)&nodes, &nodes_cap, 0, sizeof(TrieNode)) != 0) return -1;
    nodes[nodes_used++] = (TrieNode){0, 0, 0};
    if (index_reset(&node_index, &node_index_cap, 1) != 0) return -1;
    return index_reset(&group_index, &group_index_cap, count);
}

PyObject *engine_slot_entries(Slot *slot, const uint8_t *at, size_t bytes, uint32_t count,
                              int64_t unknown_fid, int64_t truncated_fid) {
    if (scratch_ready(count) != 0) return PyErr_NoMemory();
    /* the path the previous drain ended on, where the Python side stands */
    uint32_t start = 0;
    for (uint32_t d = 0; d < slot->resolved_depth; d++) {
        start = trie_child(start, slot->resolved_ip[d]);
        if (start == UINT32_MAX) return PyErr_NoMemory();
        at_depth[d] = start;
    }
    uint32_t last = UINT32_MAX; /* the last sample's group */
    const uint8_t *end = at + bytes;
    for (; at < end; at += ((const RecordHeader *)at)->words * 8) {
        const RecordHeader *record = (const RecordHeader *)at;
        RawFrame *frames = (RawFrame *)(at + sizeof(RecordHeader));
        uint32_t common = record->common;
        for (uint32_t d = slot->raw_depth; d < common; d++) /* never: the producer is in step */
            slot->resolved_at[d + 1] = slot->resolved_at[slot->raw_depth];
        uint32_t k = slot->resolved_at[common], old = slot->resolved_depth;
        uint32_t first_diff = UINT32_MAX; /* the first resolved frame unlike the previous path */
        for (uint32_t d = common; d < record->depth; d++) {
            uint64_t ip = engine_frame_ip(&frames[d - common], unknown_fid, truncated_fid);
            if (ip) {
                if ((k >= old || slot->resolved_ip[k] != ip) && k < first_diff) first_diff = k;
                slot->resolved_ip[k++] = ip;
            }
            slot->resolved_at[d + 1] = k;
        }
        if (first_diff > k) first_diff = k;
        if (first_diff > old) first_diff = old;
        slot->raw_depth = record->depth;
        slot->resolved_depth = k;
        for (uint32_t d = first_diff; d < k; d++) {
            at_depth[d] = trie_child(d ? at_depth[d - 1] : 0, slot->resolved_ip[d]);
            if (at_depth[d] == UINT32_MAX) return PyErr_NoMemory();
        }
        last = group_of(k ? at_depth[k - 1] : 0, record->timer, record->gil, record);
        if (last == UINT32_MAX) return PyErr_NoMemory();
    }
    int back = last != UINT32_MAX && last + 1 != groups_used; /* one more entry, with no time */
    PyObject *list = PyList_New(groups_used + back);
    if (list == NULL) return NULL;
    uint32_t from = slot->restart ? 0 : start; /* after a mark: from the empty path */
    if (groups_used) slot->restart = 0;
    for (uint32_t g = 0; g < groups_used + back; g++) {
        const Group *group = &groups[g < groups_used ? g : last];
        PyObject *item = g < groups_used ? entry_tuple(from, group, group->cpu, group->wall)
                                         : entry_tuple(from, group, 0, 0);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, g, item);
        from = group->leaf;
    }
    return list;
}

/* The Python side moved the node every path starts from (pyrun ctl mark: docs/pyrun.md,
 * "Windows of long jobs") and forgot where it stood: each thread's next batch starts from the
 * empty path, so that its first entry names its whole path. Called under the GIL, where no
 * drain() runs. */
PyObject *engine_restart_paths(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    for (uint32_t i = 0; i < ENGINE_MAX_SLOTS; i++) engine_slots[i].restart = 1;
    Py_RETURN_NONE;
}

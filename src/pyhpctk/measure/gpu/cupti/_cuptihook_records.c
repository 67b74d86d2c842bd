/* Per-record work of the monitor's buffers in C, without the GIL (issue #18).
 *
 * A model's buffer holds tens of thousands of activity records; reading them with numpy took
 * one pass over the buffer per field (and a zeroed output first), and summing their metrics
 * one pass per metric: about 0.6 us of the monitor's CPU per record, mostly with the GIL,
 * which the launching thread waits for. Here each is one pass, the GIL released:
 *
 * - convert_records() turns one kind's CUPTI records into ACTIVITY_DTYPE rows (activity.py),
 *   following a plan the Python side derives from cupti-python's record layout: which bytes
 *   of the record go to which field of the row (integers widened or truncated as numpy's
 *   assignment does), the products of the grid and block dimensions, the kernel's name
 *   pointer looked up among the names known so far, and the memory operation type.
 * - activity_sums() sums a batch's metrics per target node in one pass, in the order and with
 *   the arithmetic of attribution.add_metrics' numpy path (its oracle in the tests), so both
 *   give the same floating-point values.
 */
#include "_cuptihook.h"

#include <string.h>

/* -- convert_records ------------------------------------------------------------------------ */

/* The plan's steps: int64 rows of (op, destination offset, destination size, source offset,
 * source size, source signed). */
enum { STEP_COPY = 0, STEP_MUL = 1, STEP_STORE = 2, STEP_NAME = 3, STEP_FREE = 4 };
#define STEP_WIDTH 6
#define ROW_BYTES 96  /* activity.ACTIVITY_DTYPE.itemsize */
#define ROW_KIND 0    /* its "kind" field (u1) */
#define ROW_FUNCTION 80 /* its "function" field (i4) */
#define MISSING_MAX 256

/* Fixed-size loads and stores (a memcpy of a variable size is a call per field). */
static inline uint64_t read_int(const uint8_t *at, int64_t size, int64_t is_signed) {
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t value;
    switch (size) {
    case 1:
        memcpy(&u8, at, 1);
        return is_signed ? (uint64_t)(int64_t)(int8_t)u8 : u8; /* numpy widens signed ints */
    case 2:
        memcpy(&u16, at, 2);
        return is_signed ? (uint64_t)(int64_t)(int16_t)u16 : u16;
    case 4:
        memcpy(&u32, at, 4);
        return is_signed ? (uint64_t)(int64_t)(int32_t)u32 : u32;
    case 8:
        memcpy(&value, at, 8);
        return value;
    default: /* 3, 5, 6, 7 bytes: no integer field has them */
        value = 0;
        memcpy(&value, at, (size_t)size);
        if (is_signed && (at[size - 1] & 0x80))
            value |= ~(uint64_t)0 << (8 * size);
        return value;
    }
}

static inline void write_int(uint8_t *at, int64_t size, uint64_t value) {
    uint8_t u8 = (uint8_t)value; /* truncated to the field, as numpy's unsafe cast */
    uint16_t u16 = (uint16_t)value;
    uint32_t u32 = (uint32_t)value;
    switch (size) {
    case 1:
        memcpy(at, &u8, 1);
        break;
    case 2:
        memcpy(at, &u16, 2);
        break;
    case 4:
        memcpy(at, &u32, 4);
        break;
    default:
        memcpy(at, &value, 8);
        break;
    }
}

/* The index of ``pointer`` among the sorted ``known`` pointers (-1: not there). */
static int64_t find_name(const uint64_t *known, int64_t count, uint64_t pointer) {
    int64_t low = 0, high = count;
    while (low < high) {
        int64_t middle = low + (high - low) / 2;
        if (known[middle] < pointer)
            low = middle + 1;
        else
            high = middle;
    }
    return low < count && known[low] == pointer ? low : -1;
}

/* convert_records(address, valid, offsets, stride, plan, kind, free_kind, names, indices, out)
 * -> missing: see the method table. */
PyObject *hook_convert_records(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address, valid, stride;
    int kind, free_kind;
    Py_buffer offsets, plan, names, indices, out;
    if (!PyArg_ParseTuple(args, "KKy*Ky*iiy*y*w*", &address, &valid, &offsets, &stride, &plan,
                          &kind, &free_kind, &names, &indices, &out))
        return NULL;
    PyObject *result = NULL;
    const int64_t *at = offsets.buf;
    Py_ssize_t count = offsets.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *steps = plan.buf;
    Py_ssize_t nsteps = plan.len / (Py_ssize_t)(STEP_WIDTH * sizeof(int64_t));
    const uint64_t *known = names.buf;
    const int32_t *known_index = indices.buf;
    int64_t nknown = names.len / (Py_ssize_t)sizeof(uint64_t);
    uint64_t missing[MISSING_MAX];
    int nmissing = 0, bad = 0;
    if (out.len < count * ROW_BYTES || indices.len < nknown * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "convert_records: output or name table too short");
        goto done;
    }
    for (Py_ssize_t step = 0; step < nsteps; step++) {
        const int64_t *s = steps + step * STEP_WIDTH;
        int sized = (s[2] == 1 || s[2] == 2 || s[2] == 4 || s[2] == 8) && s[4] >= 1 && s[4] <= 8;
        if (s[0] < STEP_COPY || s[0] > STEP_FREE || !sized || s[1] < 0 ||
            s[1] + s[2] > ROW_BYTES || s[3] < 0 || (uint64_t)(s[3] + s[4]) > stride) {
            PyErr_Format(PyExc_ValueError, "convert_records: bad plan step %zd", step);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *buffer = (const uint8_t *)(uintptr_t)address;
    uint8_t *rows = out.buf;
    uint64_t last_pointer = 0;
    int32_t last_index = -1;
    for (Py_ssize_t record = 0; record < count && !bad; record++) {
        if (at[record] < 0 || (uint64_t)at[record] + stride > valid) {
            bad = 1;
            break;
        }
        const uint8_t *source = buffer + at[record];
        uint8_t *row = rows + record * ROW_BYTES;
        memset(row, 0, ROW_BYTES);
        row[ROW_KIND] = (uint8_t)kind;
        int32_t function = -1;
        uint64_t product = 1;
        for (Py_ssize_t step = 0; step < nsteps; step++) {
            const int64_t *s = steps + step * STEP_WIDTH;
            uint64_t value = read_int(source + s[3], s[4], s[5]);
            switch (s[0]) {
            case STEP_COPY:
                write_int(row + s[1], s[2], value);
                break;
            case STEP_MUL:
                product *= value; /* int64 arithmetic, wrapping as numpy's */
                break;
            case STEP_STORE:
                write_int(row + s[1], s[2], product * value);
                product = 1;
                break;
            case STEP_NAME: {
                if (value == last_pointer && last_index >= 0) {
                    function = last_index;
                    break;
                }
                int64_t found = find_name(known, nknown, value);
                if (found >= 0) {
                    function = known_index[found];
                    last_pointer = value;
                    last_index = function;
                    break;
                }
                int seen = 0;
                for (int i = 0; i < nmissing && !seen; i++)
                    seen = missing[i] == value;
                if (!seen && nmissing < MISSING_MAX)
                    missing[nmissing++] = value;
                break;
            }
            case STEP_FREE:
                if (value == 2) /* CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE */
                    row[ROW_KIND] = (uint8_t)free_kind;
                break;
            }
        }
        memcpy(row + ROW_FUNCTION, &function, sizeof(function));
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "convert_records: a record lies outside the buffer");
        goto done;
    }
    result = PyBytes_FromStringAndSize((const char *)missing,
                                       (Py_ssize_t)(nmissing * sizeof(uint64_t)));
done:
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&plan);
    PyBuffer_Release(&names);
    PyBuffer_Release(&indices);
    PyBuffer_Release(&out);
    return result;
}

/* -- activity_sums -------------------------------------------------------------------------- */

/* ACTIVITY_DTYPE's fields (activity.py; packed, little-endian). */
typedef struct {
    uint8_t kind, copy_kind, memory_kind, sync_kind;
    uint32_t device, context, stream;
    uint64_t correlation, start, end, bytes;
    uint32_t registers, static_smem, dynamic_smem;
    uint64_t local_mem;
    uint32_t block_threads;
    uint64_t grid_blocks;
    int32_t function;
    uint32_t graph;
    uint64_t graph_node;
} __attribute__((packed)) Row;

_Static_assert(sizeof(Row) == ROW_BYTES, "ACTIVITY_DTYPE is 96 bytes");

/* The metric indices activity_sums() is given, in this order (attribution.SUM_LAYOUT). */
enum {
    M_GPUOP, M_GKER, M_GKER_COUNT, M_STMEM, M_DYMEM, M_LMEM, M_FGP_ACT, M_FGP_MAX, M_THR_REG,
    M_BLK_THR, M_BLK_SM, M_BLKS, M_GXCOPY, M_GXCOPY_BYTES, M_GXCOPY_COUNT, M_GMSET,
    M_GMSET_BYTES, M_GMSET_COUNT, M_GMEM, M_GMEM_BYTES, M_GMEM_COUNT, M_GSYNC, M_GSYNC_TIME,
    M_GSYNC_COUNT, M_KINDS
};
/* The activity kinds (activity.py), the last entry of the layout: KERNEL ... SYNC. */
enum { K_KERNEL, K_COPY, K_MEMSET, K_ALLOC, K_FREE, K_SYNC, K_COUNT };
/* The device limits (activity.DeviceLimits), in this order. */
enum { L_WARP, L_THREADS, L_BLOCKS, L_REGISTERS, L_SHARED, L_COUNT };

/* activity_sums(rows, targets, groups, width, layout, limits) -> bytes: see the method table. */
PyObject *hook_activity_sums(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer rows_buffer, targets_buffer, layout_buffer, limits_buffer;
    Py_ssize_t groups, width;
    if (!PyArg_ParseTuple(args, "y*y*nny*y*", &rows_buffer, &targets_buffer, &groups, &width,
                          &layout_buffer, &limits_buffer))
        return NULL;
    PyObject *result = NULL;
    double *sums = NULL, *freed = NULL;
    Py_ssize_t count = rows_buffer.len / ROW_BYTES;
    const int64_t *metric = layout_buffer.buf;
    const int64_t *limit = limits_buffer.buf;
    const int64_t *target = targets_buffer.buf;
    int fine = rows_buffer.len % ROW_BYTES == 0 && targets_buffer.len == count * 8 &&
               layout_buffer.len == (M_KINDS + K_COUNT) * 8 &&
               limits_buffer.len == L_COUNT * 8 && groups >= 0 && width > 0;
    for (int m = 0; fine && m < M_KINDS; m++)
        fine = metric[m] >= 0 && metric[m] < width;
    fine = fine && limit[L_WARP] > 0 && limit[L_THREADS] >= 0 &&
           metric[M_GXCOPY_BYTES] + 11 <= width && metric[M_GMSET_BYTES] + 8 <= width &&
           metric[M_GMEM_BYTES] + 8 <= width && metric[M_GSYNC_TIME] + 5 <= width;
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "activity_sums: bad arguments");
        goto done;
    }
    const int64_t *kinds = metric + M_KINDS;
    size_t cells = (size_t)(groups ? groups : 1) * (size_t)width;
    sums = calloc(cells, sizeof(double));
    freed = calloc(cells, sizeof(double)); /* frees are summed apart, as the numpy path does */
    if (sums == NULL || freed == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    const Row *rows = rows_buffer.buf;
    int64_t warp = limit[L_WARP], max_warps = limit[L_THREADS] / warp;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Row *row = rows + i;
        int64_t group = target[i];
        if (group < 0 || group >= groups) {
            bad = 1;
            break;
        }
        double *at = sums + group * width;
        int64_t elapsed = (int64_t)(row->end - row->start); /* wraps as numpy's int64 */
        double duration = (double)(elapsed > 0 ? elapsed : 0) / 1e9;
        at[metric[M_GPUOP]] += duration;
        int kind = row->kind;
        if (kind == kinds[K_KERNEL]) {
            at[metric[M_GKER]] += duration;
            at[metric[M_GKER_COUNT]] += 1.0;
            at[metric[M_STMEM]] += (double)row->static_smem;
            at[metric[M_DYMEM]] += (double)row->dynamic_smem;
            at[metric[M_LMEM]] += (double)row->local_mem;
            /* activity.occupancy, in the same int64 arithmetic */
            int64_t threads = row->block_threads > 1 ? (int64_t)row->block_threads : 1;
            int64_t per_block = (threads + warp - 1) / warp;
            int64_t blocks = max_warps / per_block;
            int64_t registers = (int64_t)row->registers * per_block * warp;
            int64_t by_registers = registers > 0 ? limit[L_REGISTERS] / registers
                                                 : limit[L_BLOCKS];
            int64_t shared = (int64_t)row->static_smem + (int64_t)row->dynamic_smem;
            int64_t by_shared = shared > 0 ? limit[L_SHARED] / shared : limit[L_BLOCKS];
            blocks = by_registers < blocks ? by_registers : blocks;
            blocks = by_shared < blocks ? by_shared : blocks;
            blocks = limit[L_BLOCKS] < blocks ? limit[L_BLOCKS] : blocks;
            at[metric[M_FGP_ACT]] += (double)(blocks * per_block);
            at[metric[M_FGP_MAX]] += (double)max_warps;
            at[metric[M_THR_REG]] += (double)row->registers;
            at[metric[M_BLK_THR]] += (double)row->block_threads;
            at[metric[M_BLK_SM]] += (double)shared;
            at[metric[M_BLKS]] += (double)row->grid_blocks;
        } else if (kind == kinds[K_COPY]) {
            at[metric[M_GXCOPY]] += duration;
            at[metric[M_GXCOPY_COUNT]] += 1.0;
            at[metric[M_GXCOPY_BYTES] + (row->copy_kind < 11 ? row->copy_kind : 0)] +=
                (double)row->bytes;
        } else if (kind == kinds[K_MEMSET]) {
            at[metric[M_GMSET]] += duration;
            at[metric[M_GMSET_COUNT]] += 1.0;
            at[metric[M_GMSET_BYTES] + (row->memory_kind < 8 ? row->memory_kind : 0)] +=
                (double)row->bytes;
        } else if (kind == kinds[K_ALLOC] || kind == kinds[K_FREE]) {
            double *into = kind == kinds[K_ALLOC] ? at : freed + group * width;
            into[metric[M_GMEM]] += duration;
            into[metric[M_GMEM_COUNT]] += 1.0;
            into[metric[M_GMEM_BYTES] + (row->memory_kind < 8 ? row->memory_kind : 0)] +=
                (double)row->bytes;
        } else if (kind == kinds[K_SYNC]) {
            at[metric[M_GSYNC]] += duration;
            at[metric[M_GSYNC_COUNT]] += 1.0;
            at[metric[M_GSYNC_TIME] + (row->sync_kind < 5 ? row->sync_kind : 0)] += duration;
        }
    }
    if (!bad)
        for (size_t cell = 0; cell < cells; cell++)
            sums[cell] += freed[cell]; /* numpy: the allocations' sums, then the frees' added */
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "activity_sums: a target outside the groups");
    else
        result = PyBytes_FromStringAndSize((const char *)sums,
                                           (Py_ssize_t)((size_t)groups * width * sizeof(double)));
done:
    free(sums);
    free(freed);
    PyBuffer_Release(&rows_buffer);
    PyBuffer_Release(&targets_buffer);
    PyBuffer_Release(&layout_buffer);
    PyBuffer_Release(&limits_buffer);
    return result;
}

/* pyrun's sampling engine: native call stacks (issue #17), x86-64 Linux.
 *
 * The handler unwinds the interrupted thread's native stack with an unwinder of our own that
 * reads the .eh_frame_hdr / .eh_frame call-frame information every ELF module of the process
 * carries (gcc and clang emit asynchronous unwind tables by default on x86-64: the CFA rule is
 * exact at every instruction, prologues and epilogues included). It is async-signal-safe by
 * construction: no lock, no allocation, no call into libgcc or the loader, and every read is
 * checked before it is made:
 *
 * - the module table (modules.c: the code ranges, readable segments and .eh_frame_hdr of every
 *   module) is built outside the handler and published as one immutable block;
 * - a read of unwind information must lie inside a readable PT_LOAD segment of the module the pc
 *   belongs to; a read of the stack must lie between the interrupted stack pointer and the top of
 *   the thread's stack (its pthread attributes for threads that register, else the mapping of
 *   /proc/self/maps that holds the stack pointer);
 * - the walk is bounded (ENGINE_NATIVE_DEPTH frames), each step must move the stack pointer up,
 *   and an instruction of the CFA program or a DWARF expression it does not know ends the walk.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <ucontext.h>
#endif

#include "engine.h"

/* -- reading call-frame information (only inside a module's readable segments) ---------------- */

static int readable(const NativeModule *m, const uint8_t *p, size_t n, const uint8_t **end) {
    uintptr_t lo = (uintptr_t)p;
    for (int i = 0; i < m->nseg; i++)
        if (lo >= m->seg_lo[i] && lo < m->seg_hi[i] && n <= m->seg_hi[i] - lo) {
            if (end != NULL) *end = (const uint8_t *)m->seg_hi[i];
            return 1;
        }
    return 0;
}

static int uleb(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t value = 0;
    for (unsigned shift = 0; *p < end; shift += 7) {
        uint8_t byte = *(*p)++;
        if (shift < 64) value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return 0;
        }
    }
    return -1;
}

static int sleb(const uint8_t **p, const uint8_t *end, int64_t *out) {
    uint64_t value = 0;
    unsigned shift = 0;
    while (*p < end) {
        uint8_t byte = *(*p)++;
        if (shift < 64) value |= (uint64_t)(byte & 0x7f) << shift;
        shift += 7;
        if (!(byte & 0x80)) {
            if (shift < 64 && (byte & 0x40)) value |= ~0ull << shift;
            *out = (int64_t)value;
            return 0;
        }
    }
    return -1;
}

/* A DW_EH_PE-encoded value (absolute, pc-relative or relative to `datarel`; never indirect). */
static int encoded(const uint8_t **p, const uint8_t *end, uint8_t encoding, uintptr_t datarel,
                   uintptr_t *out) {
    const uint8_t *at = *p;
    uint64_t value = 0;
    int64_t signed_value;
    size_t width = 0;
    switch (encoding & 0x0f) {
    case 0x00: case 0x04: case 0x0c: width = 8; break;
    case 0x02: case 0x0a: width = 2; break;
    case 0x03: case 0x0b: width = 4; break;
    case 0x01: if (uleb(p, end, &value) != 0) return -1; break;
    case 0x09:
        if (sleb(p, end, &signed_value) != 0) return -1;
        value = (uint64_t)signed_value;
        break;
    default: return -1;
    }
    if (width) {
        if ((size_t)(end - at) < width) return -1;
        if (width == 2) {
            uint16_t v;
            memcpy(&v, at, 2);
            value = (encoding & 0x08) ? (uint64_t)(int64_t)(int16_t)v : v;
        } else if (width == 4) {
            uint32_t v;
            memcpy(&v, at, 4);
            value = (encoding & 0x08) ? (uint64_t)(int64_t)(int32_t)v : v;
        } else {
            memcpy(&value, at, 8);
        }
        *p = at + width;
    }
    switch (encoding & 0x70) {
    case 0x00: break;
    case 0x10: value += (uintptr_t)at; break;
    case 0x30: value += datarel; break;
    default: return -1;
    }
    *out = (uintptr_t)value;
    return 0;
}

/* A CIE or FDE record at `at`: its content [*body, *end), all inside one readable segment. */
static int record(const NativeModule *m, const uint8_t *at, const uint8_t **body,
                  const uint8_t **end) {
    uint32_t length;
    if (!readable(m, at, 4, NULL)) return -1;
    memcpy(&length, at, 4);
    if (length == 0 || length == 0xffffffffu || !readable(m, at, 4 + (size_t)length, NULL))
        return -1;
    *body = at + 4;
    *end = at + 4 + length;
    return 0;
}

static int parse_cie(const NativeModule *m, const uint8_t *cie, Fde *fde, int *has_z) {
    const uint8_t *p, *end;
    if (record(m, cie, &p, &end) != 0 || end - p < 6) return -1;
    uint32_t id;
    memcpy(&id, p, 4);
    p += 4;
    uint8_t version = *p++;
    if (id != 0 || (version != 1 && version != 3)) return -1;
    const char *aug = (const char *)p;
    size_t length = strnlen(aug, (size_t)(end - p));
    if (length == (size_t)(end - p)) return -1;
    p += length + 1;
    uint64_t ra;
    if (uleb(&p, end, &fde->code_align) != 0 || sleb(&p, end, &fde->data_align) != 0) return -1;
    if (version == 1) {
        if (p >= end) return -1;
        ra = *p++;
    } else if (uleb(&p, end, &ra) != 0) {
        return -1;
    }
    fde->ra_reg = (uint32_t)ra;
    fde->encoding = 0;
    *has_z = aug[0] == 'z';
    if (aug[0] == 'z') {
        uint64_t size;
        if (uleb(&p, end, &size) != 0 || size > (uint64_t)(end - p)) return -1;
        const uint8_t *data_end = p + size;
        for (const char *c = aug + 1; *c && p < data_end; c++) {
            uintptr_t ignored;
            if (*c == 'R') fde->encoding = *p++;
            else if (*c == 'L') p++;
            else if (*c == 'P') {
                uint8_t encoding = *p++;
                if (encoded(&p, data_end, encoding & 0x7f, 0, &ignored) != 0) return -1;
            } else if (*c != 'S' && *c != 'B') break;
        }
        p = data_end;
    } else if (aug[0] != 0) {
        return -1;
    }
    fde->cie_insns = p;
    fde->cie_end = end;
    return 0;
}

static int parse_fde(const NativeModule *m, const uint8_t *at, Fde *fde) {
    const uint8_t *p, *end;
    if (record(m, at, &p, &end) != 0 || end - p < 4) return -1;
    uint32_t back;
    memcpy(&back, p, 4);
    if (back == 0 || (uintptr_t)p < back) return -1; /* a CIE, not an FDE */
    int has_z;
    if (parse_cie(m, p - back, fde, &has_z) != 0) return -1;
    p += 4;
    uintptr_t start, range;
    if (encoded(&p, end, fde->encoding, 0, &start) != 0 ||
        encoded(&p, end, fde->encoding & 0x0f, 0, &range) != 0)
        return -1;
    if (has_z) {
        uint64_t size;
        if (uleb(&p, end, &size) != 0 || size > (uint64_t)(end - p)) return -1;
        p += size;
    }
    fde->pc_lo = start;
    fde->pc_hi = start + range;
    fde->insns = p;
    fde->insns_end = end;
    return 0;
}

/* The FDE covering `pc`, by binary search in the module's .eh_frame_hdr table. */
int engine_find_fde(const NativeModule *m, uintptr_t pc, Fde *fde) {
    const uint8_t *hdr = m->eh_hdr, *end;
    if (hdr == NULL || !readable(m, hdr, 4, &end) || hdr[0] != 1 || hdr[3] != 0x3b) return -1;
    const uint8_t *p = hdr + 4;
    uintptr_t frames, count;
    if (encoded(&p, end, hdr[1], (uintptr_t)hdr, &frames) != 0 ||
        encoded(&p, end, hdr[2], (uintptr_t)hdr, &count) != 0 || count == 0 ||
        count > (uintptr_t)(end - p) / 8)
        return -1;
    const int32_t *table = (const int32_t *)p;
    uintptr_t lo = 0, hi = count; /* the last entry whose start is <= pc */
    if ((uintptr_t)hdr + table[0] > pc) return -1;
    while (hi - lo > 1) {
        uintptr_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)hdr + table[2 * mid] <= pc) lo = mid;
        else hi = mid;
    }
    if (parse_fde(m, hdr + table[2 * lo + 1], fde) != 0) return -1;
    return pc >= fde->pc_lo && pc < fde->pc_hi ? 0 : -1;
}

/* -- the CFA program ---------------------------------------------------------------------------- */

static void set_rule(Row *row, uint64_t reg, int how, int64_t value) {
    if (reg < NREGS) {
        row->reg[reg].how = (uint8_t)how;
        row->reg[reg].value = value;
    }
}

/* Run CFA instructions [p, end) until the location passes `target`. */
static int run_cfa(const uint8_t *p, const uint8_t *end, const Fde *fde, uintptr_t target,
                   Row *row, const Row *initial) {
    Row saved[ENGINE_CFA_STACK];
    int depth = 0;
    uintptr_t loc = fde->pc_lo;
    while (p < end) {
        uint8_t op = *p++;
        uint64_t reg, a;
        int64_t s;
        uintptr_t delta = 0;
        if ((op & 0xc0) == 0x40) {
            delta = (op & 0x3f) * fde->code_align;
        } else if ((op & 0xc0) == 0x80) {
            if (uleb(&p, end, &a) != 0) return -1;
            set_rule(row, op & 0x3f, RULE_OFFSET, (int64_t)a * fde->data_align);
            continue;
        } else if ((op & 0xc0) == 0xc0) {
            reg = op & 0x3f;
            if (reg < NREGS) row->reg[reg] = initial ? initial->reg[reg] : (Rule){0, 0};
            continue;
        } else {
            switch (op) {
            case 0x00: continue;
            case 0x01: {
                uintptr_t value;
                if (encoded(&p, end, fde->encoding, 0, &value) != 0) return -1;
                if (value > target) return 0;
                loc = value;
                continue;
            }
            case 0x02: if (end - p < 1) return -1; delta = p[0]; p += 1; break;
            case 0x03: { uint16_t v; if (end - p < 2) return -1; memcpy(&v, p, 2); delta = v; p += 2; break; }
            case 0x04: { uint32_t v; if (end - p < 4) return -1; memcpy(&v, p, 4); delta = v; p += 4; break; }
            case 0x05: case 0x14: case 0x2f:
                if (uleb(&p, end, &reg) != 0 || uleb(&p, end, &a) != 0) return -1;
                s = (int64_t)a * fde->data_align;
                set_rule(row, reg, op == 0x14 ? RULE_VAL_OFFSET : RULE_OFFSET, op == 0x2f ? -s : s);
                continue;
            case 0x11: case 0x15:
                if (uleb(&p, end, &reg) != 0 || sleb(&p, end, &s) != 0) return -1;
                set_rule(row, reg, op == 0x15 ? RULE_VAL_OFFSET : RULE_OFFSET, s * fde->data_align);
                continue;
            case 0x06: case 0x07: case 0x08:
                if (uleb(&p, end, &reg) != 0) return -1;
                if (op == 0x06) {
                    if (reg < NREGS) row->reg[reg] = initial ? initial->reg[reg] : (Rule){0, 0};
                } else {
                    set_rule(row, reg, op == 0x07 ? RULE_UNDEFINED : RULE_SAME, 0);
                }
                continue;
            case 0x09:
                if (uleb(&p, end, &reg) != 0 || uleb(&p, end, &a) != 0) return -1;
                set_rule(row, reg, RULE_REGISTER, (int64_t)a);
                continue;
            case 0x0a:
                if (depth == ENGINE_CFA_STACK) return -1;
                saved[depth++] = *row;
                continue;
            case 0x0b:
                if (depth == 0) return -1;
                *row = saved[--depth];
                continue;
            case 0x0c:
                if (uleb(&p, end, &reg) != 0 || uleb(&p, end, &a) != 0) return -1;
                row->cfa_reg = (uint32_t)reg;
                row->cfa_off = (int64_t)a;
                row->cfa_expr = NULL;
                continue;
            case 0x12:
                if (uleb(&p, end, &reg) != 0 || sleb(&p, end, &s) != 0) return -1;
                row->cfa_reg = (uint32_t)reg;
                row->cfa_off = s * fde->data_align;
                row->cfa_expr = NULL;
                continue;
            case 0x0d:
                if (uleb(&p, end, &reg) != 0) return -1;
                row->cfa_reg = (uint32_t)reg;
                row->cfa_expr = NULL;
                continue;
            case 0x0e:
                if (uleb(&p, end, &a) != 0) return -1;
                row->cfa_off = (int64_t)a;
                continue;
            case 0x13:
                if (sleb(&p, end, &s) != 0) return -1;
                row->cfa_off = s * fde->data_align;
                continue;
            case 0x0f:
                if (uleb(&p, end, &a) != 0 || a > (uint64_t)(end - p)) return -1;
                row->cfa_expr = p;
                row->cfa_expr_end = p + a;
                p += a;
                continue;
            case 0x10: case 0x16:
                if (uleb(&p, end, &reg) != 0 || uleb(&p, end, &a) != 0 || a > (uint64_t)(end - p))
                    return -1;
                set_rule(row, reg, RULE_EXPRESSION, 0);
                p += a;
                continue;
            case 0x2e:
                if (uleb(&p, end, &a) != 0) return -1;
                continue;
            default:
                return -1;
            }
        }
        if (loc + delta > target) return 0;
        loc += delta;
    }
    return 0;
}

/* -- stepping ----------------------------------------------------------------------------------- */

typedef struct {
    uintptr_t r[NREGS];
    uint32_t known; /* bit i: r[i] is known */
    uintptr_t stack_lo, stack_hi;
} Regs;

static int stack_read(const Regs *regs, uintptr_t address, uintptr_t *out) {
    if (address < regs->stack_lo || address > regs->stack_hi - 8 || (address & 7)) return -1;
    *out = *(const uintptr_t *)address;
    return 0;
}

/* The CFA from a DWARF expression: the subset compilers emit for realigned stacks
 * (DW_OP_breg<n> offset; DW_OP_deref; DW_OP_plus_uconst). */
static int cfa_expression(const Row *row, const Regs *regs, uintptr_t *out) {
    uintptr_t stack[4];
    int depth = 0;
    for (const uint8_t *p = row->cfa_expr; p < row->cfa_expr_end;) {
        uint8_t op = *p++;
        if (op >= 0x70 && op <= 0x70 + NREGS - 1) {
            int64_t offset;
            unsigned reg = op - 0x70u;
            if (depth == 4 || !(regs->known & (1u << reg)) || sleb(&p, row->cfa_expr_end, &offset))
                return -1;
            stack[depth++] = regs->r[reg] + (uintptr_t)offset;
        } else if (op == 0x06) {
            if (depth == 0 || stack_read(regs, stack[depth - 1], &stack[depth - 1]) != 0) return -1;
        } else if (op == 0x23) {
            uint64_t a;
            if (depth == 0 || uleb(&p, row->cfa_expr_end, &a) != 0) return -1;
            stack[depth - 1] += a;
        } else {
            return -1;
        }
    }
    if (depth != 1) return -1;
    *out = stack[0];
    return 0;
}

#define CALLEE_SAVED ((1u << 3) | (1u << 6) | (1u << 12) | (1u << 13) | (1u << 14) | (1u << 15))

/* One frame up: 1 stepped, 0 the outermost frame (return address undefined), -1 cannot. */
/* The CFA rule row at `lookup`: from the thread's cache of rows (direct-mapped, by pc and table
 * generation: stacks repeat, and the binary search of a large .eh_frame_hdr touches memory that
 * is cold at 200 samples per second), else from the module's call-frame information. */
static int row_at(const NativeModule *m, uintptr_t lookup, Slot *slot, uint32_t gen, Row *row) {
    Recipe *recipe = NULL;
    if (slot->recipes != NULL) {
        uint64_t h = (uint64_t)lookup * 0x9E3779B97F4A7C15ull;
        recipe = &slot->recipes[(h >> 40) & (ENGINE_RECIPES - 1)];
        if (recipe->pc == lookup && recipe->gen == gen) {
            for (int i = 0; i < NREGS; i++) {
                row->reg[i].how = recipe->how[i];
                row->reg[i].value = recipe->value[i];
            }
            row->cfa_reg = recipe->cfa_reg;
            row->cfa_off = recipe->cfa_off;
            row->cfa_expr = recipe->cfa_expr;
            row->cfa_expr_end = recipe->cfa_expr_end;
            return 0;
        }
    }
    Fde fde;
    if (engine_find_fde(m, lookup, &fde) != 0) return -1;
    Row initial;
    memset(row, 0, sizeof(*row));
    if (run_cfa(fde.cie_insns, fde.cie_end, &fde, UINTPTR_MAX, row, NULL) != 0) return -1;
    initial = *row;
    if (run_cfa(fde.insns, fde.insns_end, &fde, lookup, row, &initial) != 0) return -1;
    if (fde.ra_reg != 16) return -1;
    if (recipe == NULL || row->cfa_off != (int32_t)row->cfa_off || row->cfa_reg > 255) return 0;
    for (int i = 0; i < NREGS; i++)
        if (row->reg[i].value != (int32_t)row->reg[i].value) return 0;
    recipe->pc = 0; /* a handler never interrupts another on its thread, but stay consistent */
    for (int i = 0; i < NREGS; i++) {
        recipe->how[i] = row->reg[i].how;
        recipe->value[i] = (int32_t)row->reg[i].value;
    }
    recipe->cfa_reg = (uint8_t)row->cfa_reg;
    recipe->cfa_off = (int32_t)row->cfa_off;
    recipe->cfa_expr = row->cfa_expr;
    recipe->cfa_expr_end = row->cfa_expr_end;
    recipe->gen = gen;
    recipe->pc = lookup;
    return 0;
}

static int step(const NativeModule *m, Regs *regs, uintptr_t lookup, Slot *slot, uint32_t gen) {
    Row row;
    if (row_at(m, lookup, slot, gen, &row) != 0) return -1;
    uintptr_t cfa;
    if (row.cfa_expr != NULL) {
        if (cfa_expression(&row, regs, &cfa) != 0) return -1;
    } else {
        if (row.cfa_reg >= NREGS || !(regs->known & (1u << row.cfa_reg))) return -1;
        cfa = regs->r[row.cfa_reg] + (uintptr_t)row.cfa_off;
    }
    if (row.reg[16].how == RULE_UNDEFINED) return 0;
    Regs next = *regs;
    next.known = 0;
    for (unsigned i = 0; i < NREGS; i++) {
        Rule rule = row.reg[i];
        uintptr_t value;
        switch (rule.how) {
        case RULE_UNSPECIFIED:
            if ((CALLEE_SAVED & (1u << i)) && (regs->known & (1u << i))) next.known |= 1u << i;
            break;
        case RULE_SAME:
            if (regs->known & (1u << i)) next.known |= 1u << i;
            break;
        case RULE_OFFSET:
            if (stack_read(regs, cfa + (uintptr_t)rule.value, &value) == 0) {
                next.r[i] = value;
                next.known |= 1u << i;
            }
            break;
        case RULE_VAL_OFFSET:
            next.r[i] = cfa + (uintptr_t)rule.value;
            next.known |= 1u << i;
            break;
        case RULE_REGISTER:
            if (rule.value >= 0 && rule.value < NREGS && (regs->known & (1u << rule.value))) {
                next.r[i] = regs->r[rule.value];
                next.known |= 1u << i;
            }
            break;
        default:
            break;
        }
    }
    if (!(next.known & (1u << 16)) || cfa <= regs->r[7]) return -1;
    next.r[7] = cfa; /* x86-64: the caller's stack pointer is the CFA */
    next.known |= 1u << 7;
    *regs = next;
    return 1;
}

static const NativeModule *module_of(const NativeTable *table, uintptr_t pc) {
    uint32_t lo = 0, hi = table->nmods;
    while (lo < hi) { /* the first module whose text starts above pc */
        uint32_t mid = lo + (hi - lo) / 2;
        if (table->mods[mid].text_lo <= pc) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return NULL;
    const NativeModule *m = &table->mods[lo - 1];
    return pc < m->text_hi ? m : NULL;
}

/* The readable range of the stack that holds `sp`: the thread's own bounds if it registered
 * them, else the mapping of /proc/self/maps that holds it. */
static int stack_bounds(const NativeTable *table, const Slot *slot, uintptr_t sp, Regs *regs) {
    if (slot->stack_hi && sp >= slot->stack_lo && sp < slot->stack_hi) {
        regs->stack_hi = slot->stack_hi;
    } else {
        uint32_t lo = 0, hi = table->nmaps;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (table->maps[mid].lo <= sp) lo = mid + 1;
            else hi = mid;
        }
        if (lo == 0 || sp >= table->maps[lo - 1].hi) return -1;
        regs->stack_hi = table->maps[lo - 1].hi;
    }
    regs->stack_lo = sp;
    return 0;
}

/* The interrupted thread's native frames, innermost first: (registry id, offset in the file's
 * address space: the pc for the interrupted frame, the return address minus one for callers, as
 * hpcrun records them), kind, and whether it runs the eval loop. */
int engine_native_stack(const void *context, Slot *slot, NativeFrame *out, int max) {
#if defined(__x86_64__)
    static const int greg[NREGS] = {REG_RAX, REG_RDX, REG_RCX, REG_RBX, REG_RSI, REG_RDI,
                                    REG_RBP, REG_RSP, REG_R8,  REG_R9,  REG_R10, REG_R11,
                                    REG_R12, REG_R13, REG_R14, REG_R15, REG_RIP};
    const NativeTable *table = atomic_load(&engine_native_table);
    if (table == NULL || context == NULL) return 0;
    const ucontext_t *uc = context;
    Regs regs;
    for (int i = 0; i < NREGS; i++) regs.r[i] = (uintptr_t)uc->uc_mcontext.gregs[greg[i]];
    regs.known = (1u << NREGS) - 1;
    int bounded = stack_bounds(table, slot, regs.r[7], &regs) == 0;
    int n = 0;
    for (int leaf = 1; n < max; leaf = 0) {
        uintptr_t lookup = leaf ? regs.r[16] : regs.r[16] - 1;
        const NativeModule *m = module_of(table, lookup);
        if (m == NULL) break;
        out[n].module = m->id;
        out[n].offset = lookup - m->bias;
        out[n].kind = m->kind;
        out[n].eval = lookup >= table->eval_lo && lookup < table->eval_hi;
        n++;
        if (!bounded || step(m, &regs, lookup, slot, table->gen) <= 0) break;
    }
    return n;
#else
    (void)context; (void)slot; (void)out; (void)max;
    return 0;
#endif
}

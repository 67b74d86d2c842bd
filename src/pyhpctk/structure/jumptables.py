"""Resolve x86-64 switch jump tables, so that the cases of a switch are part of the CFG.

Dyninst's ParseAPI follows jump tables by slicing; pystruct recognises the two shapes compilers
emit and bounds them by the range check that guards every table, never by guessing:

* position independent (gcc, clang ``-fPIC``/PIE)::

      lea    rT, [rip + TABLE]          ; anywhere earlier in the function
      cmp    eI, N ; ja DEFAULT         ; the bound: N + 1 entries
      movsxd rJ, dword ptr [rT + rI*4]
      add    rJ, rT
      jmp    rJ                         ; targets: TABLE + int32 entry

* absolute (non-PIC)::

      cmp    eI, N ; ja DEFAULT
      jmp    qword ptr [rI*8 + TABLE]   ; targets: uint64 entry

An indirect jump that matches neither shape, has no bound within a few instructions, or whose
entries fall outside the function stays unresolved (its block simply ends), as before.
"""

from __future__ import annotations

import re
import struct

import capstone

from pyhpctk.structure.cfg import Flow, Instruction
from pyhpctk.structure.elfimage import ElfImage

MAX_ENTRIES = 4096
WINDOW = 12  # instructions searched back from the jump for the bound and the load

_REG = r"[a-z0-9]+"
_JMP_REG = re.compile(rf"^({_REG})$")
_JMP_MEM = re.compile(rf"^qword ptr \[(?:({_REG})\*8 \+ )?(0x[0-9a-f]+)\]$")
_ADD = re.compile(rf"^({_REG}), ({_REG})$")
_MOVSXD = re.compile(rf"^({_REG}), dword ptr \[({_REG}) \+ ({_REG})\*4\]$")
_LEA_RIP = re.compile(rf"^({_REG}), \[rip \+ (0x[0-9a-f]+)\]$")
_CMP_IMM = re.compile(rf"^({_REG}), (0x[0-9a-f]+|\d+)$")

# Registers that alias each other for the purpose of matching an index to its bound check.
_FAMILY = {
    **{r: r[1:] for r in ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp")},
    **{r: r[1:] for r in ("eax", "ebx", "ecx", "edx", "esi", "edi", "ebp", "esp")},
    **{f"r{i}": f"r{i}" for i in range(8, 16)},
    **{f"r{i}d": f"r{i}" for i in range(8, 16)},
}


def _family(register: str) -> str:
    return _FAMILY.get(register, register)


class JumpTableResolver:
    """Finds the targets of indirect jumps in one x86-64 image."""

    def __init__(self, image: ElfImage) -> None:
        self.image = image
        self._md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)

    def _text(self, start: int, end: int) -> list[tuple[int, int, str, str]]:
        code = self.image.read(start, end)
        return [(a, s, m.rsplit(" ", 1)[-1], o) for a, s, m, o in self._md.disasm_lite(code, start)]

    def _bound(self, window: list[tuple[int, int, str, str]], index_reg: str) -> int | None:
        """N + 1 from the last ``cmp IDX, N`` followed by ``ja``/``jae`` in the window."""
        for k in range(len(window) - 1, 0, -1):
            mnemonic = window[k][2]
            if mnemonic not in ("ja", "jae", "jbe", "jb"):
                continue
            _, _, prev_m, prev_ops = window[k - 1]
            m = _CMP_IMM.match(prev_ops)
            if prev_m != "cmp" or m is None or _family(m.group(1)) != _family(index_reg):
                continue
            limit = int(m.group(2), 0)
            count = limit + 1 if mnemonic in ("ja", "jbe") else limit
            return count if 0 < count <= MAX_ENTRIES else None
        return None

    def resolve(
        self, instructions: list[Instruction], start: int, end: int
    ) -> dict[int, list[int]]:
        """Jump address -> case targets, for every resolvable indirect jump in ``[start, end)``."""
        jumps = [
            i for i, ins in enumerate(instructions) if ins.flow == Flow.JUMP and ins.target is None
        ]
        if not jumps:
            return {}
        text = self._text(start, end)
        position = {a: k for k, (a, _, _, _) in enumerate(text)}
        out: dict[int, list[int]] = {}
        for i in jumps:
            k = position.get(instructions[i].address)
            if k is None:
                continue
            window = text[max(0, k - WINDOW) : k + 1]
            targets = self._resolve_one(text, k, window)
            valid = [t for t in targets if start <= t < end and t in position]
            if valid and len(valid) == len(targets):
                out[instructions[i].address] = sorted(set(valid))
        return out

    def _resolve_one(
        self, text: list[tuple[int, int, str, str]], k: int, window: list[tuple[int, int, str, str]]
    ) -> list[int]:
        _, _, _, ops = text[k]
        m = _JMP_MEM.match(ops)
        if m is not None and m.group(1):
            count = self._bound(window[:-1], m.group(1))
            if count is None:
                return []
            return self._read_table(int(m.group(2), 16), count, absolute=True)
        m = _JMP_REG.match(ops)
        if m is None or len(window) < 3:
            return []
        target_reg = m.group(1)
        add = window[-2]
        movsxd = window[-3]
        ma = _ADD.match(add[3])
        mm = _MOVSXD.match(movsxd[3])
        if add[2] != "add" or movsxd[2] != "movsxd" or ma is None or mm is None:
            return []
        if ma.group(1) != target_reg or mm.group(1) != target_reg or ma.group(2) != mm.group(2):
            return []
        base_reg, index_reg = mm.group(2), mm.group(3)
        count = self._bound(window[:-3], index_reg)
        if count is None:
            return []
        # The table base: the last "lea BASE, [rip + X]" before the load, in address order.
        table = None
        for a, size, mnemonic, operands in reversed(text[: k - 2]):
            ml = _LEA_RIP.match(operands)
            if mnemonic == "lea" and ml is not None and ml.group(1) == base_reg:
                table = a + size + int(ml.group(2), 16)
                break
        if table is None:
            return []
        return self._read_table(table, count, absolute=False)

    def _read_table(self, table: int, count: int, absolute: bool) -> list[int]:
        width = 8 if absolute else 4
        data = self.image.read_data(table, count * width)
        if len(data) < count * width:
            return []
        if absolute:
            return list(struct.unpack(f"<{count}Q", data))
        return [table + off for off in struct.unpack(f"<{count}i", data)]

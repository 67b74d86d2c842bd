"""Control-flow graphs of machine code and their loop nests.

Instructions come from capstone (x86-64, AArch64) or from nvdisasm (CUDA, see
:mod:`pyhpctk.structure.cubin`); both reduce to :class:`Instruction` records classified by how
they transfer control. A function's CFG is built by splitting its instruction stream at branch
targets and after branches, calls and returns (as Dyninst's ParseAPI does for hpcstruct), keeping
only blocks reachable from the entry. Loops come from the DFS algorithm of Wei, Mao, Zou and Chen
("A New Algorithm for Identifying Loops in Decompilation", SAS 2007), the one Dyninst uses: it
finds every natural loop and also irreducible regions (several entries), and gives the loop nest
directly. This module knows nothing about source lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import capstone

from pyhpctk.structure.elfimage import EM_AARCH64, EM_X86_64


class Flow(IntEnum):
    """How an instruction transfers control."""

    NEXT = 0  # falls through
    JUMP = 1  # unconditional jump (target may be unknown: indirect)
    BRANCH = 2  # conditional branch: target and fall-through
    CALL = 3  # call: callee, then fall-through
    RETURN = 4  # return or trap: no successor


class Instruction(NamedTuple):
    """One decoded instruction: address, length, control flow and direct target.

    A named tuple rather than a frozen dataclass: large libraries decode millions of these.
    """

    address: int
    size: int
    flow: Flow
    target: int | None = None


@dataclass(slots=True)
class Block:
    """A basic block: ``[start, end)``, its instructions and intra-procedural successors."""

    index: int
    start: int
    end: int
    instructions: list[Instruction]
    succs: list[int] = field(default_factory=list)
    preds: list[int] = field(default_factory=list)
    call_target: int | None = None
    is_call: bool = False

    @property
    def last(self) -> int:
        return self.instructions[-1].address


@dataclass(slots=True)
class Loop:
    """A loop of the loop nest: header block, every block inside (subloops too), entries."""

    header: int
    blocks: set[int]
    entries: list[int]
    children: list[Loop] = field(default_factory=list)
    irreducible: bool = False


@dataclass(slots=True)
class FunctionCFG:
    """The CFG of one function: reachable blocks (sorted by address) and its loop forest."""

    blocks: list[Block]
    loops: list[Loop]
    instructions: list[Instruction]


_X86_NORETURN = frozenset(
    {
        "exit",
        "_exit",
        "abort",
        "__stack_chk_fail",
        "__assert_fail",
        "__cxa_throw",
        "__cxa_rethrow",
        "_Unwind_Resume",
        "__fortify_fail",
        "longjmp",
        "siglongjmp",
        "pthread_exit",
        "__libc_fatal",
        "err",
        "errx",
        "verr",
        "verrx",
        "_Exit",
        "quick_exit",
        "__cxa_bad_cast",
        "__cxa_call_unexpected",
        "std::terminate()",
    }
)


def noreturn_names() -> frozenset[str]:
    """Names of library functions that never return (calls to them end a block)."""
    return _X86_NORETURN


class Decoder:
    """Decode and classify machine code of one architecture with capstone."""

    def __init__(self, machine: int) -> None:
        if machine == EM_X86_64:
            self._md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
            self._classify = _classify_x86
        elif machine == EM_AARCH64:
            self._md = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
            self._classify = _classify_arm64
        else:
            raise ValueError(f"no capstone decoder for e_machine {machine}")
        self._md.skipdata = False
        self.machine = machine

    def decode(self, code: bytes, start: int) -> list[Instruction]:
        """Linear sweep of ``code`` at ``start``; undecodable bytes become 1-byte stops."""
        result: list[Instruction] = []
        offset = 0
        n = len(code)
        classify = self._classify
        # Only mnemonics starting with these letters can transfer control (a cheap pre-filter).
        flow_letters = "jcrlhu" if self.machine == EM_X86_64 else "bcrtuhe"
        next_flow = Flow.NEXT
        append = result.append
        step = 4 if self.machine == EM_AARCH64 else 1
        while offset < n:
            last_end = offset
            for address, size, mnemonic, op_str in self._md.disasm_lite(
                code[offset:], start + offset
            ):
                if mnemonic[0] in flow_letters or " " in mnemonic:
                    flow, target = classify(mnemonic, op_str)
                    append(Instruction(address, size, flow, target))
                else:
                    append(Instruction(address, size, next_flow, None))
                last_end = address + size - start
            if last_end == offset:
                # capstone stopped on bytes it cannot decode: treat them as a trap.
                size = min(step, n - offset)
                result.append(Instruction(start + offset, size, Flow.RETURN))
                offset += size
            else:
                offset = last_end
        return result


def _imm(op_str: str) -> int | None:
    text = op_str.strip()
    if text.startswith("#"):
        text = text[1:]
    if text.startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            return None
    if text.isdigit():
        return int(text)
    return None


def _classify_x86(mnemonic: str, op_str: str) -> tuple[Flow, int | None]:
    op = mnemonic.rsplit(" ", 1)[-1]  # "bnd jmp", "notrack jmp", "rep ret"
    if op[0] not in "jcrlhu":
        return Flow.NEXT, None
    if op == "jmp" or op == "ljmp":
        return Flow.JUMP, _imm(op_str)
    if op[0] == "j" or op in ("loop", "loope", "loopne"):
        return Flow.BRANCH, _imm(op_str)
    if op in ("call", "lcall"):
        return Flow.CALL, _imm(op_str)
    if op in ("ret", "retf", "retfq", "retq", "hlt", "ud2", "iret", "iretq"):
        return Flow.RETURN, None
    return Flow.NEXT, None


def _classify_arm64(mnemonic: str, op_str: str) -> tuple[Flow, int | None]:
    if mnemonic == "b":
        return Flow.JUMP, _imm(op_str)
    if mnemonic.startswith("b."):
        return Flow.BRANCH, _imm(op_str)
    if mnemonic in ("cbz", "cbnz", "tbz", "tbnz"):
        return Flow.BRANCH, _imm(op_str.rsplit(",", 1)[-1])
    if mnemonic == "bl":
        return Flow.CALL, _imm(op_str)
    if mnemonic == "blr":
        return Flow.CALL, None
    if mnemonic == "br":
        return Flow.JUMP, None
    if mnemonic in ("ret", "eret", "brk", "udf", "hlt"):
        return Flow.RETURN, None
    return Flow.NEXT, None


def build_cfg(
    instructions: list[Instruction],
    entry: int,
    start: int,
    end: int,
    noreturn: set[int] | frozenset[int] = frozenset(),
    other_entries: set[int] | frozenset[int] = frozenset(),
    jump_tables: dict[int, list[int]] | None = None,
) -> FunctionCFG:
    """Blocks reachable from ``entry`` within ``[start, end)``, with their loop forest.

    Jumps leaving the range or landing on another function's entry are tail calls (no edge;
    ``other_entries`` may contain ``entry`` itself, a jump to it stays inside);
    calls end a block and fall through unless their target is in ``noreturn``. ``jump_tables``
    gives the case targets of resolved indirect jumps (:mod:`pyhpctk.structure.jumptables`).
    """
    if not instructions:
        return FunctionCFG([], [], instructions)
    addresses = {ins.address for ins in instructions}
    tables = jump_tables or {}
    leaders = {entry}
    for cases in tables.values():
        leaders.update(t for t in cases if t in addresses)
    for i, ins in enumerate(instructions):
        if ins.flow == Flow.NEXT:
            continue
        if (
            ins.flow in (Flow.JUMP, Flow.BRANCH)
            and ins.target is not None
            and start <= ins.target < end
            and ins.target in addresses
            and (ins.target == entry or ins.target not in other_entries)
        ):
            leaders.add(ins.target)
        if i + 1 < len(instructions):
            leaders.add(instructions[i + 1].address)
    # Split the stream into blocks.
    raw: list[list[Instruction]] = []
    current: list[Instruction] = []
    for ins in instructions:
        if ins.address in leaders and current:
            raw.append(current)
            current = []
        current.append(ins)
    if current:
        raw.append(current)
    block_at = {b[0].address: i for i, b in enumerate(raw)}
    succs: list[list[int]] = [[] for _ in raw]
    calls: list[tuple[bool, int | None]] = [(False, None)] * len(raw)
    for i, body in enumerate(raw):
        last = body[-1]
        fall = (
            i + 1
            if i + 1 < len(raw) and raw[i + 1][0].address == last.address + last.size
            else None
        )
        targets: list[int] = []
        if last.flow == Flow.NEXT:
            if fall is not None:
                targets.append(fall)
        elif last.flow in (Flow.JUMP, Flow.BRANCH):
            t = last.target
            intra = t is not None and (t == entry or t not in other_entries)
            if t is not None and intra and start <= t < end and t in block_at:
                targets.append(block_at[t])
            for case in tables.get(last.address, ()):
                block = block_at.get(case)
                if block is not None and block not in targets:
                    targets.append(block)
            if last.flow == Flow.BRANCH and fall is not None and fall not in targets:
                targets.append(fall)
        elif last.flow == Flow.CALL:
            calls[i] = (True, last.target)
            if fall is not None and (last.target is None or last.target not in noreturn):
                targets.append(fall)
        succs[i] = targets
    # Reachability from the entry.
    entry_block = block_at.get(entry)
    if entry_block is None:
        return FunctionCFG([], [], instructions)
    seen = [False] * len(raw)
    order = [entry_block]
    seen[entry_block] = True
    k = 0
    while k < len(order):
        for s in succs[order[k]]:
            if not seen[s]:
                seen[s] = True
                order.append(s)
        k += 1
    kept = sorted(order, key=lambda i: raw[i][0].address)
    renumber = {old: new for new, old in enumerate(kept)}
    blocks = []
    for new, old in enumerate(kept):
        body = raw[old]
        last = body[-1]
        is_call, target = calls[old]
        blocks.append(
            Block(
                new,
                body[0].address,
                last.address + last.size,
                body,
                [renumber[s] for s in succs[old]],
                [],
                target,
                is_call,
            )
        )
    for b in blocks:
        for s in b.succs:
            blocks[s].preds.append(b.index)
    loops = find_loops(blocks, renumber[entry_block])
    return FunctionCFG(blocks, loops, instructions)


def find_loops(blocks: list[Block], entry: int) -> list[Loop]:
    """The loop forest (Wei et al. 2007): outermost loops, each with nested children."""
    n = len(blocks)
    if n == 0:
        return []
    traversed = [False] * n
    pos = [0] * n
    header = [-1] * n
    is_header = [False] * n
    irreducible = [False] * n

    def tag(b: int, h: int) -> None:
        if h == -1 or b == h:
            return
        c1, c2 = b, h
        while header[c1] != -1:
            ih = header[c1]
            if ih == c2:
                return
            if pos[ih] < pos[c2]:
                header[c1] = c2
                c1, c2 = c2, ih
            else:
                c1 = ih
        header[c1] = c2

    stack: list[list[int]] = [[entry, 0]]
    traversed[entry] = True
    pos[entry] = 1
    while stack:
        frame = stack[-1]
        b0, i = frame
        out = blocks[b0].succs
        if i < len(out):
            frame[1] = i + 1
            b = out[i]
            if not traversed[b]:
                traversed[b] = True
                pos[b] = len(stack) + 1
                stack.append([b, 0])
                continue
            if pos[b] > 0:
                is_header[b] = True
                tag(b0, b)
            elif header[b] != -1:
                h = header[b]
                if pos[h] > 0:
                    tag(b0, h)
                else:
                    irreducible[h] = True
                    while header[h] != -1:
                        h = header[h]
                        if pos[h] > 0:
                            tag(b0, h)
                            break
                        irreducible[h] = True
        else:
            pos[b0] = 0
            stack.pop()
            if stack:
                tag(stack[-1][0], header[b0])

    loops: dict[int, Loop] = {}
    for h in range(n):
        if is_header[h]:
            loops[h] = Loop(h, {h}, [], irreducible=irreducible[h])
    for b in range(n):
        h = header[b]
        while h != -1:
            if h in loops:
                loops[h].blocks.add(b)
            h = header[h]
    roots: list[Loop] = []
    for h, loop in loops.items():
        parent = header[h]
        while parent != -1 and parent not in loops:
            parent = header[parent]
        if parent == -1:
            roots.append(loop)
        else:
            loops[parent].children.append(loop)
        entries = [h]
        for b in sorted(loop.blocks):
            if b != h and any(p not in loop.blocks for p in blocks[b].preds):
                entries.append(b)
        loop.entries = entries
        if len(entries) > 1:
            loop.irreducible = True
    return roots


def loop_entry_address(loop: Loop, blocks: list[Block]) -> int:
    """The lowest start address of the loop's entry blocks (hpcstruct's ``L v=``)."""
    return min(blocks[b].start for b in loop.entries)

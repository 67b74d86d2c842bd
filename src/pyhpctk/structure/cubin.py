"""Structure of CUDA cubins: functions and line maps from ELF/DWARF, CFGs from nvdisasm.

Cubins differ from host binaries in three ways that matter here (formats.md §4.4):

* every function lives in its own section at address 0, so addresses are relocated to the
  section's file offset (as hpcstruct's ``RelocateCubin.cpp``); the ``.debug_line`` addresses and
  ``.debug_info`` ranges are fixed up through the ``.rel(a).debug_*`` relocations;
* NVCC's ``-lineinfo`` builds record inlining in the line table itself, with the NVIDIA extended
  opcode 0x90 (``inlined call``: a 1-based row number of the call site in the current sequence
  and a ``.debug_str`` offset of the callee's linkage name, relative to the unit's own strings:
  a cubin linked from several units puts their base in 4 bytes at the end of each line-table
  header, as elfutils reads it); ``-G`` builds use ``DW_TAG_inlined_subroutine`` as host code
  does;
* without ``--gpucfg`` hpcstruct does not parse device code: each procedure's range is cut into
  4-byte pieces placed by the line map (no loops, no calls, ``P s=`` symbol index). With
  ``--gpucfg yes`` the instructions come from NVIDIA's ``nvdisasm`` (PyPI:
  ``nvidia-cuda-nvdisasm``), giving CFGs, loops and ``C`` call sites (:mod:`.sass`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcstruct_model import PROCEDURE, Scope, StructureFile, format_ranges
from pyhpctk.structure import dwarf as dw
from pyhpctk.structure.cfg import Instruction, build_cfg
from pyhpctk.structure.elfimage import ElfImage
from pyhpctk.structure.host import FunctionAnalyzer, HostStructOptions, Procedure, assemble
from pyhpctk.structure.inline_tree import Stmt, TreeNode, tree_scopes
from pyhpctk.structure.sampled import holds_any, symbol_scope
from pyhpctk.structure.sass import (
    NvdisasmMissing,
    find_nvdisasm,
    maxwell_instructions,
    nvdisasm_instructions,
)

__all__ = [
    "NvdisasmMissing",
    "analyze_cubin",
    "find_nvdisasm",
    "maxwell_instructions",
    "nvdisasm_instructions",
    "read_cubin_debug",
]

CUDA_PROC_SEARCH_LEN = 32  # Struct.cpp: instructions scanned for a procedure's line
DW_LNE_NVIDIA_INLINED_CALL = 0x90
DW_LNE_NVIDIA_SET_FUNCTION_NAME = 0x91


# --------------------------------------------------------------------------- relocations


def _relocations(image: ElfImage, target: str) -> dict[int, int]:
    """Offset in section ``target`` -> relocated address (section base + symbol + addend)."""
    elf = image.elf
    out: dict[int, int] = {}
    target_section = elf.get_section_by_name(target)
    if target_section is None:
        return out
    target_index = next((i for i, s in enumerate(elf.iter_sections()) if s.name == target), -1)
    for section in elf.iter_sections():
        if not isinstance(section, RelocationSection):
            continue
        if int(section["sh_info"]) != target_index:
            continue
        symtab = elf.get_section(section["sh_link"])
        if not isinstance(symtab, SymbolTableSection):
            continue
        is_rela = section.is_RELA()
        data = target_section.data()
        for reloc in section.iter_relocations():
            offset = int(reloc["r_offset"])
            symbol = symtab.get_symbol(int(reloc["r_info_sym"]))
            shndx = symbol["st_shndx"]
            base = image.section_base.get(shndx, 0) if isinstance(shndx, int) else 0
            if is_rela:
                addend = int(reloc["r_addend"])
            else:
                addend = struct.unpack_from("<Q", data, offset)[0] if offset + 8 <= len(data) else 0
            out[offset] = base + int(symbol["st_value"]) + addend
    return out


# --------------------------------------------------------------------------- line tables


@dataclass(slots=True)
class _Row:
    address: int
    file: int
    line: int
    context: int
    function: int
    end: bool


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def u8(self) -> int:
        v = self.data[self.pos]
        self.pos += 1
        return v

    def u16(self) -> int:
        v: int = struct.unpack_from("<H", self.data, self.pos)[0]
        self.pos += 2
        return v

    def u32(self) -> int:
        v: int = struct.unpack_from("<I", self.data, self.pos)[0]
        self.pos += 4
        return v

    def uleb(self) -> int:
        result = shift = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return result

    def sleb(self) -> int:
        result = shift = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                if b & 0x40:
                    result -= 1 << shift
                return result

    def cstr(self) -> str:
        end = self.data.index(b"\0", self.pos)
        s = self.data[self.pos : end].decode("utf-8", "replace")
        self.pos = end + 1
        return s


@dataclass(slots=True)
class _Program:
    offset: int
    files: list[str]
    sequences: list[list[_Row]]
    strings: int = 0  # .debug_str offset of this unit's function names


def _parse_line_section(
    data: bytes, relocs: dict[int, int], comp_dir: str, resolve: bool = True
) -> list[_Program]:
    """Every line program of a DWARF 2-4 ``.debug_line`` (32-bit), NVIDIA opcodes included."""
    programs: list[_Program] = []
    pos = 0
    while pos + 4 <= len(data):
        r = _Reader(data, pos)
        unit_length = r.u32()
        if unit_length == 0xFFFFFFFF:
            raise ValueError("64-bit DWARF line tables are not supported in cubins")
        end = r.pos + unit_length
        if end > len(data):
            raise ValueError(f"line program at {pos:#x} runs past the section")
        version = r.u16()
        if version > 4:
            raise ValueError(f"line table version {version} in a cubin")
        header_length = r.u32()
        program_start = r.pos + header_length
        min_inst = r.u8()
        if version >= 4:
            r.u8()
        r.u8()  # default_is_stmt
        line_base = struct.unpack("b", bytes([r.u8()]))[0]
        line_range = r.u8()
        opcode_base = r.u8()
        std_lengths = [r.u8() for _ in range(opcode_base - 1)]
        dirs: list[str] = []
        while True:
            d = r.cstr()
            if not d:
                break
            dirs.append(d)
        files: list[str] = []
        while r.pos < program_start:
            name = r.cstr()
            if not name:
                break
            dir_index = r.uleb()
            r.uleb()
            r.uleb()
            directory = (
                comp_dir
                if dir_index == 0
                else (dirs[dir_index - 1] if dir_index - 1 < len(dirs) else "")
            )
            files.append(
                dw.real_path(
                    resolve,
                    name if os.path.isabs(name) or not directory else os.path.join(directory, name),
                )
            )
        # NVIDIA: the unit's base in .debug_str fills the last 4 bytes of the header (nvlink
        # merges the units' strings; 0x90/0x91 name offsets are relative to it).
        strings = r.u32() if r.pos == program_start - 4 else 0
        r.pos = program_start
        sequences: list[list[_Row]] = []
        rows: list[_Row] = []
        address, file, line, context, function = 0, 1, 1, 0, 0
        while r.pos < end:
            op = r.u8()
            if op >= opcode_base:
                adj = op - opcode_base
                address += (adj // line_range) * min_inst
                line += line_base + adj % line_range
                rows.append(_Row(address, file, line, context, function, False))
            elif op == 0:
                length = r.uleb()
                sub_start = r.pos
                sub = r.u8()
                if sub == 1:
                    rows.append(_Row(address, file, line, context, function, True))
                    sequences.append(rows)
                    rows = []
                    address, file, line, context, function = 0, 1, 1, 0, 0
                elif sub == 2:
                    width = length - 1
                    raw = int.from_bytes(data[r.pos : r.pos + width], "little")
                    address = relocs.get(r.pos, raw)
                elif sub == DW_LNE_NVIDIA_INLINED_CALL:
                    context = r.uleb()
                    function = r.uleb()
                elif sub == DW_LNE_NVIDIA_SET_FUNCTION_NAME:
                    function = r.uleb()
                r.pos = sub_start + length
            elif op == 1:
                rows.append(_Row(address, file, line, context, function, False))
            elif op == 2:
                address += r.uleb() * min_inst
            elif op == 3:
                line += r.sleb()
            elif op == 4:
                file = r.uleb()
            elif op == 8:
                address += ((255 - opcode_base) // line_range) * min_inst
            elif op == 9:
                address += r.u16()
            else:
                for _ in range(std_lengths[op - 1] if op - 1 < len(std_lengths) else 0):
                    r.uleb()
        if rows:
            sequences.append(rows)
        programs.append(_Program(pos, files, sequences, strings))
        pos = end
    return programs


def read_cubin_debug(image: ElfImage, resolve_paths: bool = True) -> dw.DebugInfo:
    """Line map and inline table of a cubin; FormatError on corrupt DWARF."""
    try:
        return _read_cubin_debug(image, resolve_paths)
    except FormatError:
        raise
    except Exception as error:
        raise FormatError(image.path, "DWARF", f"corrupt debug information: {error!r}") from None


def _read_cubin_debug(image: ElfImage, resolve_paths: bool) -> dw.DebugInfo:
    elf = image.elf
    line_section = elf.get_section_by_name(".debug_line")
    if line_section is None:
        return dw.DebugInfo(dw.empty_line_map(), dw.empty_inlines(), False)
    strings = elf.get_section_by_name(".debug_str")
    strdata = strings.data() if strings is not None else b""
    programs = _parse_line_section(
        line_section.data(), _relocations(image, ".debug_line"), "", resolve_paths
    )
    rows = _line_rows(programs, strdata)
    line_map = _line_map(rows)
    return dw.DebugInfo(line_map, inline_table(image, programs, rows), bool(rows.starts))


@dataclass(slots=True)
class _LineRows:
    """The address ranges of every line-table row, each with its file, line and inline chain."""

    files: list[str] = field(default_factory=list)
    file_id: dict[str, int] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    fids: list[int] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    chains: list[tuple[dw.InlineNode, ...]] = field(default_factory=list)


def _line_rows(programs: list[_Program], strdata: bytes) -> _LineRows:
    """Every row of every sequence that covers addresses, with its chain of inlined calls."""
    out = _LineRows()
    files, file_id = out.files, out.file_id

    def name_at(offset: int) -> str:
        if offset <= 0 and not strdata:
            return ""
        endpos = strdata.find(b"\0", offset)
        raw = strdata[offset : endpos if endpos >= 0 else len(strdata)]
        return dw.demangle(raw.decode("utf-8", "replace"))

    for program in programs:
        local = []
        for name in program.files:
            if name not in file_id:
                file_id[name] = len(files)
                files.append(name)
            local.append(file_id[name])

        def fname(index: int, _local: list[int] = local) -> int:
            return _local[index - 1] if 0 < index <= len(_local) else -1

        for rows in program.sequences:
            cache: dict[int, tuple[dw.InlineNode, ...]] = {}

            def chain_of(
                row_number: int,
                _rows: list[_Row] = rows,
                _strings: int = program.strings,
                _cache: dict[int, tuple[dw.InlineNode, ...]] = cache,
                depth: int = 0,
            ) -> tuple[dw.InlineNode, ...]:
                # The chain of a row inlined at context c: chain(row c) + (call at row c).
                row = _rows[row_number - 1]
                if row.context <= 0 or row.context > len(_rows) or depth > 64:
                    return ()
                if row_number in _cache:
                    return _cache[row_number]
                site = _rows[row.context - 1]
                site_file = fname(site.file)
                node = dw.InlineNode(
                    files[site_file] if site_file >= 0 else "",
                    site.line,
                    name_at(_strings + row.function),
                )
                result = (*chain_of(row.context, _rows, _strings, _cache, depth + 1), node)
                _cache[row_number] = result
                return result

            for k in range(len(rows) - 1):
                row, nxt = rows[k], rows[k + 1]
                if nxt.address <= row.address:
                    continue
                f = fname(row.file)
                if f < 0:
                    continue
                out.starts.append(row.address)
                out.ends.append(nxt.address)
                out.fids.append(f)
                out.lines.append(row.line)
                out.chains.append(chain_of(k + 1))
    return out


def _line_map(rows: _LineRows) -> dw.LineMap:
    """The line map of the rows, sorted by start address."""
    starts, files = rows.starts, rows.files
    if not starts:
        return dw.LineMap(
            np.zeros(0, np.uint64),
            np.zeros(0, np.uint64),
            np.zeros(0, np.int32),
            np.zeros(0, np.int32),
            files,
        )
    order = np.argsort(np.array(starts, dtype=np.uint64), kind="stable")
    return dw.LineMap(
        np.array(starts, dtype=np.uint64)[order],
        np.array(rows.ends, dtype=np.uint64)[order],
        np.array(rows.fids, dtype=np.int32)[order],
        np.array(rows.lines, dtype=np.int32)[order],
        files,
    )


def inline_table(image: ElfImage, programs: list[_Program], rows: _LineRows) -> dw.InlineTable:
    """Inline table: from line-table contexts, else from DW_TAG_inlined_subroutine (-G builds)."""
    node_of: dict[tuple[dw.InlineNode, ...], int] = {}
    parents: list[int] = []
    calls: list[dw.InlineNode] = []
    lo: list[int] = []
    hi: list[int] = []
    nodes: list[int] = []
    depths: list[int] = []

    def node_for(prefix: tuple[dw.InlineNode, ...]) -> int:
        found = node_of.get(prefix)
        if found is not None:
            return found
        parent = node_for(prefix[:-1]) if len(prefix) > 1 else -1
        node_of[prefix] = len(calls)
        calls.append(prefix[-1])
        parents.append(parent)
        return node_of[prefix]

    for s, e, chain in zip(rows.starts, rows.ends, rows.chains, strict=True):
        for depth in range(1, len(chain) + 1):
            lo.append(s)
            hi.append(e)
            nodes.append(node_for(chain[:depth]))
            depths.append(depth)
    if not lo and image.elf.get_section_by_name(".debug_info") is not None:
        _inlines_from_info(
            image, programs, rows.files, rows.file_id, lo, hi, nodes, depths, parents, calls
        )
    return dw.inline_table(lo, hi, nodes, depths, parents, calls)


def _inlines_from_info(
    image: ElfImage,
    programs: list[_Program],
    files: list[str],
    file_id: dict[str, int],
    lo: list[int],
    hi: list[int],
    nodes: list[int],
    depths: list[int],
    parents: list[int],
    calls: list[dw.InlineNode],
) -> None:
    relocs = _relocations(image, ".debug_info")
    dwarf = image.elf.get_dwarf_info(relocate_dwarf_sections=False)
    by_offset = {p.offset: p for p in programs}

    def value(attr: Any) -> int:
        return relocs.get(int(attr.offset), int(attr.value))

    for cu in dwarf.iter_CUs():
        top = cu.get_top_DIE()
        stmt = top.attributes.get("DW_AT_stmt_list")
        program = by_offset.get(int(stmt.value)) if stmt is not None else None
        names = program.files if program is not None else []
        stack: list[tuple[Any, int, int]] = [(top, -1, 0)]
        while stack:
            die, parent, depth = stack.pop()
            for child in die.iter_children():
                if child.tag == "DW_TAG_inlined_subroutine":
                    attrs = child.attributes
                    index = int(attrs["DW_AT_call_file"].value) if "DW_AT_call_file" in attrs else 0
                    call_file = names[index - 1] if 0 < index <= len(names) else ""
                    call_line = (
                        int(attrs["DW_AT_call_line"].value) if "DW_AT_call_line" in attrs else 0
                    )
                    node = len(calls)
                    calls.append(dw.InlineNode(call_file, call_line, dw.callee_name(child)))
                    parents.append(parent)
                    if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
                        low = value(attrs["DW_AT_low_pc"])
                        high_attr = attrs["DW_AT_high_pc"]
                        high = value(high_attr)
                        if high_attr.form != "DW_FORM_addr":
                            high = low + int(high_attr.value)
                        if high > low:
                            lo.append(low)
                            hi.append(high)
                            nodes.append(node)
                            depths.append(depth + 1)
                    stack.append((child, node, depth + 1))
                elif (
                    child.tag in ("DW_TAG_subprogram", "DW_TAG_lexical_block")
                    and child.has_children
                ):
                    stack.append((child, parent, depth))


# --------------------------------------------------------------------------- skeleton


def cuda_proc_line(info: dw.DebugInfo, start: int, end: int, arch: int) -> tuple[str, int]:
    """getProcLineMap (CUDA): the lowest line among the first 32 instructions, same file."""
    step = 16 if arch >= 70 else 8
    best: tuple[str, int] | None = None
    vma = start
    while vma < end and vma < start + step * CUDA_PROC_SEARCH_LEN:
        hit = info.line_map.lookup(vma)
        if hit is not None and (best is None or (hit[0] == best[0] and hit[1] < best[1])):
            best = (hit[0], hit[1])
        vma += step
    if best is not None:
        return best
    while vma < end:
        hit = info.line_map.lookup(vma)
        if hit is not None:
            return hit[0], hit[1]
        vma += step
    return "", 0


def cubin_skeleton(image: ElfImage, info: dw.DebugInfo) -> list[Procedure]:
    unknown = f"[{image.basename}]"
    links = [f.link_name for f in image.functions]
    pretties = dw.demangle_many(links)
    procs = []
    for func, pretty in zip(image.functions, pretties, strict=True):
        file, line = cuda_proc_line(info, func.start, func.end, image.cuda_arch)
        procs.append(
            Procedure(
                func.start,
                func.end,
                func.link_name,
                pretty,
                file or unknown,
                line if file else 0,
                func.symbol_index,
            )
        )
    procs.sort(key=lambda p: p.start)
    return procs


def _proc_scope(proc: Procedure, root: TreeNode, symbol_index: bool, call_tags: bool) -> Scope:
    attrs = {"i": "0", "n": proc.pretty_name}
    if proc.link_name != proc.pretty_name:
        attrs["ln"] = proc.link_name
    if symbol_index and proc.symbol_index:
        attrs["s"] = str(proc.symbol_index)
    attrs["l"] = str(proc.line)
    attrs["v"] = format_ranges([(proc.start, proc.start + 1)])
    scope = Scope(PROCEDURE, attrs)
    scope.children.extend(tree_scopes(root, proc.file, proc.line, call_tags))
    return scope


def plain_scope(proc: Procedure, info: dw.DebugInfo) -> Scope:
    """doUnparsableFunction: 4-byte pieces placed by the line map, no loops."""
    root = TreeNode()
    addrs = np.arange(proc.start, proc.end, 4, dtype=np.uint64)
    fidx, lines = info.line_map.lookup_many(addrs)
    nodes = info.inlines.nodes_for(addrs, proc.start, proc.end)
    files = info.line_map.files
    for a, f, ln, node in zip(
        addrs.tolist(), fidx.tolist(), lines.tolist(), nodes.tolist(), strict=True
    ):
        size = min(4, proc.end - a)
        stmt = Stmt(a, size, files[f] if f >= 0 else "", ln if f >= 0 else 0)
        root.add_stmt(info.inlines.chain(node), stmt)
    return _proc_scope(proc, root, symbol_index=True, call_tags=False)


def gpucfg_scope(
    proc: Procedure,
    info: dw.DebugInfo,
    instructions: list[Instruction],
    analyzer: FunctionAnalyzer,
    device: str,
) -> Scope:
    """Loops and call sites of one device function, from nvdisasm's instructions."""
    mine = [i for i in instructions if proc.start <= i.address < proc.end]
    cfg = build_cfg(mine, proc.start, proc.start, proc.end)
    root = analyzer._tree(proc, cfg)
    call_sites = {
        b.last: b.call_target for b in cfg.blocks if b.is_call and b.call_target is not None
    }
    if call_sites:
        _mark_calls(root, call_sites)
    _set_device(root, device)
    return _proc_scope(proc, root, symbol_index=False, call_tags=True)


def _mark_calls(node: TreeNode, calls: dict[int, int]) -> None:
    for vma, stmt in node.stmts.items():
        if vma in calls:
            stmt.is_call = True
            stmt.target = calls[vma]
    for sub in node.nodes.values():
        _mark_calls(sub, calls)
    for loop in node.loops:
        _mark_calls(loop.node, calls)


def _set_device(node: TreeNode, device: str) -> None:
    for stmt in node.stmts.values():
        stmt.device = device
    for sub in node.nodes.values():
        _set_device(sub, device)
    for loop in node.loops:
        _set_device(loop.node, device)


def analyze_cubin(
    image: ElfImage,
    lm_name: str | None = None,
    gpucfg: bool = False,
    nvdisasm: str | None = None,
    progress: Callable[[int], None] | None = None,
    resolve_paths: bool = True,
    total: Callable[[int], None] | None = None,
    addresses: Iterable[int] | None = None,
) -> StructureFile:
    """The whole structure of a cubin, plain or with ``--gpucfg yes``.

    ``addresses`` (plain only): the procedures that hold none of them are listed by their
    symbol alone, as :mod:`.sampled` does for a large host binary. A framework's cubin holds
    thousands of kernels of which a run launches a few: PyTorch's 27 in one measurement took
    pyprof 100 s, every kernel's lines read (a cubin of 1 500 small kernels: 2.0 s whole, 0.5 s
    for three of them; benchmarks/cubin_lines.py)."""
    info = read_cubin_debug(image, resolve_paths)
    procs = cubin_skeleton(image, info)
    if total is not None:
        total(len(procs))
    name = lm_name or os.path.abspath(image.path)
    if not gpucfg:
        wanted = None if addresses is None else sorted(set(addresses))
        scopes = []
        for proc in procs:
            held = wanted is None or holds_any(proc, wanted)
            scopes.append(plain_scope(proc, info) if held else symbol_scope(proc))
            if progress is not None:
                progress(1)
        return assemble(name, procs, scopes, has_calls=False)
    if 50 <= image.cuda_arch < 70:
        every = maxwell_instructions(image)
    else:
        tool = nvdisasm or find_nvdisasm()
        if tool is None:
            raise NvdisasmMissing(
                f"{image.path}: --gpucfg yes needs NVIDIA's nvdisasm: "
                "pip install nvidia-cuda-nvdisasm, or put nvdisasm on PATH"
            )
        by_section = nvdisasm_instructions(image, tool)
        every = [i for items in by_section.values() for i in items]
    every.sort(key=lambda i: i.address)
    analyzer = _CubinAnalyzer(image, info, procs)
    device = f"NVIDIA sm_{image.cuda_arch}"
    scopes = []
    for proc in procs:
        scopes.append(gpucfg_scope(proc, info, every, analyzer, device))
        if progress is not None:
            progress(1)
    return assemble(name, procs, scopes, has_calls=True)


class _CubinAnalyzer(FunctionAnalyzer):
    """FunctionAnalyzer without a capstone decoder (device code comes from nvdisasm)."""

    def __init__(self, image: ElfImage, info: dw.DebugInfo, procs: list[Procedure]) -> None:
        self.decoded = {}
        self.jump_tables = None
        self.image = image
        self.info = info
        self.procs = procs
        self.options = HostStructOptions(call_tags=True)
        self.entries = {p.start for p in procs}
        self.noreturn = set()

"""DWARF line maps and inline trees of one ELF image, as flat numpy tables.

The line map answers "which file and line is this address" the way Dyninst's
``Module::getSourceLines`` does for hpcstruct: each line-table row covers
``[row.address, next_row.address)``; a row of zero length (another row at the same address
follows) is dropped, and the end-of-sequence row closes the last range. The inline table answers
"which chain of inlined calls holds this address" from ``DW_TAG_inlined_subroutine`` entries
(outermost call first), as ``Inline::analyzeAddr`` does.

Corrupt DWARF raises :class:`~pyhpctk.errors.FormatError`; it never escapes as a pyelftools
exception.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from pyhpctk.errors import FormatError
from pyhpctk.structure.elfimage import ElfImage


@dataclass(frozen=True, slots=True)
class InlineNode:
    """One inlined call: the call site (file, line) and the callee's pretty name."""

    file: str
    line: int
    name: str


@dataclass(slots=True)
class LineMap:
    """Address ranges ``[start, end)`` -> (file index, line), sorted by start."""

    starts: np.ndarray
    ends: np.ndarray
    file_index: np.ndarray
    lines: np.ndarray
    files: list[str]

    def lookup(self, address: int) -> tuple[str, int, int] | None:
        """(file, line, range end) of the row covering ``address``, or None."""
        if len(self.starts) == 0:
            return None
        i = int(np.searchsorted(self.starts, address, side="right")) - 1
        if i < 0 or address >= int(self.ends[i]):
            return None
        return self.files[int(self.file_index[i])], int(self.lines[i]), int(self.ends[i])

    def lookup_many(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised lookup: (file index or -1, line) for each address."""
        if len(self.starts) == 0:
            n = len(addresses)
            return np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
        i = np.searchsorted(self.starts, addresses, side="right") - 1
        valid = i >= 0
        ic = np.where(valid, i, 0)
        valid &= addresses < self.ends[ic]
        fidx = np.where(valid, self.file_index[ic], -1).astype(np.int64)
        line = np.where(valid, self.lines[ic], 0).astype(np.int64)
        return fidx, line


@dataclass(slots=True)
class InlineTable:
    """Inlined-subroutine ranges, deepest last, with parent links to rebuild call chains."""

    lo: np.ndarray
    hi: np.ndarray
    node: np.ndarray
    depth: np.ndarray
    parents: list[int]
    calls: list[InlineNode]
    _chains: dict[int, tuple[InlineNode, ...]] = field(default_factory=dict)

    def chain(self, node: int) -> tuple[InlineNode, ...]:
        """The inline sequence of ``node``: outermost call first."""
        if node < 0:
            return ()
        cached = self._chains.get(node)
        if cached is not None:
            return cached
        seq: list[InlineNode] = []
        current = node
        while current >= 0:
            seq.append(self.calls[current])
            current = self.parents[current]
        result = tuple(reversed(seq))
        self._chains[node] = result
        return result

    def nodes_for(self, addresses: np.ndarray, start: int, end: int) -> np.ndarray:
        """Innermost inline node (or -1) for each sorted address in ``[start, end)``."""
        result = np.full(len(addresses), -1, dtype=np.int64)
        if len(self.lo) == 0 or len(addresses) == 0:
            return result
        mask = (self.lo < end) & (self.hi > start)
        if not mask.any():
            return result
        # Ranges are stored by increasing depth, so deeper ranges overwrite their callers.
        for lo, hi, node in zip(
            self.lo[mask].tolist(), self.hi[mask].tolist(), self.node[mask].tolist(), strict=True
        ):
            i0 = int(np.searchsorted(addresses, lo, side="left"))
            i1 = int(np.searchsorted(addresses, hi, side="left"))
            if i1 > i0:
                result[i0:i1] = node
        return result


@dataclass(slots=True)
class DebugInfo:
    """Everything pystruct reads from DWARF."""

    line_map: LineMap
    inlines: InlineTable
    has_lines: bool


def empty_line_map() -> LineMap:
    return LineMap(
        np.zeros(0, np.uint64),
        np.zeros(0, np.uint64),
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        [],
    )


def empty_inlines() -> InlineTable:
    return InlineTable(
        np.zeros(0, np.uint64),
        np.zeros(0, np.uint64),
        np.zeros(0, np.int64),
        np.zeros(0, np.int32),
        [],
        [],
    )


def inline_table(
    lo: list[int],
    hi: list[int],
    nodes: list[int],
    depths: list[int],
    parents: list[int],
    calls: list[InlineNode],
) -> InlineTable:
    """The inlined ranges found, outermost first (stable among equal depths); empty if none."""
    if not lo:
        return empty_inlines()
    order = np.argsort(np.array(depths, dtype=np.int32), kind="stable")
    return InlineTable(
        np.array(lo, dtype=np.uint64)[order],
        np.array(hi, dtype=np.uint64)[order],
        np.array(nodes, dtype=np.int64)[order],
        np.array(depths, dtype=np.int32)[order],
        parents,
        calls,
    )


def _decode(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _file_names(lineprog: Any, comp_dir: str, resolve: bool = True) -> list[str]:
    """Full path of each file entry of a line program (0-based list for DWARF 5, 1-based-1 else)."""
    header = lineprog.header
    version = int(header["version"])
    dirs = [_decode(d) for d in header["include_directory"]]
    names: list[str] = []
    for entry in header["file_entry"]:
        name = _decode(entry.name)
        dir_index = int(entry.dir_index)
        if version >= 5:
            directory = dirs[dir_index] if dir_index < len(dirs) else ""
        else:
            directory = (
                comp_dir
                if dir_index == 0
                else (dirs[dir_index - 1] if dir_index - 1 < len(dirs) else "")
            )
        if directory and not os.path.isabs(directory) and comp_dir:
            directory = os.path.join(comp_dir, directory)
        names.append(
            real_path(
                resolve,
                name if os.path.isabs(name) or not directory else os.path.join(directory, name),
            )
        )
    return names


@lru_cache(maxsize=4096)
def real_path(resolve: bool, path: str) -> str:
    """hpcstruct's RealPathMgr: canonical path when the file exists on this machine, else as is."""
    try:
        if resolve and path and os.path.exists(path):
            return os.path.realpath(path)
    except (OSError, ValueError):
        pass
    return path


def _file_at(names: list[str], version: int, index: int) -> str:
    """The file name for a file register / DW_AT_call_file value."""
    position = index if version >= 5 else index - 1
    if 0 <= position < len(names):
        return names[position]
    return ""


def read_debug_info(image: ElfImage, resolve_paths: bool = True) -> DebugInfo:
    """Read line maps and inline trees; FormatError on corrupt DWARF.

    ``resolve_paths``: canonicalise source paths of files that exist here (as hpcstruct does).
    """
    elf = image.elf
    if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_line") is None:
        return DebugInfo(empty_line_map(), empty_inlines(), False)
    try:
        return _read(image, resolve_paths)
    except FormatError:
        raise
    except Exception as error:  # pyelftools raises many exception types on corrupt data
        raise FormatError(image.path, "DWARF", f"corrupt debug information: {error!r}") from None


def _read(image: ElfImage, resolve_paths: bool) -> DebugInfo:
    elf = image.elf
    dwarf = elf.get_dwarf_info(relocate_dwarf_sections=not image.is_cuda)
    starts: list[int] = []
    ends: list[int] = []
    file_ids: list[int] = []
    lines: list[int] = []
    files: list[str] = []
    file_id: dict[str, int] = {}

    inl_lo: list[int] = []
    inl_hi: list[int] = []
    inl_node: list[int] = []
    inl_depth: list[int] = []
    parents: list[int] = []
    calls: list[InlineNode] = []

    for cu in dwarf.iter_CUs():
        top = cu.get_top_DIE()
        comp_dir = (
            _decode(top.attributes["DW_AT_comp_dir"].value)
            if ("DW_AT_comp_dir" in top.attributes)
            else ""
        )
        lineprog = dwarf.line_program_for_CU(cu)
        if lineprog is None:
            continue
        version = int(lineprog.header["version"])
        names = _file_names(lineprog, comp_dir, resolve_paths)
        local_ids = []
        for name in names:
            if name not in file_id:
                file_id[name] = len(files)
                files.append(name)
            local_ids.append(file_id[name])

        def fid(index: int, _version: int = version, _ids: list[int] = local_ids) -> int:
            position = index if _version >= 5 else index - 1
            return _ids[position] if 0 <= position < len(_ids) else -1

        pending: tuple[int, int, int] | None = None  # (address, file id, line)
        for entry in lineprog.get_entries():
            state = entry.state
            if state is None:
                continue
            address = int(state.address)
            if pending is not None and address > pending[0]:
                starts.append(pending[0])
                ends.append(address)
                file_ids.append(pending[1])
                lines.append(pending[2])
            if state.end_sequence:
                pending = None
            else:
                pending = (address, fid(int(state.file)), int(state.line))

        _collect_inlines(
            dwarf, cu, top, names, version, inl_lo, inl_hi, inl_node, inl_depth, parents, calls
        )

    if starts:
        order = np.argsort(np.array(starts, dtype=np.uint64), kind="stable")
        s = np.array(starts, dtype=np.uint64)[order]
        e = np.array(ends, dtype=np.uint64)[order]
        f = np.array(file_ids, dtype=np.int32)[order]
        ln = np.array(lines, dtype=np.int32)[order]
        keep = f >= 0
        line_map = LineMap(s[keep], e[keep], f[keep], ln[keep], files)
    else:
        line_map = empty_line_map()
    inlines = inline_table(inl_lo, inl_hi, inl_node, inl_depth, parents, calls)
    return DebugInfo(line_map, inlines, bool(len(line_map.starts)))


def _die_ranges(dwarf: Any, cu: Any, die: Any) -> list[tuple[int, int]]:
    attrs = die.attributes
    if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
        low = int(attrs["DW_AT_low_pc"].value)
        high_attr = attrs["DW_AT_high_pc"]
        high = int(high_attr.value)
        if high_attr.form != "DW_FORM_addr":
            high = low + high
        return [(low, high)] if high > low else []
    if "DW_AT_ranges" in attrs:
        top = cu.get_top_DIE()
        base = int(top.attributes["DW_AT_low_pc"].value) if "DW_AT_low_pc" in top.attributes else 0
        rangelists = dwarf.range_lists()
        if rangelists is None:
            return []
        # pyelftools already turns DW_FORM_rnglistx indices into section offsets.
        entries = rangelists.get_range_list_at_offset(attrs["DW_AT_ranges"].value, cu=cu)
        result: list[tuple[int, int]] = []
        for entry in entries:
            if hasattr(entry, "begin_offset"):
                lo, hi = int(entry.begin_offset), int(entry.end_offset)
                if not getattr(entry, "is_absolute", False):
                    lo += base
                    hi += base
                if hi > lo:
                    result.append((lo, hi))
            elif hasattr(entry, "base_address"):
                base = int(entry.base_address)
        return result
    if "DW_AT_low_pc" in attrs:
        return []
    return []


_ORIGIN_KEYS = ("DW_AT_abstract_origin", "DW_AT_specification")


def _integrated(die: Any, key: str) -> Any:
    """``dwarf_attr_integrate``: ``key`` on ``die`` or along its origin/specification chain."""
    current = die
    for _ in range(8):
        if current is None:
            return None
        if key in current.attributes:
            return current.attributes[key]
        current = _origin(current)
    return None


def _origin(die: Any) -> Any:
    for key in _ORIGIN_KEYS:
        if key in die.attributes:
            return die.get_DIE_from_attribute(key)
    return None


def callee_name(die: Any) -> str:
    """The name hpcstruct gives an inlined function (Dyninst 13's ``findFuncName``).

    Dyninst names the function once per DIE of the chain inlined call -> abstract origin ->
    specification, and the last name wins: a ``DW_AT_linkage_name`` found along the chain
    (demangled later), else the DIE's ``DW_AT_name``. ``DW_AT_MIPS_linkage_name`` is not read
    (Dyninst dropped it in 2022), so where it is the only linkage name (NVCC's ``-G`` cubins:
    ``b_mix`` next to ``_Z5b_mixi``) the plain ``DW_AT_name`` is what hpcstruct prints.
    """
    name = ""
    current = die
    for _ in range(8):
        if current is None:
            break
        linkage = _integrated(current, "DW_AT_linkage_name")
        if linkage is not None:
            found = _decode(linkage.value)
        elif "DW_AT_inline" in current.attributes:
            own = current.attributes.get("DW_AT_name")
            found = _decode(own.value) if own is not None else ""
        else:
            plain = _integrated(current, "DW_AT_name")
            found = _decode(plain.value) if plain is not None else ""
        if found:
            name = found
        current = _origin(current)
    return demangle(name) if name else ""


_SCOPE_TAGS = frozenset(
    {
        "DW_TAG_subprogram",
        "DW_TAG_lexical_block",
        "DW_TAG_namespace",
        "DW_TAG_class_type",
        "DW_TAG_structure_type",
    }
)


def _collect_inlines(
    dwarf: Any,
    cu: Any,
    top: Any,
    names: list[str],
    version: int,
    inl_lo: list[int],
    inl_hi: list[int],
    inl_node: list[int],
    inl_depth: list[int],
    parents: list[int],
    calls: list[InlineNode],
) -> None:
    stack: list[tuple[Any, int, int]] = [(top, -1, 0)]
    while stack:
        die, parent, depth = stack.pop()
        for child in die.iter_children():
            tag = child.tag
            if tag == "DW_TAG_inlined_subroutine":
                attrs = child.attributes
                call_file = (
                    _file_at(names, version, int(attrs["DW_AT_call_file"].value))
                    if "DW_AT_call_file" in attrs
                    else ""
                )
                call_line = int(attrs["DW_AT_call_line"].value) if "DW_AT_call_line" in attrs else 0
                node = len(calls)
                calls.append(InlineNode(call_file, call_line, callee_name(child)))
                parents.append(parent)
                for lo, hi in _die_ranges(dwarf, cu, child):
                    inl_lo.append(lo)
                    inl_hi.append(hi)
                    inl_node.append(node)
                    inl_depth.append(depth + 1)
                stack.append((child, node, depth + 1))
            elif tag in _SCOPE_TAGS and child.has_children:
                stack.append((child, parent, depth))


# --------------------------------------------------------------------------- demangling

_CXXFILT = shutil.which("c++filt")


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """Demangle an Itanium C++ name as hpcstruct prints it; other names pass through."""
    if not name.startswith("_Z") or _CXXFILT is None:
        return name
    return demangle_many([name])[0]


def demangle_many(names: Iterable[str]) -> list[str]:
    """Demangle many names with ``c++filt`` (names not mangled pass through).

    hpcstruct demangles with libiberty's ``DMGL_PARAMS | DMGL_ANSI | DMGL_VERBOSE |
    DMGL_RET_DROP`` (``hpctoolkit_demangle``): c++filt's flags less the return type that a
    template function's name encodes. c++filt has no option for that, so its ``--no-params``
    output (the bare name) locates where the name starts: ``Pair<int> b_split<int>(int)`` is
    printed ``b_split<int>(int)``.
    """
    items = list(names)
    todo = [n for n in items if n.startswith("_Z") and "\n" not in n]
    if not todo or _CXXFILT is None:
        return items
    full = _cxxfilt(todo, [])
    bare = _cxxfilt(todo, ["--no-params"])
    if full is None:
        return items
    mapping = {}
    for i, mangled in enumerate(todo):
        pretty = full[i] if i < len(full) and full[i] else mangled
        if bare is not None and i < len(bare):
            pretty = _drop_return_type(pretty, bare[i])
        mapping[mangled] = pretty
    return [mapping.get(n, n) for n in items]


def _cxxfilt(names: list[str], options: list[str]) -> list[str] | None:
    assert _CXXFILT is not None
    try:
        result = subprocess.run(
            [_CXXFILT, *options],
            input="\n".join(names) + "\n",
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.split("\n")


def _drop_return_type(full: str, bare: str) -> str:
    """``RET NAME(PARAMS)`` -> ``NAME(PARAMS)`` given NAME (DMGL_RET_DROP)."""
    if not bare or full.startswith(bare):
        return full
    at = full.find(" " + bare + "(")
    return full[at + 1 :] if at >= 0 else full

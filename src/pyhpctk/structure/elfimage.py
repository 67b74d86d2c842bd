"""Open an ELF load module for structure recovery: header checks, code regions, function symbols.

This module turns a host ELF (x86-64, AArch64) or a CUDA cubin into an :class:`ElfImage`: the
code regions, the function symbols (with hpcstruct's naming rules) and the raw bytes, so the
analyses never touch pyelftools directly. Everything a user can get wrong (not an ELF, a truncated
file, an unknown machine) is raised as :class:`~pyhpctk.errors.FormatError`; it must never let a
pyelftools or struct exception escape.

CUDA cubins keep every function in its own ``.text.<name>`` section at address 0; like
hpcstruct (``RelocateCubin.cpp``) we place each section at its file offset so that every function
gets a distinct address (formats.md §4.4: the ``P v=`` of cubin functions are file offsets).
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from pyhpctk.errors import FormatError
from pyhpctk.structure.debug_symbols import read_separate_symtab

EM_X86_64 = 62
EM_AARCH64 = 183
EM_CUDA = 190
SUPPORTED_MACHINES = {EM_X86_64: "x86-64", EM_AARCH64: "AArch64", EM_CUDA: "CUDA"}

ET_EXEC = 2
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
SHT_NOBITS = 8

# ELF identification: formats are ELF64/ELF32 little or big endian; "\x7fELF" magic.
ELF_MAGIC = b"\x7fELF"

# x86-64 PLT entries are 16 bytes; the first one (PLT0) is the resolver trampoline.
PLT_ENTRY_SIZE = {EM_X86_64: 16, EM_AARCH64: 16}
PLT0_SIZE = {EM_X86_64: 16, EM_AARCH64: 32}
# Dyninst treats parsed functions without a symbol of at most 32 bytes as PLT stubs (Struct.cpp).
PLT_STUB_MAX = 32


@dataclass(frozen=True, slots=True)
class CodeRegion:
    """One executable section: its name, address range and bytes."""

    name: str
    start: int
    end: int
    data: bytes = field(repr=False)
    index: int = 0


@dataclass(frozen=True, slots=True)
class FunctionSymbol:
    """A function as hpcstruct's skeleton sees it (entry, end, names, symbol-table index)."""

    start: int
    end: int
    link_name: str
    symbol_index: int
    from_symbol: bool = True
    sized: bool = True  # its symbol has a size (else it was taken to reach the next function)


@dataclass(slots=True)
class ElfImage:
    """An opened ELF file: machine, code regions, functions, and section relocation (cubins)."""

    path: str
    machine: int
    is_shared: bool
    regions: list[CodeRegion]
    functions: list[FunctionSymbol]
    elf: Any = field(repr=False)
    section_base: dict[int, int] = field(default_factory=dict)
    plt_names: dict[int, str] = field(default_factory=dict)
    cuda_arch: int = 0
    raw: bytes = field(default=b"", repr=False)
    loaded: list[tuple[int, int, int]] = field(default_factory=list, repr=False)

    @property
    def basename(self) -> str:
        return os.path.basename(self.path)

    @property
    def is_cuda(self) -> bool:
        return self.machine == EM_CUDA

    def region_of(self, address: int) -> CodeRegion | None:
        """The code region containing ``address``, if any."""
        for region in self.regions:
            if region.start <= address < region.end:
                return region
        return None

    def read_data(self, address: int, size: int) -> bytes:
        """``size`` bytes at ``address`` from any loaded section (jump tables live in .rodata)."""
        for start, end, offset in self.loaded:
            if start <= address and address + size <= end:
                return self.raw[offset + address - start : offset + address - start + size]
        return b""

    def read(self, start: int, end: int) -> bytes:
        """The bytes of the code in ``[start, end)`` (clipped to its region)."""
        region = self.region_of(start)
        if region is None:
            return b""
        hi = min(end, region.end)
        return region.data[start - region.start : hi - region.start]


def sniff(head: bytes) -> bool:
    """Is this an ELF file (from its first bytes)?"""
    return head[:4] == ELF_MAGIC


def _check_header(data: bytes, path: str) -> int:
    """Validate the ELF identification and header bounds before pyelftools sees the file.

    Returns the machine (``e_machine``), already checked to be one pystruct supports.
    """
    if len(data) < 4 or data[:4] != ELF_MAGIC:
        raise FormatError(path, "ELF header", "not an ELF file (bad magic)")
    if len(data) < 16:
        raise FormatError(path, "ELF header", "truncated identification")
    ei_class, ei_data = data[4], data[5]
    if ei_class not in (1, 2) or ei_data not in (1, 2):
        raise FormatError(path, "ELF header", f"bad class/encoding {ei_class}/{ei_data}")
    header_size = 64 if ei_class == 2 else 52
    if len(data) < header_size:
        raise FormatError(path, "ELF header", f"truncated: {len(data)} of {header_size} bytes")
    endian = "<" if ei_data == 1 else ">"
    machine = struct.unpack_from(endian + "H", data, 18)[0]
    if machine not in SUPPORTED_MACHINES:
        raise FormatError(path, "ELF header", f"unsupported architecture (e_machine {machine})")
    if ei_class == 2:
        shoff = struct.unpack_from(endian + "Q", data, 0x28)[0]
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x3A)
    else:
        shoff = struct.unpack_from(endian + "I", data, 0x20)[0]
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x2E)
    if shoff + shentsize * shnum > len(data):
        raise FormatError(
            path,
            "section headers",
            f"truncated: table ends at {shoff + shentsize * shnum:#x}, file has {len(data):#x}",
        )
    return int(machine)


def open_image(source: str | os.PathLike[str] | bytes, name: str | None = None) -> ElfImage:
    """Open an ELF load module from a path or its bytes; bad input raises FormatError."""
    if isinstance(source, bytes):
        data = source
        path = name or "<buffer>"
    else:
        path = os.fspath(source)
        try:
            with open(path, "rb") as stream:
                data = stream.read()
        except FileNotFoundError:
            raise FormatError(path, "file", "no such file") from None
        except IsADirectoryError:
            raise FormatError(path, "file", "is a directory") from None
        except OSError as error:
            raise FormatError(path, "file", error.strerror or str(error)) from None
    machine = _check_header(data, path)
    try:
        return _load(data, path, machine)
    except FormatError:
        raise
    except (ELFError, struct.error, ValueError, IndexError, KeyError, UnicodeDecodeError) as error:
        raise FormatError(path, "ELF sections", f"corrupt ELF: {error}") from None
    except Exception as error:  # pyelftools raises assorted errors on garbage
        raise FormatError(path, "ELF sections", f"corrupt ELF: {error!r}") from None


def _load(data: bytes, path: str, machine: int) -> ElfImage:
    stream: BinaryIO = io.BytesIO(data)
    elf = ELFFile(stream)
    is_cuda = machine == EM_CUDA
    e_type = str(elf.header["e_type"])
    is_shared = e_type != "ET_EXEC"

    section_base: dict[int, int] = {}
    regions: list[CodeRegion] = []
    for index, section in enumerate(elf.iter_sections()):
        flags = int(section["sh_flags"])
        if not flags & SHF_EXECINSTR or section["sh_type"] == "SHT_NOBITS":
            continue
        size = int(section["sh_size"])
        offset = int(section["sh_offset"])
        if offset + size > len(data):
            raise FormatError(path, f"section {section.name}", "truncated section data")
        base = offset if is_cuda else int(section["sh_addr"])
        section_base[index] = base
        regions.append(
            CodeRegion(section.name, base, base + size, data[offset : offset + size], index)
        )
    regions.sort(key=lambda r: r.start)
    loaded = []
    if not is_cuda:
        for section in elf.iter_sections():
            if int(section["sh_flags"]) & SHF_ALLOC and section["sh_type"] != "SHT_NOBITS":
                start, size = int(section["sh_addr"]), int(section["sh_size"])
                if int(section["sh_offset"]) + size <= len(data):
                    loaded.append((start, start + size, int(section["sh_offset"])))

    functions = _function_symbols(elf, regions, section_base, is_cuda)
    plt_names = _plt_names(elf, machine, regions) if not is_cuda else {}
    cuda_arch = 0
    if is_cuda:
        # e_flags holds the SM version: in its low byte (e.g. 75 for sm_75) up to ELF ABI
        # version 7; from ABI version 8 (CUDA 12.8+ cubins, e.g. 0x09005a04 for sm_90) in bits
        # 8-15, the low byte then holding other flags.
        flags = int(elf.header["e_flags"])
        abi_version = int(elf.header["e_ident"]["EI_ABIVERSION"])
        cuda_arch = (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF
        if cuda_arch == 0 or cuda_arch > 200:
            cuda_arch = (flags >> 16) & 0xFF
    return ElfImage(
        path=path,
        machine=machine,
        is_shared=is_shared,
        regions=regions,
        functions=functions,
        elf=elf,
        section_base=section_base,
        plt_names=plt_names,
        cuda_arch=cuda_arch,
        raw=data,
        loaded=loaded,
    )


STT_FUNC = 2
SHN_LORESERVE = 0xFF00  # section indices from here on are special (SHN_ABS, SHN_XINDEX, ...)


def _symbol_table(elf: Any, section: Any) -> tuple[np.ndarray, bytes] | None:
    """A symbol table's entries as one numpy record array, and its string table's bytes.

    pyelftools parses each symbol through ``construct``, about 0.1 ms apiece: 2 s for the
    20,000 symbols of OpenBLAS, most of pystruct's time on a sampled library (issue #36,
    item 8). Reading the table at once gives the same fields.
    """
    end = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:
        fields = [("name", "u4"), ("info", "u1"), ("other", "u1"), ("shndx", "u2")]
        fields += [("value", "u8"), ("size", "u8")]
    else:
        fields = [("name", "u4"), ("value", "u4"), ("size", "u4")]
        fields += [("info", "u1"), ("other", "u1"), ("shndx", "u2")]
    dtype = np.dtype([(name, end + kind) for name, kind in fields])
    if int(section["sh_entsize"]) not in (0, dtype.itemsize):
        return None
    data = section.data()
    rows = np.frombuffer(data, dtype, count=len(data) // dtype.itemsize)
    strings = elf.get_section(int(section["sh_link"])) if section["sh_link"] else None
    return rows, strings.data() if strings is not None else b""


def _symbol_name(strings: bytes, offset: int) -> str:
    """The NUL-terminated name at ``offset`` of a string table ('' outside it), as pyelftools
    decodes it (UTF-8, undecodable bytes replaced)."""
    if offset >= len(strings):
        return ""
    end = strings.find(b"\0", offset)
    return strings[offset : end if end >= 0 else len(strings)].decode("utf-8", errors="replace")


def _function_symbols(
    elf: Any, regions: list[CodeRegion], section_base: dict[int, int], is_cuda: bool
) -> list[FunctionSymbol]:
    """Function symbols in code regions, aliases merged; zero sizes run to the next function.

    A host binary without ``.symtab`` (stripped) is named by the ``.symtab`` of its separate
    debug file or MiniDebugInfo (:mod:`.debug_symbols`) with its own ``.dynsym``.
    """
    tables: list[tuple[np.ndarray, bytes, bool]] = []  # rows, strings, placed by address
    symtab = elf.get_section_by_name(".symtab")
    separate = None
    if not isinstance(symtab, SymbolTableSection):
        if not is_cuda:
            separate = read_separate_symtab(
                elf, lambda other: _symbol_table(other, other.get_section_by_name(".symtab"))
            )
        symtab = elf.get_section_by_name(".dynsym")
    if isinstance(symtab, SymbolTableSection):
        table = _symbol_table(elf, symtab)
        if table is not None:
            tables.append((*table, False))
    if separate is not None:  # after .dynsym: an exported name wins over internal aliases
        tables.append((*separate, True))
    by_start: dict[int, tuple[int, str, int]] = {}  # start -> (size, name, index)
    for rows, strings, by_address in tables:
        _merge_functions(by_start, rows, strings, by_address, regions, section_base, is_cuda)
    starts = sorted(by_start)
    result: list[FunctionSymbol] = []
    for position, start in enumerate(starts):
        size, name, index = by_start[start]
        region = next((r for r in regions if r.start <= start < r.end), None)
        if region is None:
            continue
        end = start + size
        following = starts[position + 1] if position + 1 < len(starts) else region.end
        if size == 0:
            end = min(following, region.end)
        elif start < following < end:
            # Overlapping symbols (cubin kernels enclosing their device functions): a function
            # ends where the next one begins, as Dyninst's symtab sizes them.
            end = following
        # symtab lets some funcs (_init) spill into the next region: clip (Struct.cpp).
        end = min(end, region.end) if start < region.end < end else end
        if end <= start:
            end = start + 1
        result.append(FunctionSymbol(start, end, name, index, sized=size > 0))
    return result


def _merge_functions(
    by_start: dict[int, tuple[int, str, int]],
    rows: np.ndarray,
    strings: bytes,
    by_address: bool,
    regions: list[CodeRegion],
    section_base: dict[int, int],
    is_cuda: bool,
) -> None:
    """Add a symbol table's function symbols to ``by_start`` (start -> size, name, index).

    ``by_address``: a table of another file (a debug file), whose section numbers need not be
    the binary's: its symbols are kept by where their address falls, in a code region, and
    name only functions the binary's own ``.dynsym`` does not."""
    shndx = rows["shndx"].astype(np.int64)
    wanted = (rows["info"] & 0xF == STT_FUNC) & (shndx < SHN_LORESERVE)
    if by_address:
        inside = np.zeros(len(rows), dtype=bool)
        for region in regions:
            inside |= (rows["value"] >= region.start) & (rows["value"] < region.end)
        wanted &= inside & (shndx != 0)
    else:
        wanted &= np.isin(shndx, np.array(sorted(section_base), dtype=np.int64))
    chosen = np.flatnonzero(wanted)
    for index, section, value, size, offset in zip(
        chosen.tolist(),
        shndx[chosen].tolist(),
        rows["value"][chosen].tolist(),
        rows["size"][chosen].tolist(),
        rows["name"][chosen].tolist(),
        strict=True,
    ):
        start = section_base[section] + value if is_cuda else value
        name = _symbol_name(strings, offset)
        if by_address:  # a debug file's versioned definitions: pthread_cond_wait@@GLIBC_2.3.2,
            # and glibc's internal aliases of its own functions: __GI___futex_abstimed_wait64
            name = name.split("@", 1)[0].removeprefix("__GI_")
        if not name:
            continue
        old = by_start.get(start)
        if by_address and old is not None:
            continue  # exported (``clock_gettime``), not libc's ``__GI___clock_gettime``
        # getFuncNames (Struct.cpp): prefer the longer name, then the alphabetically lower.
        if old is None:
            by_start[start] = (size, name, index)
        else:
            old_size, old_name, old_index = old
            better = len(name) > len(old_name) or (len(name) == len(old_name) and name < old_name)
            by_start[start] = (
                max(size, old_size),
                name if better else old_name,
                min(index, old_index),
            )


def _plt_names(elf: Any, machine: int, regions: list[CodeRegion]) -> dict[int, str]:
    """Entry address of each ``.plt`` stub -> the name of the symbol its GOT slot resolves."""
    plt = next((r for r in regions if r.name == ".plt"), None)
    if plt is None:
        return {}
    rela = elf.get_section_by_name(".rela.plt") or elf.get_section_by_name(".rel.plt")
    if not isinstance(rela, RelocationSection):
        return {}
    symtab = elf.get_section(rela["sh_link"]) if rela["sh_link"] else None
    table = _symbol_table(elf, symtab) if isinstance(symtab, SymbolTableSection) else None
    names: list[str] = []
    for reloc in rela.iter_relocations():
        symbol_index = int(reloc["r_info_sym"])
        name = ""
        if table is not None and 0 < symbol_index < len(table[0]):
            name = _symbol_name(table[1], int(table[0]["name"][symbol_index]))
        names.append(name)
    entry = PLT_ENTRY_SIZE.get(machine, 16)
    first = plt.start + PLT0_SIZE.get(machine, 16)
    result: dict[int, str] = {}
    for position, name in enumerate(names):
        address = first + position * entry
        if address + entry > plt.end:
            break
        if name:
            result[address] = name
    return result


# .eh_frame_hdr (LSB, "Exception Frame Header"): version, the encodings of eh_frame_ptr,
# fde_count and the table, then a binary search table of (initial location, FDE address)
# pairs. Only the encodings every x86-64 and AArch64 toolchain writes are read:
# eh_frame_ptr 4 or 8 bytes (any application), fde_count udata4, the table datarel|sdata4.
_EH_PTR_SIZES = {0x03: 4, 0x0B: 4, 0x1B: 4, 0x04: 8, 0x0C: 8, 0x1C: 8}
_EH_UDATA4 = 0x03
_EH_DATAREL_SDATA4 = 0x3B


def unwind_entries(image: ElfImage) -> np.ndarray:
    """The entry address of every function the unwind table (``.eh_frame_hdr``) describes,
    sorted: a stripped library keeps it (unwinding and exceptions need it), so it tells where
    functions begin that no symbol names. Empty when there is none or it is encoded otherwise.
    """
    section = image.elf.get_section_by_name(".eh_frame_hdr")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return np.zeros(0, dtype=np.int64)
    data = section.data()
    if len(data) < 4 or data[0] != 1 or data[2] != _EH_UDATA4 or data[3] != _EH_DATAREL_SDATA4:
        return np.zeros(0, dtype=np.int64)
    ptr = _EH_PTR_SIZES.get(data[1])
    if ptr is None or len(data) < 4 + ptr + 4:
        return np.zeros(0, dtype=np.int64)
    end = "<" if image.elf.little_endian else ">"
    count = int(np.frombuffer(data, end + "u4", count=1, offset=4 + ptr)[0])
    first = 8 + ptr
    count = min(count, (len(data) - first) // 8)
    table = np.frombuffer(data, end + "i4", count=2 * count, offset=first)
    starts = table[0::2].astype(np.int64) + int(section["sh_addr"])
    return np.unique(starts)


# DW_EH_PE pointer formats (the low four bits of an encoding): their sizes in bytes; absptr
# (0) is the address size. LEB128 formats are not used for FDE addresses by any toolchain.
_EH_FORMAT_SIZES = {0x02: 2, 0x03: 4, 0x04: 8, 0x0A: 2, 0x0B: 4, 0x0C: 8}


def unwind_ranges(image: ElfImage) -> np.ndarray:
    """``[start, end)`` of every function the unwind table describes, as ``(n, 2)`` rows
    sorted by start: each FDE's initial location and address range (``.eh_frame_hdr`` finds
    the FDEs, ``.eh_frame`` holds their ranges). A stripped library keeps them, so they bound
    the functions no symbol names, and those whose symbol has no size. FDEs in an encoding
    this reader does not know are left out."""
    empty = np.zeros((0, 2), dtype=np.int64)
    starts = unwind_entries(image)
    frame = image.elf.get_section_by_name(".eh_frame")
    hdr = image.elf.get_section_by_name(".eh_frame_hdr")
    if len(starts) == 0 or frame is None or hdr is None or frame["sh_type"] == "SHT_NOBITS":
        return empty
    data, base = frame.data(), int(frame["sh_addr"])
    end = "<" if image.elf.little_endian else ">"
    hdr_data = hdr.data()
    ptr = _EH_PTR_SIZES[hdr_data[1]]
    count = int(np.frombuffer(hdr_data, end + "u4", count=1, offset=4 + ptr)[0])
    count = min(count, (len(hdr_data) - 8 - ptr) // 8)
    table = np.frombuffer(hdr_data, end + "i4", count=2 * count, offset=8 + ptr).astype(np.int64)
    fdes = table[1::2] + int(hdr["sh_addr"]) - base
    address_size = 8 if image.elf.elfclass == 64 else 4
    encodings: dict[int, int | None] = {}
    rows: list[tuple[int, int]] = []
    firsts = (table[0::2] + int(hdr["sh_addr"])).tolist()
    for start, fde in zip(firsts, fdes.tolist(), strict=True):
        if fde < 0 or fde + 8 > len(data):
            continue
        length, cie_pointer = struct.unpack_from(end + "II", data, fde)
        if length == 0xFFFFFFFF or cie_pointer == 0:
            continue  # 64-bit DWARF FDEs: none in x86-64 or AArch64 binaries
        cie = fde + 4 - cie_pointer
        if cie not in encodings:
            encodings[cie] = _cie_address_encoding(data, cie, end)
        encoding = encodings[cie]
        size = None if encoding is None else _EH_FORMAT_SIZES.get(encoding & 0x0F)
        if encoding is not None and encoding & 0x0F == 0:
            size = address_size
        if size is None or fde + 8 + 2 * size > min(len(data), fde + 4 + length):
            continue
        kind = {2: "H", 4: "I", 8: "Q"}[size]
        (extent,) = struct.unpack_from(end + kind, data, fde + 8 + size)
        if extent > 0:
            rows.append((start, start + extent))
    if not rows:
        return empty
    found = np.array(sorted(set(rows)), dtype=np.int64)
    return found


def _leb128(data: bytes, at: int) -> tuple[int, int]:
    """An unsigned LEB128 number at ``at``: (value, the offset after it)."""
    value = shift = 0
    while at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    return value, at


def _cie_address_encoding(data: bytes, cie: int, end: str) -> int | None:
    """The pointer encoding (augmentation ``R``) of the CIE at ``cie`` of ``.eh_frame``:
    absptr (0) without one, None when the CIE cannot be read."""
    if cie < 0 or cie + 9 > len(data):
        return None
    length, identifier = struct.unpack_from(end + "II", data, cie)
    if length == 0xFFFFFFFF or identifier != 0:
        return None
    version = data[cie + 8]
    close = data.find(b"\0", cie + 9)
    if close < 0:
        return None
    augmentation = data[cie + 9 : close].decode("ascii", errors="replace")
    at = _leb128(data, close + 1)[1]  # code alignment
    at = _leb128(data, at)[1]  # data alignment (signed: the same bytes)
    at = at + 1 if version == 1 else _leb128(data, at)[1]  # return address register
    if not augmentation.startswith("z"):
        return 0
    at = _leb128(data, at)[1]
    for letter in augmentation[1:]:
        if at >= len(data):
            return None
        if letter == "R":
            return data[at]
        if letter == "L":
            at += 1
        elif letter == "P":
            size = _EH_FORMAT_SIZES.get(data[at] & 0x0F, 8 if data[at] & 0x0F == 0 else 0)
            if size == 0:
                return None
            at += 1 + size
        elif letter not in "SB":
            return None
    return 0

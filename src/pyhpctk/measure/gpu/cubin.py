"""GPU binaries: save each loaded module as ``gpubins/<md5>.gpubin`` and find kernel entries.

hpcrun names a kernel's CCT node by (gpubin load module, file offset of the kernel's
``.text.<mangled name>`` section): in ``meas/loops-cuda-nvidia-t.m`` the kernel ``_Z8kernmainv``
is ``+0x2e00``, the offset of ``.text._Z8kernmainv`` in its cubin, and hpcstruct's ``P`` entry
for it has the same address (formats.md §1.5, §4.4). This module reads just the ELF section
table it needs, declared once as numpy dtypes (System V ABI, ELF-64 little-endian).
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

from pyhpctk.errors import FormatError

ELF_MAGIC = b"\x7fELF"
# System V gABI: Elf64_Ehdr fields this module reads.
ELF64_HEADER = np.dtype(
    {
        "names": ["e_shoff", "e_shentsize", "e_shnum", "e_shstrndx"],
        "formats": ["<u8", "<u2", "<u2", "<u2"],
        "offsets": [0x28, 0x3A, 0x3C, 0x3E],
        "itemsize": 64,
    }
)
ELF64_SECTION = np.dtype(
    {
        "names": ["sh_name", "sh_type", "sh_offset", "sh_size"],
        "formats": ["<u4", "<u4", "<u8", "<u8"],
        "offsets": [0x00, 0x04, 0x18, 0x20],
        "itemsize": 64,
    }
)
assert ELF64_HEADER.itemsize == 64 and ELF64_SECTION.itemsize == 64
TEXT_PREFIX = ".text."


def gpubin_name(cubin: bytes) -> str:
    """``<md5>.gpubin``, as hpcrun names a saved GPU binary (formats.md §0.1)."""
    return hashlib.md5(cubin, usedforsecurity=False).hexdigest() + ".gpubin"


def kernel_entries(cubin: bytes, path: str = "<cubin>") -> dict[str, int]:
    """Mangled kernel name → file offset of its ``.text.<name>`` section."""
    if len(cubin) < 64 or cubin[:4] != ELF_MAGIC or cubin[4] != 2 or cubin[5] != 1:
        raise FormatError(path, "ELF header", "not a 64-bit little-endian ELF file")
    header = np.frombuffer(cubin, ELF64_HEADER, count=1)[0]
    shoff, shnum, strndx = int(header["e_shoff"]), int(header["e_shnum"]), int(header["e_shstrndx"])
    if int(header["e_shentsize"]) != 64 or shoff + shnum * 64 > len(cubin) or strndx >= shnum:
        raise FormatError(path, "ELF section table", "section table outside the file")
    sections = np.frombuffer(cubin, ELF64_SECTION, count=shnum, offset=shoff)
    names_at, names_size = int(sections[strndx]["sh_offset"]), int(sections[strndx]["sh_size"])
    if names_at + names_size > len(cubin):
        raise FormatError(path, "ELF section names", "string table outside the file")
    names = cubin[names_at : names_at + names_size]
    entries: dict[str, int] = {}
    for section in sections:
        start = int(section["sh_name"])
        end = names.find(b"\0", start)
        name = names[start : end if end >= 0 else len(names)].decode("utf-8", "replace")
        if name.startswith(TEXT_PREFIX):
            entries[name[len(TEXT_PREFIX) :]] = int(section["sh_offset"])
    return entries


def save_gpubin(output_dir: str, cubin: bytes) -> str:
    """Write ``output_dir/gpubins/<md5>.gpubin`` once; return its path."""
    return save_once(os.path.join(output_dir, "gpubins"), gpubin_name(cubin), cubin)


def save_once(directory: str, name: str, data: bytes) -> str:
    """Write ``directory/name`` unless it is there (a name made from the content), atomically."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    return path


EM_CUDA = 190  # System V gABI machine number of NVIDIA's CUDA
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_KERNEL_BYTES = 16  # one 16-byte slot per kernel (sm_70+ instructions are 16 bytes)


def synthetic_cubin(kernels: list[str]) -> bytes:
    """A cubin-shaped ELF holding one ``.text.<name>`` function per kernel name, no code.

    The simulated driver "loads" it as the real one loads a module, so a replayed kernel gets a
    node (gpubin, file offset of its section) as on a GPU and pyprof names it from the symbol
    table (issue #22). Each function is one zeroed 16-byte slot; nothing else of a cubin is
    there (no line map, no ``.nv.info``).
    """
    names = [name for name in dict.fromkeys(kernels) if name]
    shstrtab = bytearray(b"\0.shstrtab\0.strtab\0.symtab\0")
    strtab = bytearray(b"\0")
    text_names, symbol_names = [], []
    for name in names:
        text_names.append(len(shstrtab))
        shstrtab += f".text.{name}".encode() + b"\0"
        symbol_names.append(len(strtab))
        strtab += name.encode() + b"\0"
    symbols = bytearray(_SYMBOL.size)  # the null symbol
    for index, at in enumerate(symbol_names):
        # STB_GLOBAL | STT_FUNC, STO_CUDA_ENTRY, the kernel's own section, value 0 as in cubins
        symbols += _SYMBOL.pack(at, 0x12, 0x10, 4 + index, 0, _KERNEL_BYTES)
    offset = 64
    layout = []
    for blob in (bytes(shstrtab), bytes(strtab), bytes(symbols)):
        layout.append((offset, len(blob)))
        offset += len(blob)
    offset = (offset + 127) & ~127
    code_at = offset
    offset += _KERNEL_BYTES * len(names)
    section_table = (offset + 7) & ~7
    headers = [bytes(_SECTION.size)]
    for (at, size), (label, kind, link, info, entry) in zip(
        layout, ((1, 3, 0, 0, 0), (11, 3, 0, 0, 0), (19, 2, 2, 1, _SYMBOL.size)), strict=True
    ):
        headers.append(_SECTION.pack(label, kind, 0, 0, at, size, link, info, 1, entry))
    for index, name_at in enumerate(text_names):
        code = code_at + index * _KERNEL_BYTES
        headers.append(_SECTION.pack(name_at, 1, 0x6, 0, code, _KERNEL_BYTES, 0, 0, 128, 0))
    header = (
        ELF_MAGIC
        + bytes([2, 1, 1, 0x33, 7])  # 64-bit, little-endian, version 1, CUDA ABI (as nvcc's)
        + bytes(7)
        + struct.pack("<HHIQQQIHHHHHH", 2, EM_CUDA, 1, 0, 0, section_table, 0x5A0, 64, 56, 0,
                      64, len(headers), 1)
    )  # fmt: skip
    image = bytearray(header)
    for blob in (bytes(shstrtab), bytes(strtab), bytes(symbols)):
        image += blob
    image += bytes(code_at - len(image))
    image += bytes(_KERNEL_BYTES * len(names))
    image += bytes(section_table - len(image))
    for item in headers:
        image += item
    return bytes(image)

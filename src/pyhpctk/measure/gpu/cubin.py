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
    directory = os.path.join(output_dir, "gpubins")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, gpubin_name(cubin))
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as stream:
            stream.write(cubin)
        os.replace(temporary, path)
    return path

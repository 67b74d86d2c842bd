"""Kernel frames of perf-events measurements, named from ``MEAS/kernel_symbols/`` as hpcprof does.

hpcrun records the kernel's part of a call path under a load module of its own and copies the
kernel symbol table to ``MEAS/kernel_symbols/vmlinux.HOSTID`` (:mod:`pyhpctk.formats.kallsyms`).
HPCToolkit has named that module two ways, and hpcprof's kernel-symbols finalizer of each
release reads its own:

* up to release 2024.01: ``<vmlinux.HOSTID>`` (a name in angle brackets, no directory); hpcprof
  reads ``kernel_symbols/vmlinux.HOSTID`` of the measurement directory;
* later (HPCToolkit's development branch from 2024): ``kernel_symbols/vmlinux.HOSTID``, relative
  to the measurement directory like ``gpubins/`` and ``vdso/``; the module is the file itself,
  and meta.db names it by that relative path.

pyprof reads both and does what hpcprof does:

* only such a module with a regular file beside the profiles is concerned;
* only function symbols (nm type ``t`` or ``T``) name frames; a function reaches up to the next
  function symbol's address (data symbols in between do not end it), the last one to the end of
  the address space; of several at one address the first listed wins;
* a frame at an address of a function becomes ``-call> [function] NAME [vmlinux]`` (``NAME
  [MODULE] [vmlinux]`` for a loadable module's symbol; the function's module is the kernel
  module, its offset the symbol's address, no source file), with the elided ``-lexical>
  [instruction]`` below it that keeps its values, like an ELF symbol (formats.md §3.7);
* an address below the first function symbol stays a raw ``-call> [instruction]
  MODULE+ADDRESS``.

Structure files play no part (kernel frames are named with or without them, and under
``--ignore-structs``). This module reads the table and builds the lookup; :mod:`.expand` turns
frames into contexts.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.expand import Symbol
from pyhpctk.errors import FormatError
from pyhpctk.formats.kallsyms import KERNEL_SYMBOLS_DIRECTORY, KernelSymbolTable, read

LINUX_KERNEL_NAME = "[vmlinux]"  # hpcrun's LINUX_KERNEL_NAME (linux_info.h), appended to names
ADDRESS_END = 1 << 64

SymbolLookup = tuple[list[Symbol], npt.NDArray[np.uint64]]


def symbols_file(module: str, measurement: Path) -> Path | None:
    """The kernel symbol file of a kernel module, if the module is one and the file exists.

    ``<NAME>`` (no directory): ``MEAS/kernel_symbols/NAME``; a relative ``…/kernel_symbols/NAME``:
    that file of the measurement directory.
    """
    if len(module) > 2 and module[0] == "<" and module[-1] == ">" and "/" not in module:
        path = measurement / KERNEL_SYMBOLS_DIRECTORY / module[1:-1]
    else:
        relative = PurePosixPath(module)
        if relative.is_absolute() or relative.parent.name != KERNEL_SYMBOLS_DIRECTORY:
            return None
        path = measurement / relative
    return path if path.is_file() else None


def function_name(name: str, module: str) -> str:
    """hpcprof's name of a kernel function: ``name [module] [vmlinux]``."""
    return f"{name} {module} {LINUX_KERNEL_NAME}" if module else f"{name} {LINUX_KERNEL_NAME}"


def functions(table: KernelSymbolTable) -> SymbolLookup:
    """The functions of a table as :class:`~.expand.Symbol` ranges, sorted by address.

    Each function ends where the next one starts (the last at 2**64); at an address listed more
    than once the first line wins (hpcprof keeps the first entry of its range map).
    """
    first: dict[int, str] = {}
    for symbol in table.symbols:
        if symbol.is_text and symbol.address not in first:
            first[symbol.address] = function_name(symbol.name, symbol.module)
    starts = sorted(first)
    ends = [*starts[1:], ADDRESS_END]
    symbols = [Symbol(start, end, first[start]) for start, end in zip(starts, ends, strict=True)]
    return symbols, np.asarray(starts, dtype=np.uint64)


def load(module: str, measurement: Path, problems: list[str]) -> SymbolLookup | None:
    """The function lookup of a ``<NAME>`` module from its measurement's kernel symbols, or None.

    An unreadable or damaged file is reported in ``problems`` and leaves the frames raw, as
    hpcprof leaves them after its warning; lines that are not symbols are reported, skipped,
    and the function before them extends over them.
    """
    path = symbols_file(module, measurement)
    if path is None:
        return None
    try:
        table = read(path)
    except FormatError as error:
        problems.append(f"{error}; the frames of {module} stay raw addresses")
        return None
    if table.skipped:
        problems.append(
            f"{path}: {table.skipped} line(s) are not 'ADDRESS TYPE NAME [MODULE]' and were "
            "skipped (the function before each extends over it)"
        )
    lookup = functions(table)
    if not lookup[0]:
        problems.append(
            f"{path}: no function symbol (type t or T); the frames of {module} stay raw"
        )
        return None
    return lookup

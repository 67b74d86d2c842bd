"""Read and write hpcrun's copy of the kernel symbol table, ``MEAS/kernel_symbols/vmlinux.HOSTID``.

formats.md §1 (measurement directory): when hpcrun samples with perf events and the kernel's
addresses are readable (``/proc/sys/kernel/kptr_restrict`` 0, ``perf_event_paranoid`` < 2), it
extends call paths with the kernel's frames — load module ``<vmlinux.HOSTID>``, offset = the
kernel virtual address — and copies ``/proc/kallsyms`` once per host into
``kernel_symbols/vmlinux.HOSTID`` (HOSTID: ``gethostid()`` as 8 hex digits, as in the
``.hpcrun`` names), compressed with liblzma's xz encoder (hpcrun's ``copy_kallsyms`` →
``compress_deflate``). The text is ``nm``'s: one symbol a line, ``ADDRESS TYPE NAME``, then
``\\t[MODULE]`` for a symbol of a loadable module::

    ffffffff81000000 T startup_64
    ffffffffc0a41010 t ext4_fill_super	[ext4]

A line is read the way hpcprof's kernel-symbols finalizer reads it: whitespace-separated fields,
the address in hex, a one-letter type, the name, and optionally one more field, the module.
Lines that do not have that shape are counted in :attr:`KernelSymbolTable.skipped`, not fatal.
:func:`read` takes the xz stream hpcrun writes and, beyond hpcprof, plain text (a hand copy of
``/proc/kallsyms``; hpcprof's liblzma reader refuses it). An xz stream is decompressed in
chunks and refused once its text passes :data:`MAX_TEXT_BYTES` (64 MiB; a real table is under
20 MB): a few KB of xz can say gigabytes. Symbol names and modules keep
their bytes (``surrogateescape``).

The format has no magic of its own (an xz stream or text), so it is not one of the formats
:func:`pyhpctk.formats.detect` recognises from content; callers name it by its place in a
measurement directory (``pyhpctk verify`` and ``dump``:
:func:`pyhpctk.formats.inspect.format_of_file`). This module must never raise anything but
:class:`~pyhpctk.errors.FormatError` on bad input.
"""

from __future__ import annotations

import io
import lzma
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from pyhpctk.errors import FormatError
from pyhpctk.formats.whole import Source, read_whole

__all__ = [
    "KERNEL_SYMBOLS_DIRECTORY",
    "KernelSymbol",
    "KernelSymbolTable",
    "dump",
    "dumps",
    "parse",
    "read",
    "to_bytes",
    "to_text",
    "verify",
    "write",
]

KERNEL_SYMBOLS_DIRECTORY = "kernel_symbols"  # hpcrun's KERNEL_SYMBOLS_DIRECTORY (linux_info.h)
XZ_MAGIC = b"\xfd7zXZ\x00"
#: The most text :func:`read` decompresses (a real ``/proc/kallsyms`` is under 20 MB): an xz
#: stream that expands past it is refused, not decompressed (a few KB of xz can say gigabytes).
MAX_TEXT_BYTES = 64 << 20
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]+")
_ADDRESS_LIMIT = 1 << 64


@dataclass(frozen=True, slots=True)
class KernelSymbol:
    """One line of the table: ``address``, nm's one-letter ``type``, ``name``, ``module``.

    ``module`` is the loadable module's field as written (``[ext4]``), "" for the kernel proper.
    """

    address: int
    type: str
    name: str
    module: str = ""

    @property
    def is_text(self) -> bool:
        """A function: nm's ``t`` (local) or ``T`` (global), the only ones hpcprof names by."""
        return self.type in ("t", "T")


@dataclass(slots=True)
class KernelSymbolTable:
    """A whole kernel symbol file, in file order, and how many lines were not symbols."""

    symbols: list[KernelSymbol] = field(default_factory=list)
    skipped: int = 0


def parse(text: str) -> KernelSymbolTable:
    """The symbols of the decompressed text; blank lines are ignored, others counted as skipped."""
    table = KernelSymbolTable()
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if (
            len(fields) < 3
            or len(fields[1]) != 1
            or _HEX.fullmatch(fields[0]) is None
            or int(fields[0], 16) >= _ADDRESS_LIMIT
        ):
            table.skipped += 1
            continue
        module = fields[3] if len(fields) > 3 else ""
        table.symbols.append(KernelSymbol(int(fields[0], 16), fields[1], fields[2], module))
    return table


def _decompress(buf: bytes, path: str | None, limit: int) -> bytes:
    """The text of ``buf``: itself when plain, else its xz streams, refused past ``limit``."""
    if not buf.startswith(XZ_MAGIC):
        return buf  # plain text: a hand copy of /proc/kallsyms
    out = bytearray()
    rest = buf
    try:
        while rest:  # xz allows concatenated streams, as lzma.decompress does
            stream = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
            chunk = stream.decompress(rest, max_length=limit + 1 - len(out))
            while len(out) + len(chunk) <= limit and not stream.eof and not stream.needs_input:
                out += chunk
                chunk = stream.decompress(b"", max_length=limit + 1 - len(out))
            out += chunk
            if len(out) > limit:
                raise FormatError(
                    path,
                    "xz stream",
                    f"decompresses to more than {limit} bytes: not a copy of /proc/kallsyms",
                )
            if not stream.eof:
                raise FormatError(path, "xz stream", "cannot decompress: truncated stream")
            rest = stream.unused_data.lstrip(b"\0")  # stream padding
    except lzma.LZMAError as error:
        raise FormatError(path, "xz stream", f"cannot decompress: {error}") from None
    return bytes(out)


def read(source: Source, *, limit: int = MAX_TEXT_BYTES) -> KernelSymbolTable:
    """Read a kernel symbol file (xz as hpcrun writes it, or plain text) from a path or buffer.

    An xz stream whose text would pass ``limit`` bytes is a FormatError, found after
    decompressing at most ``limit`` + 1 bytes.
    """
    whole, path = read_whole(source)
    data = _decompress(bytes(whole), path, limit)
    if b"\0" in data:
        raise FormatError(path, "text", "holds NUL bytes: not a copy of /proc/kallsyms")
    return parse(data.decode("utf-8", "surrogateescape"))


def to_text(table: KernelSymbolTable) -> str:
    """The table as ``/proc/kallsyms`` prints it (16 hex digits, module after a tab)."""
    lines = []
    for s in table.symbols:
        line = f"{s.address:016x} {s.type} {s.name}"
        lines.append(f"{line}\t{s.module}" if s.module else line)
    return "".join(f"{line}\n" for line in lines)


def to_bytes(table: KernelSymbolTable, compress: bool = True) -> bytes:
    """The file as hpcrun's ``copy_kallsyms`` writes it: xz, CRC64 check, preset 6."""
    raw = to_text(table).encode("utf-8", "surrogateescape")
    if not compress:
        return raw
    return lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6)


def write(
    table: KernelSymbolTable, dest: str | os.PathLike[str] | BinaryIO, compress: bool = True
) -> None:
    """Write ``table`` to a path or a binary stream (xz unless ``compress`` is False)."""
    data = to_bytes(table, compress)
    if isinstance(dest, str | os.PathLike):
        Path(dest).write_bytes(data)
    else:
        dest.write(data)


def verify(table: KernelSymbolTable) -> list[str]:
    """What a reader of the table should know: lines skipped, no function at all."""
    problems = []
    if table.skipped:
        problems.append(f"{table.skipped} line(s) are not 'ADDRESS TYPE NAME [MODULE]'")
    if not any(s.is_text for s in table.symbols):
        problems.append("no function symbol (type t or T)")
    elif all(s.address == 0 for s in table.symbols if s.is_text):
        problems.append("every address is 0: copied while kptr_restrict hid them")
    return problems


def dump(table: KernelSymbolTable, out: TextIO) -> None:
    """The table as readable text: a header line, then ``/proc/kallsyms``'s own lines."""
    functions = sum(1 for s in table.symbols if s.is_text)
    out.write(
        f"kernel symbols, {len(table.symbols)} symbols ({functions} functions), "
        f"{table.skipped} lines skipped\n"
    )
    out.write(to_text(table))


def dumps(table: KernelSymbolTable) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(table, text)
    return text.getvalue()

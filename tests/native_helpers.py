"""A C shared library called from a Python line, and a measurement of it written by hand.

Issue #17: the tree must read Python line → C function → loop → line. Until the sampling
engine records native stacks, a test builds the library here (``gcc -O2 -g``), picks addresses
inside its loop bodies from the DWARF line table (pyelftools, independently of pystruct), and
writes the measurement directory pyrun would write — a ``logical/python.*`` file for the Python
frames and a ``.hpcrun`` profile whose load module table names the library by its real path —
through pyrun's own writers (:mod:`pyhpctk.measure.cct`, :mod:`pyhpctk.measure.encode`).

Caller frames are written as hpcrun writes them: the return address minus one, an address
inside the call instruction (``meas/small.m``: ``caller`` calls ``spinsleep`` with the 5-byte
call at 0x1182, and its frame says 0x1187, the call's last byte; docs/pystruct.md). When the
engine lands, :data:`PROGRAM` run under ``pyrun`` measures the same library for real.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pyhpctk.formats.hpcrun_constants import LM_FLAG_ANALYZE
from pyhpctk.measure.cct import (
    FunctionStanza,
    MetricKind,
    MetricSpec,
    NodeIdAllocator,
    ThreadCCT,
)
from pyhpctk.measure.encode import ProfileIdentity, encode_logical, encode_profile

# Line numbers matter: the tests name the lines by the markers in the comments.
C_SOURCE = """\
#include <stddef.h>

__attribute__((noinline, visibility("hidden"))) double nest(const double *a, int n, int m)
{
    double total = 0.0;
    for (int i = 0; i < n; i++) {              /* outer loop */
        double row = a[i % 7] * 0.5 + i;       /* outer body */
        for (int j = 0; j < m; j++) {          /* inner loop */
            total += row / (double)(i + j + 1); /* inner body */
        }
    }
    return total;
}

__attribute__((noinline, visibility("hidden"))) double scale(const double *v, int n)
{
    double s = 0.0;
    for (int k = 0; k < n; k++) {              /* scale loop */
        s += v[k % 7] / (k + 1.5);             /* scale body */
    }
    return s;
}

static const double table[7] = {1, 2, 3, 4, 5, 6, 7};

double run_all(int n)
{
    double x = nest(table, n, n);              /* call nest */
    double y = scale(table, n * n / 3);        /* call scale */
    return x + y;
}
"""

# The Python side: the line that calls into C is the one the native frames hang below.
PROGRAM = """\
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.run_all.restype = ctypes.c_double
lib.run_all.argtypes = [ctypes.c_int]


def main(n):
    return lib.run_all(n)  # calls C


main(int(sys.argv[2]) if len(sys.argv) > 2 else 3000)
"""


def line_of(marker: str, text: str = C_SOURCE) -> int:
    """The 1-based line of ``text`` that holds ``marker``."""
    return next(number for number, line in enumerate(text.splitlines(), 1) if marker in line)


def build_library(where: Path, name: str = "libnative.so", strip: bool = False) -> Path:
    """``gcc -O2 -g -shared -fPIC`` of :data:`C_SOURCE` into ``where/name`` (stripped if asked)."""
    if shutil.which("gcc") is None:
        raise RuntimeError("gcc is needed to build the native test library (apt-get install gcc)")
    where.mkdir(parents=True, exist_ok=True)
    source = where / "native.c"
    source.write_text(C_SOURCE)
    library = where / name
    subprocess.run(
        ["gcc", "-O2", "-g", "-shared", "-fPIC", "-o", str(library), str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    if strip:
        subprocess.run(["strip", "--strip-all", str(library)], check=True, timeout=60)
    return library


@dataclass(frozen=True, slots=True)
class Symbol:
    """A function symbol of the library: entry and end address."""

    start: int
    end: int


def symbols(library: Path) -> dict[str, Symbol]:
    """Function symbols from ``.symtab`` (``.dynsym`` when stripped), by name (pyelftools)."""
    from elftools.elf.elffile import ELFFile

    found: dict[str, Symbol] = {}
    with library.open("rb") as stream:
        elf = ELFFile(stream)
        for section in elf.iter_sections():
            if section.header.sh_type not in ("SHT_SYMTAB", "SHT_DYNSYM"):
                continue
            for sym in section.iter_symbols():  # type: ignore[attr-defined]
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_size"]:
                    start = int(sym["st_value"])
                    found.setdefault(sym.name, Symbol(start, start + int(sym["st_size"])))
    return found


def line_addresses(library: Path, line: int) -> list[int]:
    """Addresses where the DWARF line table (of an unstripped build) starts a row of ``line``."""
    from elftools.elf.elffile import ELFFile

    out: set[int] = set()
    with library.open("rb") as stream:
        elf = ELFFile(stream)
        dwarf = elf.get_dwarf_info()
        for unit in dwarf.iter_CUs():
            program = dwarf.line_program_for_CU(unit)
            if program is None:
                continue
            for entry in program.get_entries():
                state = entry.state
                if state is not None and not state.end_sequence and state.line == line:
                    out.add(int(state.address))
    return sorted(out)


def call_sites(library: Path, caller: str, callee: str) -> list[int]:
    """Return address − 1 of each ``call callee`` in ``caller`` (capstone): the caller frame."""
    import capstone

    table = symbols(library)
    where, target = table[caller], table[callee]
    code = library.read_bytes()  # a shared library's code addresses are its file offsets here
    decoder = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    out = []
    for address, size, mnemonic, operand in decoder.disasm_lite(
        code[where.start : where.end], where.start
    ):
        if mnemonic in ("call", "jmp") and operand == hex(target.start):
            out.append(address + size - 1)
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    """``count`` samples at native address ``leaf`` reached through native ``callers``."""

    leaf: int
    count: int
    callers: tuple[int, ...] = ()  # outermost first, each a return address − 1


def write_measurement(
    measurements: Path,
    library: Path,
    program: Path,
    samples: list[Sample],
    period: float = 0.005,
) -> Path:
    """A measurement directory as pyrun writes it: Python ``<module>`` → ``main`` line → C.

    The Python frames are logical frames of ``program`` (the ``main(...)`` call at module level
    and the ``lib.run_all`` line in ``main``), the native frames ``(library, offset)`` nodes
    below them with ``period`` seconds of ``CPUTIME (sec)`` per sample.
    """
    text = program.read_text()
    measurements.mkdir(parents=True, exist_ok=True)
    (measurements / "logical").mkdir(exist_ok=True)
    logical_name = "logical/python.0a17c0de"
    stanzas = [
        FunctionStanza(1, "", str(program), 0),
        FunctionStanza(2, "main", str(program), line_of("def main", text)),
    ]
    (measurements / logical_name).write_bytes(encode_logical(stanzas))
    load_modules = [(1, logical_name, LM_FLAG_ANALYZE), (2, str(library), LM_FLAG_ANALYZE)]
    kind = MetricKind("cpu", (MetricSpec("CPUTIME (sec)"),), base=0)
    cct = ThreadCCT(NodeIdAllocator(), main=True)
    module_line = line_of("main(int(sys.argv", text)
    python = cct.child(cct.fence, 1, 1 << 32 | module_line)
    python = cct.child(python, 1, 2 << 32 | line_of("# calls C", text))
    for sample in samples:
        node = python
        for caller in sample.callers:
            node = cct.child(node, 2, caller)
        node = cct.child(node, 2, sample.leaf)
        cct.add(kind, node, 0, sample.count * period)
    identity = ProfileIdentity("python", "/usr/bin/python3", "/usr/bin", "", None, 0, 0x17, 4242)
    profile = encode_profile(cct, identity, load_modules, [kind])
    path = measurements / "python-000000-000-00000017-4242-0.hpcrun"
    path.write_bytes(profile)
    return path

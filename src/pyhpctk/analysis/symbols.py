"""Function names from ELF symbol tables, for binaries that have no structure file.

hpcprof names frames of a binary it can read but has no structure for after its ELF symbols
(``-call> [function] sym`` with an elided instruction below, formats.md §3.7; seen for the vDSO in
``loops-cputime-t.nostruct.d``). pyprof does the same, but only for binaries stored inside the
measurement directory (``vdso/``, ``gpubins/``... named by a relative load-map path): system paths
such as ``/usr/lib/libc.so.6`` are never opened, so a database does not depend on what happens to
be installed on the machine that builds it. Reading ELF is pyelftools' job.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.expand import Symbol

_BIND_RANK = {"STB_GLOBAL": 0, "STB_WEAK": 1, "STB_LOCAL": 2}


def read_symbols(path: Path) -> tuple[list[Symbol], npt.NDArray[np.uint64]] | None:
    """Function symbols of an ELF file, one per start address, sorted; None if unreadable.

    Among aliases of one address the global symbol wins over weak and local ones, then the
    longer name (``__vdso_clock_gettime`` over ``clock_gettime``), as hpcprof presents them.
    """
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError:  # pragma: no cover - pyelftools is a hard dependency
        return None
    best: dict[int, tuple[tuple[int, int, str], Symbol]] = {}
    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            for section in elf.iter_sections():
                if section.header.sh_type not in ("SHT_SYMTAB", "SHT_DYNSYM"):
                    continue
                for sym in section.iter_symbols():  # type: ignore[attr-defined]
                    info = sym["st_info"]
                    if info["type"] not in ("STT_FUNC", "STT_GNU_IFUNC") or not sym.name:
                        continue
                    start, size = int(sym["st_value"]), int(sym["st_size"])
                    if size == 0:
                        continue
                    rank = (_BIND_RANK.get(info["bind"], 3), -len(sym.name), sym.name)
                    old = best.get(start)
                    if old is None or rank < old[0]:
                        best[start] = (rank, Symbol(start, start + size, sym.name))
    except (OSError, ELFError, ValueError, KeyError):
        return None
    symbols = [best[start][1] for start in sorted(best)]
    return symbols, np.asarray([s.start for s in symbols], dtype=np.uint64)

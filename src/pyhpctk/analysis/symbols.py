"""Function names from ELF symbol tables, for binaries that have no structure file.

hpcprof names frames of a binary it can read but has no structure for after its ELF symbols
(``-call> [function] sym`` with an elided instruction below, formats.md §3.7; seen for the vDSO in
``loops-cputime-t.nostruct.d``). pyprof does the same for binaries stored inside the measurement
directory (``vdso/``, ``gpubins/``... named by a relative load-map path: :func:`read_symbols`, as
hpcprof), and for the native libraries of a pyrun measurement whose file is still the build the
run sampled (:mod:`.native_modules` checks that; :func:`library_functions`), with pystruct's
names: its skeleton's symbol procedures, demangled and suffixed ``[lib.so]`` as pystruct names
them, and its ``.plt`` stubs. A stripped library's other symbols come from its separate debug
file or MiniDebugInfo (:mod:`pyhpctk.structure.debug_symbols`). A symbol names only the code it
covers; other code is cut into functions by its unwind table (``.eh_frame``) and each is named as
unknown code of the library, ``lib.so @ 0x1180`` (:func:`unknown_function`). Reading ELF is
pyelftools' job (through :mod:`pyhpctk.structure.elfimage`).
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.expand import Symbol
from pyhpctk.errors import PyhpctkError

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


def unknown_function(library: str, entry: int) -> str:
    """The name of a function of ``library`` that no symbol names, by its entry address in
    the file (``libc.so.6 @ 0x85e50``): unknown code of that library, no neighbour's name."""
    return f"{library} @ 0x{entry:x}"


def library_functions(path: Path) -> tuple[list[Symbol], npt.NDArray[np.uint64]] | None:
    """The functions of a native library by their names, sorted; None if it cannot be read.

    pystruct's skeleton without its decoding: symbol procedures (from the separate debug file
    or MiniDebugInfo of a stripped library where there is one) and ``.plt`` stubs, their names
    those ``pystruct`` gives. A symbol names only the code it covers: its size, or for a
    symbol without one, the unwind table's function that begins there (else up to the next
    function). Code no symbol covers is named as unknown code of the library
    (:func:`unknown_function`): at its unwind-table function's entry, or where the uncovered
    stretch begins when no unwind entry describes it.
    """
    from pyhpctk.structure.dwarf import DebugInfo, empty_inlines, empty_line_map
    from pyhpctk.structure.elfimage import open_image, unwind_ranges
    from pyhpctk.structure.host import symbol_procedures, unclaimed_procedures

    try:
        image = open_image(path)
        if image.is_cuda:
            return None
        info = DebugInfo(empty_line_map(), empty_inlines(), False)  # names only: no DWARF
        named = symbol_procedures(image, info)
        stubs = unclaimed_procedures(image, info, named, ())  # the .plt stubs
        unwound = unwind_ranges(image).tolist()
    except (PyhpctkError, OSError, ValueError):
        return None
    unwound_end = dict(unwound)
    sized = {f.start for f in image.functions if f.sized}
    known = [
        Symbol(p.start, p.end if p.start in sized else unwound_end.get(p.start, p.end), name)
        for p in [*named, *stubs]
        for name in [p.pretty_name]
    ]
    found = sorted(known, key=_start)
    found += _uncovered(found, [(start, end) for start, end in unwound], image.basename, True)
    found.sort(key=_start)
    regions = [(region.start, region.end) for region in image.regions]
    found += _uncovered(found, regions, image.basename, False)
    found.sort(key=_start)
    return found, np.asarray([s.start for s in found], dtype=np.uint64)


def _uncovered(
    found: list[Symbol], ranges: list[tuple[int, int]], library: str, entries: bool
) -> list[Symbol]:
    """Unknown functions for the code of ``ranges`` that no function of ``found`` (sorted by
    start) covers. ``entries``: the ranges are functions (unwind entries), each one unknown
    function when its entry is not covered, up to the next covered code; else every uncovered
    stretch of the ranges (code regions) is one."""
    covered: list[list[int]] = []  # disjoint, sorted
    for symbol in found:
        if covered and symbol.start <= covered[-1][1]:
            covered[-1][1] = max(covered[-1][1], symbol.end)
        else:
            covered.append([symbol.start, symbol.end])
    lows = [low for low, _ in covered]
    pieces: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        k = bisect.bisect_right(lows, start)  # covered[k:] begin after start
        if entries:
            if k == 0 or covered[k - 1][1] <= start:  # its entry is no named code
                pieces.append((start, min(end, lows[k]) if k < len(lows) else end))
            continue
        at = max(start, covered[k - 1][1]) if k else start
        for low, high in covered[k:]:
            if low >= end:
                break
            pieces.append((at, low))
            at = max(at, high)
        pieces.append((at, end))
    return [Symbol(low, high, unknown_function(library, low)) for low, high in pieces if low < high]


def _start(symbol: Symbol) -> int:
    return symbol.start

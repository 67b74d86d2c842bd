"""Function names from ELF symbol tables, for binaries that have no structure file.

hpcprof names frames of a binary it can read but has no structure for after its ELF symbols
(``-call> [function] sym`` with an elided instruction below, formats.md §3.7; seen for the vDSO in
``loops-cputime-t.nostruct.d``). pyprof does the same for binaries stored inside the measurement
directory (``vdso/``, ``gpubins/``... named by a relative load-map path: :func:`read_symbols`, as
hpcprof), and for the native libraries of a pyrun measurement whose file is still the build the
run sampled (:mod:`.native_modules` checks that; :func:`library_functions`), with pystruct's
names: its skeleton's symbol procedures, demangled and suffixed ``[lib.so]`` as pystruct names
them, and its ``.plt`` stubs. Code no symbol covers (a stripped library keeps only its exported
symbols) is cut into functions at the entries of its unwind table (``.eh_frame_hdr``) and each is
named after the nearest symbol before it, ``export+0x40 [lib.so]``. Reading ELF is pyelftools'
job (through :mod:`pyhpctk.structure.elfimage`).
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


def library_functions(path: Path) -> tuple[list[Symbol], npt.NDArray[np.uint64]] | None:
    """The functions of a native library by their names, sorted; None if it cannot be read.

    pystruct's skeleton without its decoding: symbol procedures and ``.plt`` stubs (their names
    are those ``pystruct`` gives), then a function at every unwind-table entry that none of
    them covers, named after the nearest symbol procedure before it in its code region
    (``export+0x40 [lib.so]``; with none, the region: ``.text+0x40 [lib.so]``). A function
    reaches the next entry of either kind (or its region's end).
    """
    from pyhpctk.structure.dwarf import DebugInfo, empty_inlines, empty_line_map
    from pyhpctk.structure.elfimage import open_image, unwind_entries
    from pyhpctk.structure.host import symbol_procedures, unclaimed_procedures

    try:
        image = open_image(path)
        if image.is_cuda:
            return None
        info = DebugInfo(empty_line_map(), empty_inlines(), False)  # names only: no DWARF
        named = symbol_procedures(image, info)
        stubs = unclaimed_procedures(image, info, named, ())  # the .plt stubs
        entries = unwind_entries(image).tolist()
    except (PyhpctkError, OSError, ValueError):
        return None
    suffix = f" [{image.basename}]" if image.is_shared else ""
    known = sorted((p.start, p.end, p.pretty_name) for p in [*named, *stubs])
    starts = [start for start, _, _ in known]
    reach = np.maximum.accumulate([end for _, end, _ in known]).tolist() if known else []
    symbols = [(p.start, p.pretty_name.removesuffix(suffix)) for p in named]
    symbols.sort()
    boundaries = sorted(set(starts) | set(entries))
    found = [Symbol(start, end, name) for start, end, name in known]
    for entry in entries:
        k = bisect.bisect_right(starts, entry) - 1
        region = image.region_of(entry)
        if region is None or (k >= 0 and entry < reach[k]):
            continue  # outside the code, or inside a named function
        following = bisect.bisect_right(boundaries, entry)
        end = boundaries[following] if following < len(boundaries) else region.end
        end = min(end, region.end)
        j = bisect.bisect_right(symbols, (entry, "")) - 1
        if j >= 0 and symbols[j][0] >= region.start:
            base, at = symbols[j][1], symbols[j][0]
        else:
            base, at = region.name, region.start
        found.append(Symbol(entry, end, f"{base}+0x{entry - at:x}{suffix}"))
    found.sort(key=lambda symbol: symbol.start)
    return found, np.asarray([s.start for s in found], dtype=np.uint64)

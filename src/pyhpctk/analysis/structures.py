"""Structure files, ELF symbols and logical metadata: how each load module's frames are expanded.

Stage 3 (calling context expansion) needs, for every load module the profiles use, a way to
classify its frames (:class:`~.expand.ModuleClassifiers`): a structure file (``-S`` files first,
then ``MEAS/structs/``), for a binary captured in the measurement directory without one its DWARF
line map (pystruct's analysis, in process), else its ELF symbols; a native library pyrun sampled
is named from its ELF symbols when the file at its path is still the build the run recorded
(:mod:`.native_modules`); Python logical frames use the ``logical/python.*`` metadata and, where
pystruct described the source, its loops. Only the
driver's rank 0 calls this (:func:`.pipeline.expand_contexts`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from functools import partial
from pathlib import Path

from pyhpctk.analysis import inputs, kernel_symbols
from pyhpctk.analysis.expand import LogicalFunction, ModuleClassifiers
from pyhpctk.analysis.native_modules import Identities, refusal
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.python_loops import PythonLoops
from pyhpctk.analysis.structmap import FILE, StructureIndex, index_structure
from pyhpctk.analysis.symbols import library_functions, read_symbols
from pyhpctk.errors import PyhpctkError

PYTHON_SUFFIXES = (".py", ".pyw")


def _is_relative(path: str) -> bool:
    return not path.startswith("/")


def structure_binary(path: Path) -> str | None:
    """The ``LM n`` of a structure file, read from its head without parsing the whole file.

    Structure files of big libraries run to megabytes; pyprof only parses those describing a
    binary the profiles use. None when no ``<LM`` element appears in the first megabyte.
    """
    import html
    import re

    try:
        with open(path, "rb") as stream:
            head = stream.read(1 << 20)
    except OSError:
        return None
    match = re.search(rb"<LM\b[^>]*?\sn=\"([^\"]*)\"", head)
    if match is None:
        return None
    return html.unescape(match.group(1).decode("utf-8", errors="replace"))


def load_structures(
    options: ProfOptions,
    measurements: Iterable[Path],
    used_modules: Iterable[str] = (),
) -> tuple[list[StructureIndex], list[StructureIndex]]:
    """(``-S`` indexes, ``MEAS/structs`` indexes), each file parsed with formats.hpcstruct.

    Files in ``MEAS/structs`` whose binary no profile uses are skipped unparsed; ``-S`` files
    are always parsed (an unused one is reported as a problem).
    """
    if options.ignore_structs:
        return [], []
    from pyhpctk.formats import hpcstruct

    used = list(used_modules)
    explicit: list[StructureIndex] = []
    for path in options.structs:
        if not path.is_file():
            raise inputs.InputError(f"{path}: no such structure file")
        explicit += index_structure(hpcstruct.read(path))
    found: list[StructureIndex] = []
    for measurement in dict.fromkeys(measurements):
        for path in inputs.structure_files(measurement):
            binary = structure_binary(path)
            # Python sources are kept: logical frames name them by file, not as load modules.
            if (
                binary is not None
                and used
                and not binary.endswith(PYTHON_SUFFIXES)
                and not any(_same_binary(m, binary) for m in used)
            ):
                continue
            found += index_structure(hpcstruct.read(path))
    return explicit, found


def _same_binary(module: str, described: str) -> bool:
    if module == described:
        return True
    if _is_relative(described) and module.endswith("/" + described):
        return True
    return _is_relative(module) and described.endswith("/" + module)


def build_classifiers(
    module_paths: Iterable[tuple[str, Path]],
    explicit: list[StructureIndex],
    found: list[StructureIndex],
    problems: list[str],
    line_maps: bool = True,
    identities: Identities | None = None,
    offsets: Mapping[str, Collection[int]] | None = None,
) -> ModuleClassifiers:
    """Choose, for every load module the profiles use, how its frames are classified.

    ``line_maps``: captured binaries without a structure file get their DWARF line map, and
    native libraries pyrun recorded (``identities``: :func:`.native_modules.recorded_identities`)
    their ELF symbols (both off under ``--ignore-structs``, which asks for hpcrun's raw frames).
    ``offsets``: the offsets the profiles name in captured GPU binaries (:func:`captured_gpu`),
    the only functions whose lines their line maps are read for.
    """
    named = offsets or {}
    recorded = identities or {}
    classifiers = ModuleClassifiers()
    used_explicit: set[int] = set()
    unanalyzed: list[tuple[str, Path]] = []  # native binaries here, without structure
    for module, measurement in module_paths:
        kernel = kernel_symbols.load(module, measurement, problems)  # perf events' kernel frames
        if kernel is not None:
            classifiers.symbols[module] = kernel
            continue
        if module.startswith("<"):  # pseudo-modules (GPU range trees) have no file
            continue
        stem = Path(module).name
        if module.startswith("logical/") or "/logical/" in module:
            where = measurement / module if _is_relative(module) else Path(module)
            stanzas = _read_logical(where)
            if stanzas is not None:
                classifiers.logical[module] = stanzas
                generator = stem.split(".", 1)[0]
                classifiers.presented_path[module] = f"<logical {generator}>"
                continue
            problems.append(f"{where}: unreadable logical metadata; its frames stay raw")
        match = None
        for number, index in enumerate(explicit):
            if _same_binary(module, index.path):
                match = index
                used_explicit.add(number)
                break
        if match is None:
            match = next((index for index in found if _same_binary(module, index.path)), None)
        if match is not None:
            classifiers.structures[module] = match
            if module in recorded and line_maps and refusal(module, recorded[module]) is None:
                # offsets the structure places in no procedure are named as without it
                classifiers.symbol_fallback[module] = partial(library_functions, Path(module))
            continue
        captured = captured_binary(module, measurement)
        if captured is not None and captured.suffix == PTX_SUFFIX:
            # pyrun's saved PTX of counted kernels (issue #34): its whole structure is cheap
            # to recover here, as pystruct would (structure/ptx.py)
            described = ptx_structure(captured, module, problems)
            if described is not None:
                classifiers.structures[module] = described
                continue
        if captured is not None and line_maps:
            # A binary captured in the measurement directory (gpubins/, vdso/) is the very one
            # that ran: without a structure file, its DWARF line map still gives functions and
            # lines. Binaries found elsewhere by path are not used: the analysis machine's copy
            # may not be the one measured (pystruct MEAS analyzes them on purpose).
            fallback = line_map_structure(captured, module, named.get(module))
            if fallback is not None:
                classifiers.structures[module] = fallback
                problems.append(
                    f"{module}: no structure file; used its DWARF line map "
                    "(run pystruct on the measurements for loops, inlined code and call sites)"
                )
                continue
        if _is_relative(module):
            table = read_symbols(measurement / module)
            if table is not None and table[0]:
                classifiers.symbols[module] = table
        elif module in recorded and line_maps:
            # pyrun recorded which build it sampled: named from the file if it still is that one
            refused = refusal(module, recorded[module])
            table = library_functions(Path(module)) if refused is None else None
            if table is not None and table[0]:
                classifiers.symbols[module] = table
            elif refused is not None:
                problems.append(refused)
            else:
                unanalyzed.append((module, measurement))
        elif Path(module).is_file():
            unanalyzed.append((module, measurement))
    if unanalyzed and classifiers.logical:  # pyrun's native frames (hpcrun's stay as they were)
        names = ", ".join(sorted(Path(module).name for module, _ in unanalyzed)[:3])
        more = f" and {len(unanalyzed) - 3} more" if len(unanalyzed) > 3 else ""
        problems.append(
            f"{len(unanalyzed)} native "
            + ("library has" if len(unanalyzed) == 1 else "libraries have")
            + f" no structure file ({names}{more}): their "
            f"frames are shown as library+offset; run `pystruct {unanalyzed[0][1]}` first for "
            "function names, loops and lines (docs/pystruct.md)"
        )
    # Python sources' structure (pystruct): loops for the logical frames of those files.
    sources = {
        stanza.file
        for stanzas in classifiers.logical.values()
        for stanza in stanzas.values()
        if stanza.file
    }
    for number, index in [*enumerate(explicit), *((-1, index) for index in found)]:
        if index.path.endswith(PYTHON_SUFFIXES) and index.path in sources:
            classifiers.python_loops.setdefault(index.path, PythonLoops(index.module))
            used_explicit.add(number)
    for number, index in enumerate(explicit):
        if number not in used_explicit:
            problems.append(
                f"structure file for {index.path} was not used: no profile has frames in it "
                "(a structure file for another binary?)"
            )
    return classifiers


def named_sources(classifiers: ModuleClassifiers) -> frozenset[str]:
    """The source files the structures of native binaries name (``F`` scopes, ``f``
    attributes): those pyprof may copy without pyrun's loaded-sources table
    (:mod:`.sources`). Python sources' structure files vouch for nothing: pystruct writes
    them for whatever name a ``logical/`` file holds."""
    names: set[str] = set()
    for index in classifiers.structures.values():
        for scope in index.module.walk():
            if scope.tag == FILE:
                names.add(scope.name)
            elif scope.file:
                names.add(scope.file)
    return frozenset(names)


def captured_binary(module: str, measurement: Path) -> Path | None:
    """The copy in the measurement directory of a binary the profiles name, if there is one.

    hpcrun and pyrun copy GPU binaries and the vDSO into the measurement (``gpubins/``,
    ``vdso/``) and name them relative to it or by the absolute path they had when measured;
    both lead here (formats.md §1.4).
    """
    if _is_relative(module):
        path = measurement / module
    else:
        where = Path(module)
        path = measurement / where.parent.name / where.name
        if where.parent.name not in CAPTURED_DIRECTORIES:
            return None
    return path if path.is_file() else None


CAPTURED_DIRECTORIES = ("gpubins", "vdso", "cpubins", "ptxbins")


def captured_gpu(module: str) -> bool:
    """Whether ``module`` names a GPU binary captured in a measurement (``gpubins/``)."""
    return Path(module).parent.name == "gpubins"


PTX_SUFFIX = ".ptx"


def ptx_structure(path: Path, module: str, problems: list[str]) -> StructureIndex | None:
    """The structure of a captured PTX module (kernels, inlined code, loops, lines)."""
    from pyhpctk.structure.ptx import analyze_ptx

    try:
        indexes = index_structure(analyze_ptx(path, module))
    except PyhpctkError as error:
        problems.append(f"{error}; its counts stay at their PTX addresses")
        return None
    return indexes[0] if indexes else None


def line_map_structure(
    path: Path, module: str, addresses: Collection[int] | None = None
) -> StructureIndex | None:
    """Functions and lines of a captured binary from its DWARF line map, or None without one.

    pystruct's own analysis (``--gpucfg no``), so the contexts are those ``pystruct`` would give;
    a cubin's functions come from its symbols even without line information, and only those
    that hold one of ``addresses`` (the offsets the profiles name) have their lines read.
    """
    try:
        from pyhpctk.structure.cubin import analyze_cubin
        from pyhpctk.structure.driver import StructOptions, analyze_target
        from pyhpctk.structure.dwarf import read_debug_info
        from pyhpctk.structure.elfimage import open_image

        image = open_image(path)
        if image.is_cuda:
            structure = analyze_cubin(image, module, addresses=addresses)
        elif not read_debug_info(image).has_lines:
            return None
        else:
            structure = analyze_target(path, StructOptions(gpucfg=False), lm_name=module)
    except (ImportError, PyhpctkError, OSError):
        return None
    indexes = index_structure(structure)
    return indexes[0] if indexes else None


def _read_logical(path: Path) -> dict[int, LogicalFunction] | None:
    """The stanzas of a logical metadata file (formats.md §1.10), via formats.logical."""
    from pyhpctk.formats import logical

    try:
        metadata = logical.read(path)
    except (PyhpctkError, OSError):
        return None
    return {
        fid: LogicalFunction(
            name=stanza.funcname or None, file=stanza.filename or None, line=stanza.lineno
        )
        for fid, stanza in metadata.by_fid().items()
    }


__all__ = [
    "CAPTURED_DIRECTORIES",
    "build_classifiers",
    "captured_binary",
    "captured_gpu",
    "line_map_structure",
    "load_structures",
    "named_sources",
    "structure_binary",
]

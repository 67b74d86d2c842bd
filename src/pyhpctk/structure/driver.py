"""pystruct's library entry points: one target, or every target of a measurement directory.

A target is an ELF binary or shared library (:mod:`~pyhpctk.structure.host`), a CUDA cubin
(:mod:`~pyhpctk.structure.cubin`), a Python source file (``python_source``), or a measurement
directory. In a measurement directory every load module the profiles mark for analysis, every
captured ``gpubins/*.gpubin`` and every Python source named by ``logical/python.*`` is analyzed
into ``structs/`` under hpcstruct's names (``<basename>.hpcstruct``,
``<hash>.gpubin-gpucfg-yes.hpcstruct``), except that targets sharing a basename (the
``__init__.py`` of every package) each get their own file (:func:`output_names`): pyprof finds
a structure file by the load module it names inside, never by its file name. Unchanged targets
are skipped: a manifest in
``structs/`` and an optional shared ``--cache`` directory are keyed by the target's content hash.
One failing target never stops the others; failures are reported together at the end.

Native libraries (issue #17): a load module is analyzed when the profiles mark it for analysis
or name addresses in it (their ``(lm, offset)`` nodes). A binary with more than
:data:`FULL_ANALYSIS_MAX_CODE` (64 KiB) of machine code is analyzed only in the procedures
holding those addresses, with symbols for the rest (:mod:`pyhpctk.structure.sampled`;
``--functions``).
Load modules that are no file here, no ELF, or pseudo-modules are skipped with a note.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from pyhpctk.errors import FormatError, PyhpctkError, UsageError
from pyhpctk.formats.elf_identity import identify
from pyhpctk.formats.hpcrun_constants import LM_FLAG_ANALYZE
from pyhpctk.formats.hpcstruct_model import StructureFile
from pyhpctk.formats.inspect import misplaced_input
from pyhpctk.formats.output import OutputError, already_exists, write_bytes
from pyhpctk.formats.whole import open_regular
from pyhpctk.structure import cache as struct_cache
from pyhpctk.structure.debug_symbols import debug_file
from pyhpctk.structure.elfimage import SHF_EXECINSTR, open_image
from pyhpctk.structure.elfimage import sniff as sniff_elf

MANIFEST = ".pystruct-manifest.json"
# A binary with more machine code than this is analyzed in its sampled procedures only, in a
# measurement directory (--functions auto): about 0.1 s of full analysis here. A scientific
# stack loads dozens of libraries of 0.1 to 2 MB whose profiles name two or three addresses
# (docs/pystruct.md: 5 s of libstdc++ for 2 of them).
FULL_ANALYSIS_MAX_CODE = 64 << 10
FUNCTIONS_CHOICES = ("auto", "all", "sampled")


class TargetsFailed(PyhpctkError):
    """Some targets of a measurement directory could not be analyzed (the others were)."""

    exit_code = 4


@dataclass(frozen=True, slots=True)
class StructOptions:
    """What the command line asks for."""

    jobs: int | None = 1  # None: the CPUs this process may use, for enough targets (auto_jobs)
    gpucfg: bool = False
    cache: Path | None = None
    nvdisasm: str | None = None
    resolve_paths: bool = True
    force: bool = False  # replace an existing single-target output (structs/ is always refreshed)
    functions: str = "auto"  # measurement directories: "all", "sampled", or by code size

    def __post_init__(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"-j must be at least 1, not {self.jobs}")
        if self.functions not in FUNCTIONS_CHOICES:
            raise UsageError(f"--functions must be one of {', '.join(FUNCTIONS_CHOICES)}")


@dataclass(frozen=True, slots=True)
class Target:
    """One file to analyze: where it is, the ``LM n`` to record, and the output file name."""

    source: Path
    lm_name: str
    output_name: str
    kind: str  # "elf", "cubin" or "python"
    addresses: tuple[int, ...] = ()  # the offsets the profiles name in it, sorted


@dataclass(slots=True)
class TargetResult:
    """What happened to one target."""

    target: Target
    status: str  # "written", "unchanged", "cached", "failed", "missing", "skipped"
    output: Path | None = None
    message: str = ""
    fatal: bool = False  # the file system refused the output (full): the others would fail too


@dataclass(slots=True)
class MeasurementReport:
    """The outcome of ``pystruct MEASUREMENTS``."""

    results: list[TargetResult] = field(default_factory=list)

    @property
    def failed(self) -> list[TargetResult]:
        return [r for r in self.results if r.status == "failed"]


def _python_structure(path: Path, lm_name: str) -> StructureFile:
    """Structure of a Python source (:mod:`pyhpctk.structure.python_source`), named ``lm_name``."""
    from pyhpctk.structure.python_source import recover_structure

    try:
        source = path.read_bytes()
    except OSError as error:
        raise FormatError(path, "file", error.strerror or str(error)) from None
    return recover_structure(lm_name, source)


def classify(path: Path) -> str:
    """ "elf", "cubin", "ptx", "python" or "measurements"; FormatError for anything else."""
    if path.is_dir():
        return "measurements"
    if not path.exists():
        raise FormatError(path, "file", "no such file or directory")
    with open_regular(path) as stream:  # a FIFO or a device is refused, never waited on
        if path.suffix == ".py":
            return "python"
        if path.suffix == ".ptx":  # pyrun's ptxbins/ (issue #34): structure/ptx.py
            return "ptx"
        try:
            head = stream.read(64)
        except OSError as error:
            raise FormatError(path, "file", error.strerror or str(error)) from None
    if sniff_elf(head):
        # e_machine 190 is EM_CUDA (little-endian u16 at offset 18).
        return "cubin" if len(head) >= 20 and head[18:20] == b"\xbe\x00" else "elf"
    problem = "not an ELF binary, cubin, Python source or measurement directory"
    advice = misplaced_input(path)  # another tool's file: say which tool reads it
    raise FormatError(path, "file", f"{problem}: {advice}" if advice else problem)


def analyze_target(
    path: str | os.PathLike[str],
    options: StructOptions | None = None,
    lm_name: str | None = None,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> StructureFile:
    """The structure of one ELF binary, cubin or Python source.

    ``total`` learns the number of procedures to analyze, ``progress`` counts those done.
    """
    options = options or StructOptions()
    target = Path(path)
    kind = classify(target)
    name = lm_name or os.path.abspath(target)
    if kind == "measurements":
        raise UsageError(f"{target}: is a measurement directory; use struct_measurements")
    if kind == "python":
        return _python_structure(target, name)
    if kind == "ptx":
        from pyhpctk.structure.ptx import analyze_ptx

        return analyze_ptx(target, name)
    image = open_image(target)
    if image.is_cuda:
        from pyhpctk.structure.cubin import analyze_cubin

        return analyze_cubin(
            image, name, options.gpucfg, options.nvdisasm, progress, options.resolve_paths, total
        )
    from pyhpctk.structure.host import analyze_host

    return analyze_host(
        image,
        name,
        jobs=options.jobs or 1,
        progress=progress,
        resolve_paths=options.resolve_paths,
        total=total,
    )


def write_structure(
    structure: StructureFile,
    output: str | os.PathLike[str],
    force: bool = True,
    in_input: bool = False,
) -> Path:
    """Write hpcstruct XML (through the shared hpcstruct writer) whole or not at all.

    The file is written under a temporary name and renamed (:mod:`pyhpctk.formats.output`); an
    existing file is replaced only with ``force``. ``in_input``: the output lies in a directory
    that came with the input (``MEAS/structs``), so a FIFO or device there is replaced like a
    file, never opened.
    """
    from pyhpctk.formats import hpcstruct

    out = Path(output)
    data = hpcstruct.to_bytes(structure)  # an unwritable attribute fails before any file exists
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a parent is a file, or not writable: name the culprit
        culprit = error.filename
        where = f" ({culprit})" if culprit not in (None, os.fspath(out)) else ""
        reason = error.strerror or str(error)
        raise OutputError(f"{out}: cannot write: {reason}{where}", error.errno) from None
    write_bytes(out, data, force, "-o", streams=not in_input)
    return out


def default_output(path: Path, options: StructOptions) -> Path:
    """hpcstruct's default output name: ``<basename>.hpcstruct`` in the current directory
    (shortened where that is too long a name: :func:`fitting_name`)."""
    return Path(fitting_name(path.name, ".hpcstruct", path.name))


NAME_MAX = 255
"""The longest name of one directory entry, in bytes (Linux, every common file system)."""


def fitting_name(stem: str, suffix: str, identity: str) -> str:
    """``stem + suffix``, or where that is over :data:`NAME_MAX` bytes, as much of ``stem`` as
    fits (whole characters) then ``-`` and 16 hex digits of the sha256 of ``identity``: names
    of different identities stay apart, and the same identity always gets the same name."""
    name = stem + suffix
    if len(os.fsencode(name)) <= NAME_MAX:
        return name
    digest = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    room = NAME_MAX - len(os.fsencode(suffix)) - len(digest) - 1
    kept = []
    for character in stem:
        room -= len(os.fsencode(character))
        if room < 0:
            break
        kept.append(character)
    return f"{''.join(kept)}-{digest}{suffix}"


def _refuse_clobber(target: Path, out: Path, force: bool) -> None:
    """Refuse an ``-o`` that would overwrite the target itself or a file that is not hpcstruct,
    and, unless ``force``, any existing file.

    hpcstruct replaces its output file silently; pystruct replaces an existing structure file
    (or an empty file) only with ``--force``, and never the target itself
    (``pystruct app.py -o app.py`` would destroy the source it was asked to read) or a file
    that is not a structure file.
    """
    from pyhpctk.formats import hpcstruct

    if not out.is_file():
        if os.path.lexists(out) and not out.is_dir() and not force:
            raise already_exists(out, "-o")  # a dangling link, a FIFO, a device
        return  # absent (written), or a directory (write_structure reports it)
    if target.exists() and os.path.samefile(target, out):
        raise UsageError(f"{out}: is TARGET itself; give -o another file")
    try:
        with out.open("rb") as stream:
            head = stream.read(64)
    except OSError as error:
        raise UsageError(f"{out}: cannot read: {error.strerror or error}") from None
    if head and not hpcstruct.sniff(head):
        raise UsageError(f"{out}: exists and is not an hpcstruct file; not overwriting it")
    if not force:
        raise already_exists(out, "-o")


def struct_target(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    options: StructOptions | None = None,
    progress: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> Path:
    """Analyze one file and write its structure file; the output path is returned."""
    options = options or StructOptions()
    target = Path(path)
    out = Path(output) if output is not None else default_output(target, options)
    _refuse_clobber(target, out, options.force)
    kind = classify(target)
    if options.cache is not None and kind != "measurements":
        named = os.path.abspath(target) if kind == "python" else None
        key = content_key(target, options, named)
        cached = _cache_lookup(options.cache, key, os.path.abspath(target))
        if cached is not None:
            return write_structure(cached, out, options.force)
        structure = analyze_target(target, options, progress=progress, total=total)
        _cache_store(options.cache, key, structure)
        return write_structure(structure, out, options.force)
    structure = analyze_target(target, options, progress=progress, total=total)
    return write_structure(structure, out, options.force)


# --------------------------------------------------------------------------- caching


def content_key(path: Path, options: StructOptions, python_name: str | None = None) -> str:
    """sha256 of the file's bytes plus everything that changes the analysis. A Python
    source's structure names it (``python_name``, as the profiles do, in ``F`` and ``L`` as
    well as ``LM``) and follows the parsing interpreter's grammar and code objects."""
    extra = ""
    if python_name is not None:
        extra = f";python={sys.version_info[0]}.{sys.version_info[1]};name={python_name}"
    else:
        extra = separate_debug_key(path)
    return struct_cache.content_key(path, options.gpucfg, options.resolve_paths, extra)


def separate_debug_key(path: Path) -> str:
    """Which separate debug file names a binary's functions (:mod:`.debug_symbols`): a debug
    package installed after a binary was analyzed changes its names, so its cache entry."""
    identity = identify(str(path))
    found = debug_file(identity.build_id) if identity is not None else None
    if found is None:
        return ""
    info = os.stat(found)
    return f";debug={found}:{info.st_size}:{info.st_mtime_ns}"


def _cache_lookup(cache: Path, key: str, lm_name: str) -> StructureFile | None:
    return struct_cache.lookup(cache, key, lm_name)


def _cache_store(cache: Path, key: str, structure: StructureFile) -> None:
    struct_cache.store(cache, key, structure)


def code_size(path: Path) -> int:
    """Bytes of machine code (executable sections) of an ELF file; 0 if it cannot be read."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with path.open("rb") as stream:
            return sum(
                int(section["sh_size"])
                for section in ELFFile(stream).iter_sections()
                if int(section["sh_flags"]) & SHF_EXECINSTR and section["sh_type"] != "SHT_NOBITS"
            )
    except (OSError, ELFError, ValueError, KeyError, AttributeError):
        return 0


def analyzes_sampled(target: Target, options: StructOptions) -> bool:
    """Whether a target of a measurement directory is analyzed in its sampled procedures only.

    A cubin only without ``--gpucfg``: the GPU call graph needs the call sites of callers no
    sample reached."""
    if target.kind not in ("elf", "cubin") or options.functions == "all":
        return False
    if target.kind == "cubin" and options.gpucfg:
        return False
    return options.functions == "sampled" or code_size(target.source) > FULL_ANALYSIS_MAX_CODE


# --------------------------------------------------------------------------- measurements


def _original_path(measdir: Path) -> str | None:
    marker = measdir / "original-path"
    if marker.is_file():
        text = marker.read_text(errors="replace").strip()
        return text or None
    return None


def _locate(path: str, measdir: Path, original: str | None) -> Path:
    """Where a load-map path is now: relative to the directory, or moved with it."""
    if not os.path.isabs(path):
        return measdir / path
    if original and (path == original or path.startswith(original.rstrip("/") + "/")):
        return measdir / os.path.relpath(path, original)
    return Path(path)


@dataclass(slots=True)
class Inventory:
    """What a measurement directory references: targets, paths not found, modules skipped."""

    targets: list[Target] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def _is_elf(path: Path) -> bool:
    try:
        with open_regular(path) as stream:
            return sniff_elf(stream.read(64))
    except (OSError, PyhpctkError):
        return False


def _sampled_offsets(profiles: Sequence[object]) -> dict[str, set[int]]:
    """Load-map path → the offsets the profiles' ``(lm, offset)`` nodes name in it."""
    import numpy as np

    from pyhpctk.formats.hpcrun_model import HpcrunProfile

    found: dict[str, set[int]] = {}
    for profile in profiles:
        assert isinstance(profile, HpcrunProfile)
        paths = {module.id: module.path for module in profile.load_modules}
        lm_ids = profile.cct["lm_id"].astype(np.int64)
        offsets = profile.cct["lm_ip"].astype(np.uint64)
        for lm_id in np.unique(lm_ids).tolist():
            path = paths.get(int(lm_id))
            if path is not None:
                chosen = offsets[lm_ids == lm_id].tolist()
                found.setdefault(path, set()).update(int(a) for a in chosen)
    return found


def measurement_inventory(measdir: str | os.PathLike[str]) -> Inventory:
    """Every target a measurement directory references, with the addresses sampled in each."""
    from pyhpctk.formats import hpcrun, logical

    root = Path(measdir)
    original = _original_path(root)
    targets: dict[str, Target] = {}
    inventory = Inventory()
    python_files: set[str] = set()
    profiles = [hpcrun.read(path) for path in sorted(root.glob("*.hpcrun"))]
    sampled = _sampled_offsets(profiles)
    for profile in profiles:
        for module in profile.load_modules:
            where = _locate(module.path, root, original)
            if module.path.startswith("logical/") or "/logical/python." in module.path:
                try:
                    meta = logical.read(where)
                except PyhpctkError:
                    continue
                python_files.update(s.filename for s in meta.stanzas if s.filename)
                continue
            used = module.flags & LM_FLAG_ANALYZE or module.path in sampled
            if not used and where.suffix not in (".gpubin", ".ptx"):
                continue
            key = str(where)
            if key in targets or any(path == module.path for path, _ in inventory.skipped):
                continue
            if module.path.startswith(("<", "[")):
                inventory.skipped.append((module.path, "a pseudo-module, not a file"))
                continue
            if not where.is_file():
                if module.path not in inventory.missing:
                    inventory.missing.append(module.path)
                continue
            is_gpubin = where.suffix == ".gpubin"
            is_ptx = where.suffix == ".ptx"  # pyrun's ptxbins/ (counted kernels, issue #34)
            if not is_gpubin and not is_ptx and not _is_elf(where):
                inventory.skipped.append((module.path, "not an ELF binary"))
                continue
            offsets = tuple(sorted(sampled.get(module.path, ())))
            kind = "ptx" if is_ptx else "cubin" if is_gpubin else "elf"
            targets[key] = Target(where, module.path, where.name, kind, offsets)
    for gpubin in sorted((root / "gpubins").glob("*.gpubin")):
        key = str(gpubin)
        if key not in targets:
            targets[key] = Target(gpubin, str(gpubin.resolve()), gpubin.name, "cubin")
    for source in sorted(python_files):
        where = Path(source)
        if where.is_file() and where.suffix == ".py":
            targets.setdefault(str(where), Target(where, source, where.name, "python"))
        elif source not in inventory.missing and not source.startswith("<"):
            inventory.missing.append(source)
    inventory.targets = list(targets.values())
    return inventory


def measurement_targets(measdir: str | os.PathLike[str]) -> tuple[list[Target], list[str]]:
    """Every target a measurement directory references, and the load-map paths not found."""
    inventory = measurement_inventory(measdir)
    return inventory.targets, inventory.missing


def _output_name(target: Target, options: StructOptions, tag: str = "") -> str:
    name = f"{target.output_name}-{tag}" if tag else target.output_name
    suffix = ".hpcstruct"
    if target.kind == "cubin" and target.source.suffix == ".gpubin":
        suffix = f"-gpucfg-{'yes' if options.gpucfg else 'no'}.hpcstruct"
    return fitting_name(name, suffix, target.lm_name)


def output_names(targets: Sequence[Target], options: StructOptions) -> dict[Target, str]:
    """The file in ``structs/`` each target's structure goes to; no two targets share one.

    hpcstruct names a structure file after its binary's basename, so two binaries of one name
    would overwrite each other; so would the ``__init__.py`` of every package a Python program
    imports (issue #21, item 4: 84 of 300 structure files were lost, and their loops with
    them). A basename that only one target has keeps hpcstruct's name; targets that share one
    are told apart by a digest of the path the profiles name: ``__init__.py-3f2a9c1e.hpcstruct``.
    """
    plain = {target: _output_name(target, options) for target in targets}
    shared = {name for name, count in Counter(plain.values()).items() if count > 1}
    names = {target: name for target, name in plain.items() if name not in shared}
    taken = set(names.values())
    for target in sorted((t for t in targets if plain[t] in shared), key=lambda t: t.lm_name):
        digest = hashlib.sha256(target.lm_name.encode("utf-8", "surrogateescape")).hexdigest()
        name = _output_name(target, options, digest[:8])
        if name in taken:  # two paths whose digests begin alike: the whole digest tells them apart
            name = _output_name(target, options, digest)
        names[target] = name
        taken.add(name)
    return names


def _forget_replaced(out_dir: Path, manifest: dict[str, str], names: dict[Target, str]) -> None:
    """Remove the files an earlier run wrote for a target that now has another name.

    A basename that became shared (``--append`` added a second package's ``__init__.py``)
    moves its first target to a digest name; the old file would describe the same load module
    twice. Only files the manifest lists (pystruct's own) are considered, and only those whose
    ``LM n`` is a target of this run: a binary missing on this machine keeps its file.
    """
    from pyhpctk.formats import hpcstruct

    current = set(names.values())
    modules = {target.lm_name for target in names}
    for name in sorted(set(manifest) - current):
        old = out_dir / name
        try:
            described = {lm.name for lm in hpcstruct.read(old).modules}
        except (PyhpctkError, OSError):
            continue
        if described and described <= modules:
            with contextlib.suppress(OSError):
                old.unlink()
            manifest.pop(name, None)


def _sampled_structure(
    target: Target, options: StructOptions, key: str, jobs: int
) -> tuple[str, StructureFile, str]:
    """(status, structure, note) of a large binary analyzed in its sampled procedures only.

    The cache serves it when its entry covers the target's addresses; otherwise the binary is
    analyzed for those and the ones cached before, and the entry replaced.
    """
    from pyhpctk.structure.sampled import analyze_sampled

    wanted = set(target.addresses)
    known: set[int] = set()
    if options.cache is not None:
        cached, known = struct_cache.lookup_sampled(options.cache, key, target.lm_name, wanted)
        if cached is not None:
            return "cached", cached, f"the cache covers its {len(wanted)} sampled addresses"
    every = wanted | known
    image = open_image(target.source)
    if image.is_cuda:
        from pyhpctk.structure.cubin import analyze_cubin
        from pyhpctk.structure.sampled import SampledStructure, holds_any

        structure = analyze_cubin(
            image, target.lm_name, resolve_paths=options.resolve_paths, addresses=every
        )
        ordered = sorted(every)
        held = sum(1 for function in image.functions if holds_any(function, ordered))
        result = SampledStructure(structure, held, len(image.functions))
    else:
        result = analyze_sampled(image, every, target.lm_name, jobs, None, options.resolve_paths)
    if options.cache is not None:
        struct_cache.store_sampled(options.cache, key, result.structure, every)
    note = (
        f"{result.analyzed} of {result.procedures} procedures analyzed, those holding its "
        f"{len(wanted)} sampled addresses; symbols for the rest"
    )
    return "written", result.structure, note


def _run_target(
    target: Target,
    out: Path,
    options: StructOptions,
    key: str,
    sampled: bool = False,
    jobs: int = 1,
) -> TargetResult:
    """Analyze one target and write it; errors become a failed result, never an exception.

    ``sampled``: analyze only the procedures holding the target's addresses (a large binary).
    """
    try:
        if sampled:
            status, sampled_structure, note = _sampled_structure(target, options, key, jobs)
            write_structure(sampled_structure, out, in_input=True)
            return TargetResult(target, status, out, note)
        # Python sources too: a library's are read again by every program that imports it
        # (scikit-learn's 285 take 3 s to parse; reading them back, a tenth of that).
        if options.cache is not None:
            cached = _cache_lookup(options.cache, key, target.lm_name)
            if cached is not None:
                write_structure(cached, out, in_input=True)
                return TargetResult(target, "cached", out)
        inner = StructOptions(jobs, options.gpucfg, None, options.nvdisasm, options.resolve_paths)
        structure = analyze_target(target.source, inner, lm_name=target.lm_name)
        if options.cache is not None:
            _cache_store(options.cache, key, structure)
        write_structure(structure, out, in_input=True)
        return TargetResult(target, "written", out)
    except OutputError as error:
        return TargetResult(target, "failed", None, str(error), error.file_system_failed)
    except PyhpctkError as error:
        return TargetResult(target, "failed", None, str(error))
    except (OSError, RecursionError, MemoryError) as error:
        return TargetResult(target, "failed", None, f"{target.source}: {error!r}")


@dataclass(frozen=True, slots=True)
class _Job:
    """A target to analyze: its output, cache key, manifest stamp and mode."""

    target: Target
    out: Path
    key: str
    stamp: str  # the manifest's record: the key, plus the sampled addresses' digest if sampled
    sampled: bool


AUTO_JOBS_MAX = 8  # -j by default: at most this many workers
AUTO_JOBS_TARGETS = 100  # ... and one per this many targets (a pool costs forks and pickles)


def auto_jobs(targets: int) -> int:
    """Workers for ``targets`` targets when ``-j`` is not given: the CPUs this process may
    use, at most :data:`AUTO_JOBS_MAX` and one per :data:`AUTO_JOBS_TARGETS` targets (a
    scientific stack's measurement names 300 sources and libraries, a test's 40)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, AUTO_JOBS_MAX, targets // AUTO_JOBS_TARGETS))


def _cost(job: _Job) -> int:
    """A job's expected cost, for handing the long ones out first: its file size, a Python
    source's counted ten times (about ten times the work per byte of a library's sampled
    analysis, on a scikit-learn measurement)."""
    try:
        size = job.target.source.stat().st_size
    except OSError:
        return 0
    return size * 10 if job.target.kind == "python" else size


def _run_jobs(
    jobs: Sequence[_Job],
    options: StructOptions,
    progress: Callable[[int], None] | None,
    starting: Callable[[Target], None] | None,
) -> list[TargetResult]:
    """Run the jobs, over forked workers with ``-j`` and several jobs; stop on a full disk."""
    results: list[TargetResult] = []
    wanted = options.jobs if options.jobs is not None else auto_jobs(len(jobs))
    if wanted > 1 and len(jobs) > 1 and "fork" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("fork")
        # Never more workers than targets: with fork every worker is started up front.
        workers = min(wanted, len(jobs))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [
                pool.submit(_run_target, j.target, j.out, options, j.key, j.sampled)
                for j in sorted(jobs, key=_cost, reverse=True)
            ]
            for future in as_completed(futures):
                results.append(future.result())
                if progress is not None:
                    progress(1)
                if results[-1].fatal:
                    pool.shutdown(cancel_futures=True)
                    break
        return results
    for job in jobs:
        if starting is not None:
            starting(job.target)
        # One target at a time: -j goes to the functions of a large binary instead.
        results.append(_run_target(job.target, job.out, options, job.key, job.sampled, wanted))
        if progress is not None:
            progress(1)
        if results[-1].fatal:
            break
    return results


def _notes(inventory: Inventory) -> list[TargetResult]:
    """One result per load module not found here or skipped, each with its one-line note."""
    notes = [
        TargetResult(
            Target(Path(name), name, Path(name).name, "elf"),
            "missing",
            message=f"{name}: not found on this machine",
        )
        for name in inventory.missing
    ]
    notes += [
        TargetResult(
            Target(Path(name), name, Path(name).name, "elf"), "skipped", message=f"{name}: {why}"
        )
        for name, why in inventory.skipped
    ]
    return notes


def struct_measurements(
    measdir: str | os.PathLike[str],
    options: StructOptions | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[int], None] | None = None,
    targets: Sequence[Target] | None = None,
    starting: Callable[[Target], None] | None = None,
) -> MeasurementReport:
    """Analyze every target of a measurement directory into ``structs/`` (or ``output_dir``).

    ``starting`` is told each target as its analysis begins (serial runs), ``progress`` counts
    the targets done.
    """
    options = options or StructOptions()
    root = Path(measdir)
    if not root.is_dir():
        raise FormatError(root, "measurement directory", "not a directory")
    if not any(root.glob("*.hpcrun")) and not any(root.glob("gpubins/*.gpubin")):
        if (root / "meta.db").is_file():
            raise FormatError(
                root,
                "measurement directory",
                "a database, not measurements: run pystruct on the directory pyrun or hpcrun wrote",
            )
        raise FormatError(root, "measurement directory", "no .hpcrun profiles and no gpubins/")
    inventory = measurement_inventory(root)
    found = inventory.targets
    work = list(targets) if targets is not None else found
    names = output_names([*found, *(t for t in work if t not in found)], options)
    out_dir = Path(output_dir) if output_dir is not None else root / "structs"
    if output_dir is None and out_dir.is_symlink():
        raise UsageError(
            f"{out_dir}: is a symbolic link (to {os.readlink(out_dir)}); pystruct writes only "
            "into a real MEAS/structs directory: remove the link or give -o DIR"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(
            f"{out_dir}: cannot make the structure directory: {error.strerror or error}"
        ) from None
    manifest_path = out_dir / MANIFEST
    try:
        manifest: dict[str, str] = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    report = MeasurementReport(_notes(inventory))
    pending: list[_Job] = []
    for target in work:
        out = out_dir / names[target]
        try:
            named = target.lm_name if target.kind == "python" else None
            key = content_key(target.source, options, named)
        except OSError as error:
            report.results.append(TargetResult(target, "failed", None, f"{target.source}: {error}"))
            continue
        sampled = analyzes_sampled(target, options)
        stamp = f"{key}/{struct_cache.addresses_digest(target.addresses)}" if sampled else key
        if manifest.get(out.name) == stamp and out.is_file():
            report.results.append(TargetResult(target, "unchanged", out))
            if progress is not None:
                progress(1)
            continue
        pending.append(_Job(target, out, key, stamp, sampled))
    results = _run_jobs(pending, options, progress, starting)
    stamps = {job.out.name: job.stamp for job in pending}
    for result in results:
        if result.status in ("written", "cached") and result.output is not None:
            manifest[result.output.name] = stamps[result.output.name]
        elif result.output is None:
            manifest.pop(names[result.target], None)
    _forget_replaced(out_dir, manifest, names)
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    with contextlib.suppress(OutputError):  # without a manifest the next run redoes the work
        write_bytes(manifest_path, text.encode(), True, streams=False)
    fatal = next((r for r in results if r.fatal), None)
    if fatal is not None:  # a full disk: the remaining targets would fail alike
        raise OutputError(fatal.message)
    results.sort(key=lambda r: str(r.target.source))
    report.results.extend(results)
    return report

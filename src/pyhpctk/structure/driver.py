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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from pyhpctk import __version__
from pyhpctk.errors import FormatError, PyhpctkError, UsageError
from pyhpctk.formats._whole import open_regular
from pyhpctk.formats.hpcrun_constants import LM_FLAG_ANALYZE
from pyhpctk.formats.hpcstruct_model import StructureFile
from pyhpctk.formats.inspect import misplaced_input
from pyhpctk.formats.output import OutputError, already_exists, write_bytes
from pyhpctk.structure.elfimage import open_image
from pyhpctk.structure.elfimage import sniff as sniff_elf

CACHE_FORMAT = "pystruct-1"
MANIFEST = ".pystruct-manifest.json"


class TargetsFailed(PyhpctkError):
    """Some targets of a measurement directory could not be analyzed (the others were)."""

    exit_code = 4


@dataclass(frozen=True, slots=True)
class StructOptions:
    """What the command line asks for."""

    jobs: int = 1
    gpucfg: bool = False
    cache: Path | None = None
    nvdisasm: str | None = None
    resolve_paths: bool = True
    force: bool = False  # replace an existing single-target output (structs/ is always refreshed)

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise UsageError(f"-j must be at least 1, not {self.jobs}")


@dataclass(frozen=True, slots=True)
class Target:
    """One file to analyze: where it is, the ``LM n`` to record, and the output file name."""

    source: Path
    lm_name: str
    output_name: str
    kind: str  # "elf", "cubin" or "python"


@dataclass(slots=True)
class TargetResult:
    """What happened to one target."""

    target: Target
    status: str  # "written", "unchanged", "cached", "failed", "missing"
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
    """ "elf", "cubin", "python" or "measurements"; FormatError for anything else."""
    if path.is_dir():
        return "measurements"
    if not path.exists():
        raise FormatError(path, "file", "no such file or directory")
    with open_regular(path) as stream:  # a FIFO or a device is refused, never waited on
        if path.suffix == ".py":
            return "python"
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
        jobs=options.jobs,
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
    """hpcstruct's default output name: ``<basename>.hpcstruct`` in the current directory."""
    return Path(path.name + ".hpcstruct")


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
    if options.cache is not None and classify(target) != "measurements":
        key = content_key(target, options)
        cached = _cache_lookup(options.cache, key, os.path.abspath(target))
        if cached is not None:
            return write_structure(cached, out, options.force)
        structure = analyze_target(target, options, progress=progress, total=total)
        _cache_store(options.cache, key, structure)
        return write_structure(structure, out, options.force)
    structure = analyze_target(target, options, progress=progress, total=total)
    return write_structure(structure, out, options.force)


# --------------------------------------------------------------------------- caching


def content_key(path: Path, options: StructOptions) -> str:
    """sha256 of the file's bytes plus everything that changes the analysis."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    variant = (
        f"{CACHE_FORMAT};{__version__};gpucfg={int(options.gpucfg)};"
        f"realpath={int(options.resolve_paths)}"
    )
    digest.update(variant.encode())
    return digest.hexdigest()


def _cache_lookup(cache: Path, key: str, lm_name: str) -> StructureFile | None:
    from pyhpctk.formats import hpcstruct

    entry = cache / f"{key}.hpcstruct"
    if not entry.is_file():
        return None
    try:
        structure = hpcstruct.read(entry)
    except PyhpctkError:
        return None  # a damaged cache entry is recomputed, never trusted
    for lm in structure.modules:
        lm.attrs["n"] = lm_name
    return structure


def _cache_store(cache: Path, key: str, structure: StructureFile) -> None:
    with contextlib.suppress(PyhpctkError):  # an unwritable cache only costs time
        write_structure(structure, cache / f"{key}.hpcstruct")


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


def measurement_targets(measdir: str | os.PathLike[str]) -> tuple[list[Target], list[str]]:
    """Every target a measurement directory references, and the load-map paths not found."""
    from pyhpctk.formats import hpcrun, logical

    root = Path(measdir)
    original = _original_path(root)
    targets: dict[str, Target] = {}
    missing: list[str] = []
    python_files: set[str] = set()
    for profile_path in sorted(root.glob("*.hpcrun")):
        profile = hpcrun.read(profile_path)
        for module in profile.load_modules:
            where = _locate(module.path, root, original)
            if module.path.startswith("logical/") or "/logical/python." in module.path:
                try:
                    meta = logical.read(where)
                except PyhpctkError:
                    continue
                python_files.update(s.filename for s in meta.stanzas if s.filename)
                continue
            if not module.flags & LM_FLAG_ANALYZE and where.suffix != ".gpubin":
                continue
            key = str(where)
            if key in targets:
                continue
            if not where.is_file():
                if module.path not in missing:
                    missing.append(module.path)
                continue
            is_gpubin = where.suffix == ".gpubin"
            targets[key] = Target(where, module.path, where.name, "cubin" if is_gpubin else "elf")
    for gpubin in sorted((root / "gpubins").glob("*.gpubin")):
        key = str(gpubin)
        if key not in targets:
            targets[key] = Target(gpubin, str(gpubin.resolve()), gpubin.name, "cubin")
    for source in sorted(python_files):
        where = Path(source)
        if where.is_file() and where.suffix == ".py":
            targets.setdefault(str(where), Target(where, source, where.name, "python"))
        elif source not in missing and not source.startswith("<"):
            missing.append(source)
    return list(targets.values()), missing


def _output_name(target: Target, options: StructOptions, tag: str = "") -> str:
    name = f"{target.output_name}-{tag}" if tag else target.output_name
    if target.kind == "cubin" and target.source.suffix == ".gpubin":
        return f"{name}-gpucfg-{'yes' if options.gpucfg else 'no'}.hpcstruct"
    return f"{name}.hpcstruct"


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


def _run_target(target: Target, out: Path, options: StructOptions, key: str) -> TargetResult:
    """Analyze one target and write it; errors become a failed result, never an exception."""
    try:
        structure = None
        if options.cache is not None:
            structure = _cache_lookup(options.cache, key, target.lm_name)
            if structure is not None:
                write_structure(structure, out, in_input=True)
                return TargetResult(target, "cached", out)
        inner = StructOptions(1, options.gpucfg, None, options.nvdisasm, options.resolve_paths)
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


def struct_measurements(
    measdir: str | os.PathLike[str],
    options: StructOptions | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[int], None] | None = None,
    targets: Sequence[Target] | None = None,
) -> MeasurementReport:
    """Analyze every target of a measurement directory into ``structs/`` (or ``output_dir``)."""
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
    found, missing = measurement_targets(root)
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
    report = MeasurementReport()
    for name in missing:
        report.results.append(
            TargetResult(
                Target(Path(name), name, Path(name).name, "elf"),
                "missing",
                message=f"{name}: not found on this machine",
            )
        )
    pending: list[tuple[Target, Path, str]] = []
    for target in work:
        out = out_dir / names[target]
        try:
            key = content_key(target.source, options)
        except OSError as error:
            report.results.append(TargetResult(target, "failed", None, f"{target.source}: {error}"))
            continue
        if manifest.get(out.name) == key and out.is_file():
            report.results.append(TargetResult(target, "unchanged", out))
            if progress is not None:
                progress(1)
            continue
        pending.append((target, out, key))
    results: list[TargetResult] = []
    if options.jobs > 1 and len(pending) > 1 and "fork" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("fork")
        # Never more workers than targets: with fork every worker is started up front.
        workers = min(options.jobs, len(pending))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(_run_target, t, o, options, k) for t, o, k in pending]
            for future in as_completed(futures):
                results.append(future.result())
                if progress is not None:
                    progress(1)
                if results[-1].fatal:
                    pool.shutdown(cancel_futures=True)
                    break
    else:
        for t, o, k in pending:
            results.append(_run_target(t, o, options, k))
            if progress is not None:
                progress(1)
            if results[-1].fatal:
                break
    keys = {o.name: k for _, o, k in pending}
    for result in results:
        if result.status in ("written", "cached") and result.output is not None:
            manifest[result.output.name] = keys[result.output.name]
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

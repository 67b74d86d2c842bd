"""Helpers of the output tests (issue #15): a measurement naming given sources, a disk to fill
(the ``small_disk`` fixture of conftest.py mounts it), the files below a directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from pyhpctk.formats import hpcrun, logical, sources
from pyhpctk.formats.hpcrun_model import (
    CCT_NODE_DTYPE,
    ID_TUPLE_ELEMENT_DTYPE,
    INTERP_LOGIC_LOCAL,
    INTERP_LOGIC_ONLY,
    KIND_NODE,
    KIND_THREAD,
    METRIC_VALUE_DTYPE,
    NODE_START_DTYPE,
    HpcrunProfile,
    LoadModule,
    MetricDescriptor,
    placeholder_ip,
)


def python_measurement(
    directory: Path, scripts: list[str], program: str = "python3", loaded: bool = True
) -> Path:
    """One thread that spent 1 s at line 3 of each script (in this order): module-level code.

    ``loaded``: pyrun's loaded-sources table lists the scripts that are files, with their hash
    (pyprof copies only those)."""
    (directory / "logical").mkdir(parents=True)
    if loaded:
        record_loaded(directory, scripts)
    logical.write(
        logical.LogicalMetadata(
            [logical.LogicalStanza(i + 1, "", filename=s, lineno=1) for i, s in enumerate(scripts)]
        ),
        directory / "logical" / "python.0000abcd",
    )
    nodes = [(12, 0, 0, placeholder_ip("^Primary"), 1), (14, 12, 0, placeholder_ip("| Main  "), 1)]
    nodes += [(16 + 2 * i, 14, 1, (i + 1) << 32 | 3, 1) for i in range(len(scripts))]
    values = np.zeros(len(scripts), dtype=METRIC_VALUE_DTYPE)
    values["value_bits"] = np.ones(len(scripts), dtype=np.float64).view(np.uint64)
    starts = np.zeros(len(scripts), dtype=NODE_START_DTYPE)
    starts["node_id"] = [16 + 2 * i for i in range(len(scripts))]
    starts["start"] = np.arange(len(scripts))
    profile = HpcrunProfile(
        nvpairs=[("program-name", program), ("thread-id", "0")],
        load_modules=[LoadModule(1, "logical/python.0000abcd")],
        cct=np.array(nodes, dtype=CCT_NODE_DTYPE),
        metrics=[MetricDescriptor("CPUTIME (sec)", "CPUTIME (sec)")],
        id_tuple=np.array(
            [
                (KIND_NODE | INTERP_LOGIC_LOCAL << 14, 0xABC, 0),
                (KIND_THREAD | INTERP_LOGIC_ONLY << 14, 0, 0),
            ],
            dtype=ID_TUPLE_ELEMENT_DTYPE,
        ),
        values=values,
        node_starts=starts,
    )
    hpcrun.write(profile, directory / "python3-000000-000-00000abc-1-0.hpcrun")
    return directory


def record_loaded(directory: Path, scripts: list[str]) -> None:
    """Write a loaded-sources table listing those of ``scripts`` that are regular files."""
    entries = [
        sources.LoadedSource(hashlib.sha256(Path(s).read_bytes()).hexdigest(), s)
        for s in scripts
        if os.path.isfile(s)
    ]
    (directory / "sources").mkdir(exist_ok=True)
    sources.write(sources.LoadedSources(entries), directory / "sources" / "1.0000abcd.txt")


def fill_disk(where: Path, leave: int) -> None:
    """Fill the file system of ``where`` until about ``leave`` bytes are free."""
    status = os.statvfs(where)
    free = status.f_bavail * status.f_frsize
    with open(where / "filler", "wb") as stream:
        stream.write(b"\0" * max(free - leave, 0))


def files_under(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (links as their target's text), by path relative to ``root``."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = os.readlink(path).encode()
        elif path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found

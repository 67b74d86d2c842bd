"""pystruct's cache of structure files, keyed by the content of the binary analyzed.

A binary or a Python source is analyzed once across measurements: ``pystruct MEAS`` keeps its
results in a shared directory (by default ``$PYHPCTK_CACHE_DIR/structs``, else
``$XDG_CACHE_HOME/pyhpctk/structs``, else ``~/.cache/pyhpctk/structs``; ``--cache DIR``
elsewhere, ``--no-cache`` none) under the sha256 of the binary's bytes plus
everything that changes the analysis (:func:`content_key`):

* ``KEY.hpcstruct``: the full analysis;
* ``KEY.sampled.json`` naming ``KEY.sampled-DIGEST.hpcstruct``: an analysis of the procedures
  holding the listed addresses only (:mod:`pyhpctk.structure.sampled`). A later request is
  served when its addresses are among those listed (or by the full entry); otherwise the
  binary is analyzed for the union, so the entry grows with the measurements that use it.

Entries are written whole under a temporary name and renamed (:mod:`pyhpctk.formats.output`),
the index after the file it names, so concurrent pystruct runs never read a partial entry. A
damaged or unreadable entry is recomputed, never trusted; an unwritable cache costs time only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from pyhpctk import __version__
from pyhpctk.errors import PyhpctkError
from pyhpctk.formats.hpcstruct_model import StructureFile
from pyhpctk.formats.output import write_bytes

# 2: stripped libraries named from debug files, Cython names; 3: Cython bodies of def 0
CACHE_FORMAT = "pystruct-3"


def default_cache_dir() -> Path:
    """``$PYHPCTK_CACHE_DIR/structs``, ``$XDG_CACHE_HOME/pyhpctk/structs`` or ``~/.cache/…``."""
    own = os.environ.get("PYHPCTK_CACHE_DIR")
    if own:
        return Path(own) / "structs"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pyhpctk" / "structs"


def content_key(path: Path, gpucfg: bool, resolve_paths: bool, extra: str = "") -> str:
    """sha256 of the file's bytes plus everything that changes the analysis (``extra``: what
    else does, such as a Python source's path and the interpreter that parses it)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    variant = f"{CACHE_FORMAT};{__version__};gpucfg={int(gpucfg)};realpath={int(resolve_paths)}"
    digest.update((variant + extra).encode())
    return digest.hexdigest()


def addresses_digest(addresses: Iterable[int]) -> str:
    """A short digest of a set of addresses (the manifest tells sampled analyses apart by it)."""
    text = ",".join(f"{a:x}" for a in sorted(set(addresses)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(entry: Path, lm_name: str) -> StructureFile | None:
    from pyhpctk.formats import hpcstruct

    if not entry.is_file():
        return None
    try:
        structure = hpcstruct.read(entry)
    except (PyhpctkError, OSError):
        return None  # a damaged cache entry is recomputed, never trusted
    for lm in structure.modules:
        lm.attrs["n"] = lm_name
    return structure


def _write(entry: Path, structure: StructureFile) -> bool:
    from pyhpctk.formats import hpcstruct

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(entry, hpcstruct.to_bytes(structure), True, streams=False)
    except (PyhpctkError, OSError):
        return False  # an unwritable cache only costs time
    return True


def lookup(cache: Path, key: str, lm_name: str) -> StructureFile | None:
    """The full analysis cached under ``key``, named ``lm_name``, or None."""
    return _read(cache / f"{key}.hpcstruct", lm_name)


def store(cache: Path, key: str, structure: StructureFile) -> None:
    """Keep a full analysis under ``key``."""
    _write(cache / f"{key}.hpcstruct", structure)


def _sampled_index(cache: Path, key: str) -> tuple[str, set[int]] | None:
    try:
        index = json.loads((cache / f"{key}.sampled.json").read_text())
        return str(index["file"]), {int(a) for a in index["addresses"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lookup_sampled(
    cache: Path, key: str, lm_name: str, addresses: Iterable[int]
) -> tuple[StructureFile | None, set[int]]:
    """A cached structure that covers ``addresses`` (or None), and the addresses cached so far.

    The full entry covers every address; a sampled entry those it lists.
    """
    full = lookup(cache, key, lm_name)
    if full is not None:
        return full, set()
    index = _sampled_index(cache, key)
    if index is None:
        return None, set()
    name, covered = index
    if not set(addresses) <= covered or "/" in name:
        return None, covered
    return _read(cache / name, lm_name), covered


def store_sampled(cache: Path, key: str, structure: StructureFile, addresses: set[int]) -> None:
    """Keep an analysis of the procedures holding ``addresses``, replacing the smaller one."""
    name = f"{key}.sampled-{addresses_digest(addresses)}.hpcstruct"
    previous = _sampled_index(cache, key)
    if not _write(cache / name, structure):
        return
    index = {"file": name, "addresses": sorted(addresses)}
    with contextlib.suppress(PyhpctkError, OSError):
        text = json.dumps(index, separators=(",", ":")) + "\n"
        write_bytes(cache / f"{key}.sampled.json", text.encode(), True, streams=False)
        if previous is not None and previous[0] != name and "/" not in previous[0]:
            (cache / previous[0]).unlink()

"""Readers and writers for every file format of the toolchain, exactly as HPCToolkit writes them.

One module per format (formats.md): :mod:`.hpcrun` and :mod:`.hpctrace` (measurements),
:mod:`.logical` (Python logical-frame metadata), :mod:`.metadb`, :mod:`.profiledb`, :mod:`.cctdb`,
:mod:`.tracedb` (the v4.0 database), :mod:`.threads`, :mod:`.sources` and :mod:`.modules`
(pyhpctk's side files of thread names, loaded sources and loaded native modules) and
:mod:`.hpcstruct` (structure XML). Each offers ``sniff``, ``read``, ``write``, ``to_bytes``,
``dump`` and ``verify``.

This package's entry points detect a file's format from its content (never from its name) by
asking each module in a fixed order, then delegate::

    obj = pyhpctk.formats.read("profile.db")
    pyhpctk.formats.write(obj, "copy.db")

This module must never do I/O beyond reading a file's first bytes to detect its format, and
must stay cheap to import: pyrun's code inside measured processes imports the stdlib-only
:mod:`.hpcrun_constants` and :mod:`.vocabulary` below it, so ``typing`` and ``importlib`` are
imported where they are needed.
"""

from __future__ import annotations

import os
from types import ModuleType

from pyhpctk.errors import FormatError

# Detection order: binary formats with fixed magics first, XML last (formats.md §1-4).
FORMAT_NAMES: tuple[str, ...] = (
    "hpcrun",
    "hpctrace",
    "logical",
    "metadb",
    "profiledb",
    "cctdb",
    "tracedb",
    "threads",
    "sources",
    "modules",
    "hpcstruct",
)
#: Formats known by their place, not their content (an xz stream or text has no magic of its
#: own): ``MEAS/kernel_symbols/vmlinux.HOSTID`` (:mod:`.kallsyms`). :func:`module` serves them,
#: :func:`detect` never names them (``pyhpctk verify`` and ``dump`` know them by directory).
PLACED_FORMAT_NAMES: tuple[str, ...] = ("kallsyms",)
SNIFF_BYTES = 64


def module(name: str) -> ModuleType:
    """The module implementing format ``name`` (of :data:`FORMAT_NAMES` or
    :data:`PLACED_FORMAT_NAMES`)."""
    if name not in FORMAT_NAMES + PLACED_FORMAT_NAMES:
        raise ValueError(f"unknown format {name!r}")
    import importlib

    return importlib.import_module(f"{__name__}.{name}")


def detect(head: bytes) -> str | None:
    """The name of the format whose magic ``head`` (a file's first bytes) carries, or None."""
    for name in FORMAT_NAMES:
        if module(name).sniff(head):
            return name
    return None


def detect_file(path: str | os.PathLike[str]) -> str:
    """The format of the file at ``path``; a FormatError when it is none we know."""
    from pyhpctk.formats.whole import open_regular  # imports typing: not at the top

    with open_regular(path) as stream:  # a FIFO or a device is refused, never waited on
        try:
            head = stream.read(SNIFF_BYTES)
        except OSError as error:
            raise FormatError(path, "file", error.strerror or str(error)) from None
    name = detect(head)
    if name is None:
        raise FormatError(path, "header", "not a file format pyhpctk knows (unrecognised magic)")
    return name


def read(path: str | os.PathLike[str]) -> object:
    """Read any supported file, detecting its format from its content."""
    return module(detect_file(path)).read(path)


def _model_type(name: str) -> type:
    import typing

    hints = typing.get_type_hints(module(name).read)
    model = hints["return"]
    assert isinstance(model, type)
    return model


def format_of(obj: object) -> str:
    """The name of the format whose model ``obj`` is an instance of."""
    for name in FORMAT_NAMES + PLACED_FORMAT_NAMES:
        if isinstance(obj, _model_type(name)):
            return name
    raise TypeError(f"{type(obj).__name__} is not a model of any pyhpctk file format")


def write(obj: object, path: str | os.PathLike[str]) -> None:
    """Write a model object returned by :func:`read` (or built by a tool) in its own format."""
    module(format_of(obj)).write(obj, path)

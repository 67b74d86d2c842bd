"""Helpers shared by the v4.0 database tests (profile.db, cct.db, trace.db): the reference
databases, hpctesttool's YAML dump, byte patches, the truncation and corruption sweeps, and files
written piece by piece as parallel writers do."""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from pyhpctk.errors import FormatError, FormatWarning

PlanT = TypeVar("PlanT")

# hpcprof's databases under reference/dbase/, each with profile.db, cct.db and trace.db.
DATABASES = [
    "small.d",
    "small.nostruct.d",
    "loops-cputime-t.d",
    "loops-cputime-t.nostruct.d",
    "loops-cuda-nvidia-t.d",
    "loops-cuda-nvidia-t.nostruct.d",
    "loops-cuda-nvidiapc-t.d",
    "loops-cuda-nvidiapc-t.nostruct.d",
]


def db_file(reference: Path, name: str, file: str) -> Path:
    """``file`` (``profile.db``, ``cct.db``, ...) of the reference database ``name``."""
    return reference / "dbase" / name / file


def yaml_blocks(text: str, section: str, end: str, item: str) -> list[dict[tuple[int, int], float]]:
    """Per item of one section of hpctesttool's YAML dump, ``{(outer, inner): value}``.

    An independent reader: the section runs from the tag ``section`` to the tag ``end``; each
    item starts with a ``- !item`` line, an outer key is a line indented by 8 (``12:``) and each
    value a line indented by 10 under it (``3: 1.5``).
    """
    body = text[text.index(section) : text.index(end)]
    starts = re.compile(rf"- !{re.escape(item)}(\s|$)")
    out: list[dict[tuple[int, int], float]] = []
    outer = -1
    for line in body.splitlines():
        if starts.search(line):
            out.append({})
        elif m := re.match(r"^ {8}(\d+):", line):
            outer = int(m.group(1))
        elif m := re.match(r"^ {10}(\d+): ([-+0-9.eE]+)", line):
            out[-1][outer, int(m.group(1))] = float(m.group(2))
    return out


def patched(image: bytes, offset: int, raw: bytes) -> bytes:
    """``image`` with ``raw`` written at ``offset`` (negative: from the end)."""
    offset %= len(image)
    return image[:offset] + raw + image[offset + len(raw) :]


def truncations(image: bytes, read: Callable[[bytes], object], footer: bytes) -> Iterator[bytes]:
    """Check that every proper prefix of ``image`` is a FormatError for ``read``, and yield each
    prefix with ``footer`` put back (so that the pointers, not the footer, must catch the cut)."""
    for cut in range(len(image)):
        with pytest.raises(FormatError):
            read(image[:cut])
        yield image[:cut] + footer


def corruption_sweep(
    image: bytes,
    offsets: Iterable[int],
    full_read: Callable[[bytes], object],
    flip: Callable[[int], int] = lambda offset: 0xFF,
) -> int:
    """XOR the byte at each offset with ``flip(offset)`` and ``full_read`` the result, which must
    either succeed or raise FormatError (any other exception escapes and fails the test).
    Returns how many raised FormatError."""
    errors = 0
    for offset in offsets:
        bad = patched(image, offset, bytes([image[offset] ^ flip(offset)]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FormatWarning)
            try:
                full_read(bad)
            except FormatError:
                errors += 1
    return errors


def written_in_pieces(
    plan: PlanT,
    order: Iterable[int],
    write_head: Callable[[int, PlanT], None],
    write_one: Callable[[int, PlanT, int], None],
    write_footer: Callable[[int, PlanT], None],
) -> bytes:
    """The bytes of a file written as parallel writers do: ``write_head``, then
    ``write_one(fd, plan, i)`` for each ``i`` of ``order``, then ``write_footer``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "piecewise.db")
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        try:
            write_head(fd, plan)
            for i in order:
                write_one(fd, plan, i)
            write_footer(fd, plan)
        finally:
            os.close(fd)
        return Path(path).read_bytes()


# A GPU stream's files: thread field 500 and up (``<exe>-<rank:06>-<thread:03>-<host:08x>-...``),
# anchored on the rank so that a pid of 5xx (a fresh machine's) is not taken for a stream.
STREAM_PROFILES = "*-[0-9][0-9][0-9][0-9][0-9][0-9]-5[0-9][0-9]-*.hpcrun"
STREAM_TRACES = "*-[0-9][0-9][0-9][0-9][0-9][0-9]-5[0-9][0-9]-*.hpctrace"

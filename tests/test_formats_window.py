"""A database file read through memory-mapped windows (formats/_window.py, issue #32 item 2).

Every view a ``MappedFile`` hands out must be the file's bytes, whatever was asked before
(forwards, backwards, larger than a window, across windows, views kept while others are made),
and the file must never be mapped whole: at most ``KEPT`` windows of it stay mapped, each the
size of a window or of one request.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formats_helpers import DATABASES, db_file
from pyhpctk.errors import FormatError
from pyhpctk.formats import _db, _window, cctdb, profiledb, tracedb

WINDOW = 64 << 10
SIZE = 7 * WINDOW + 1234  # ends inside a window


class Image:
    """A file of random bytes and its bytes (named, not shown, in a failing example)."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path, self.data = path, data

    def __repr__(self) -> str:
        return f"Image({self.path.name}, {len(self.data)} bytes)"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    data = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("window") / "file"
    path.write_bytes(data)
    return Image(path, data)


def mapped(path: Path) -> _window.MappedFile:
    return _window.MappedFile(os.open(path, os.O_RDONLY), str(path))


def mappings_of(path: Path) -> list[int]:
    """The length of every mapping of ``path`` in this process."""
    sizes = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(path):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                sizes.append(end - start)
    return sizes


requests = st.lists(
    st.tuples(st.integers(0, SIZE), st.integers(0, 3 * WINDOW)).map(
        lambda r: (r[0], min(r[1], SIZE - r[0]))
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(asked=requests, keep=st.lists(st.booleans(), min_size=30, max_size=30))
def test_every_view_is_the_file_s_bytes(
    image: Image, asked: list[tuple[int, int]], keep: list[bool]
) -> None:
    path, data = image.path, image.data
    original = _window.WINDOW
    _window.WINDOW = WINDOW
    try:
        file = mapped(path)
        assert len(file) == SIZE
        kept = []
        for (offset, size), hold in zip(asked, keep, strict=False):
            view = file.view(offset, size)
            assert bytes(view) == data[offset : offset + size]
            window, at = file.place(offset, size)
            assert bytes(window[at : at + size]) == data[offset : offset + size]
            if hold:
                kept.append((offset, size, view))
        for offset, size, view in kept:  # still the file's bytes, whatever was mapped since
            assert bytes(view) == data[offset : offset + size]
    finally:
        _window.WINDOW = original


def test_the_file_is_never_mapped_whole(image: Image, monkeypatch: pytest.MonkeyPatch) -> None:
    path, data = image.path, image.data
    monkeypatch.setattr(_window, "WINDOW", WINDOW)
    file = mapped(path)
    step = 4096
    for offset in [*range(0, SIZE - step, step), *range(SIZE - step, 0, -3 * step)]:
        assert bytes(file.view(offset, step)) == data[offset : offset + step]
        sizes = mappings_of(path)
        assert len(sizes) <= _window.KEPT and max(sizes) <= WINDOW + 4096, sizes
    big = file.view(100, 2 * WINDOW)  # a request larger than a window gets one of its size
    assert bytes(big) == data[100 : 100 + 2 * WINDOW]
    assert max(mappings_of(path)) <= 2 * WINDOW + 4096
    del file, big
    assert mappings_of(path) == []


def test_outside_the_file_is_a_value_error(image: Image) -> None:
    path = image.path
    file = mapped(path)
    for offset, size in ((SIZE - 10, 11), (-1, 4), (SIZE + 1, 0)):
        with pytest.raises(ValueError, match="lie outside"):
            file.view(offset, size)
    assert bytes(file.view(SIZE, 0)) == b""


@pytest.mark.parametrize("name", DATABASES)
def test_a_database_read_through_windows_reads_as_its_bytes(
    reference: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hpcprof's databases read from their paths through windows of one page (most blocks span
    two) dump and verify exactly as the same bytes read from memory."""
    monkeypatch.setattr(_window, "WINDOW", 4096)
    for file, module in (("profile.db", profiledb), ("cct.db", cctdb), ("trace.db", tracedb)):
        path = db_file(reference, name, file)
        buf, where = _db.open_source(path)
        assert isinstance(buf, _window.MappedFile) and where == str(path)
        texts = []
        for source in (path, path.read_bytes()):
            obj = module.read(source)  # type: ignore[attr-defined]
            out = io.StringIO()
            module.dump(obj, out)  # type: ignore[attr-defined]
            texts.append((out.getvalue(), module.verify(obj)))  # type: ignore[attr-defined]
        assert texts[0] == texts[1], file
        assert len(texts[0][0]) > 100


def test_an_empty_file_is_refused_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "profile.db"
    empty.write_bytes(b"")
    with pytest.raises(FormatError, match="shorter than the 16-byte header"):
        profiledb.read(empty)

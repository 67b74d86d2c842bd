"""A rank's slice of a database file: the same bytes through memory maps as through pwrite.

pyprof-mpi's ranks on one machine write their profile.db and cct.db slices through maps
(:mod:`pyhpctk.analysis.slices`); these tests pin down that a slice gets exactly the bytes
``os.pwrite`` would give, across map windows and with a neighbour writing the same page.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.analysis import slices
from pyhpctk.analysis.comm import SerialComm
from pyhpctk.analysis.slices import FileSlice, one_machine


def _pieces(rng: np.random.Generator, total: int) -> list[bytes]:
    """Random bytes cut into pieces of random lengths (empty ones included)."""
    data = rng.integers(0, 256, total, dtype=np.uint8).tobytes()
    cuts = np.sort(rng.integers(0, total, 40))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


@pytest.mark.parametrize("mapped", [False, True])
def test_a_slice_gets_its_pieces_back_to_back_across_map_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    monkeypatch.setattr(slices, "WINDOW", 3 * 4096)  # many windows, pieces across their edges
    rng = np.random.default_rng(7)
    path = tmp_path / "file"
    path.write_bytes(b"")
    start, total = 5000, 50_000  # not page-aligned, several windows long
    pieces = _pieces(rng, total)
    with FileSlice(path, start, start + total, mapped) as mine:
        assert mine.mapped is mapped
        mine.write_back_to_back(start, [memoryview(p) for p in pieces])
    image = path.read_bytes()
    assert image == bytes(start) + b"".join(pieces)


def test_two_slices_that_share_a_page_keep_each_others_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slices, "WINDOW", 4096)
    path = tmp_path / "file"
    path.write_bytes(b"")
    left = np.arange(6000, dtype=np.int64) % 251 + 1  # 48,000 bytes, never zero
    right = np.arange(5000, dtype=np.int64) % 241 + 1
    edge = left.nbytes  # not a page boundary: both maps hold the page around it
    first = FileSlice(path, 0, edge, mapped=True)
    second = FileSlice(path, edge, edge + right.nbytes, mapped=True)
    with first, second:  # interleaved, as two ranks would
        first.write(0, left[:3000])
        second.write(edge + 8 * 2000, right[2000:])
        first.write(8 * 3000, left[3000:])
        second.write(edge, right[:2000])
    assert path.read_bytes() == left.tobytes() + right.tobytes()


@pytest.mark.parametrize("mapped", [False, True])
def test_a_write_outside_the_slice_is_refused(tmp_path: Path, mapped: bool) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    with FileSlice(path, 100, 200, mapped) as mine:
        with pytest.raises(ValueError, match="outside the slice"):
            mine.write(150, bytes(51))
        with pytest.raises(ValueError, match="outside the slice"):
            mine.write(99, bytes(1))
        mine.write(100, bytes(100))


def test_an_empty_slice_maps_nothing_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"x")
    with FileSlice(path, 1, 1, mapped=True) as mine:
        assert not mine.mapped
        mine.write_back_to_back(1, [])
    assert path.read_bytes() == b"x"


def test_a_mapped_slice_is_reserved_first(tmp_path: Path) -> None:
    """posix_fallocate before the map: a full disk is an OSError there, not a SIGBUS later."""
    path = tmp_path / "file"
    path.write_bytes(b"")
    with FileSlice(path, 0, 1 << 20, mapped=True) as mine:
        if mine.mapped:  # a file system that can reserve space
            assert os.stat(path).st_blocks * 512 >= 1 << 20
        assert os.path.getsize(path) == 1 << 20


def test_one_process_is_not_a_machine_of_ranks() -> None:
    assert one_machine(SerialComm()) is False

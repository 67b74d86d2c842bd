"""trace.db v4.0 (formats.md §3.5): byte-identical rewrites, round trips with line order and
capacity, streamed writes, context checks against meta.db's ids, and typed errors."""

from __future__ import annotations

import contextlib
import io
import random
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formats_helpers import (
    DATABASES,
    corruption_sweep,
    db_file,
    patched,
    truncations,
    written_in_pieces,
)
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import tracedb
from pyhpctk.formats.tracedb import TraceDB, TraceLine


def trace_db(reference: Path, name: str) -> Path:
    return db_file(reference, name, "trace.db")


# --------------------------------------------------------------------------------------------
# hpcprof's files


@pytest.mark.parametrize("name", DATABASES)
def test_write_of_read_gives_hpcprofs_bytes(reference: Path, name: str, tmp_path: Path) -> None:
    original = trace_db(reference, name).read_bytes()
    db = tracedb.read(trace_db(reference, name))
    assert tracedb.to_bytes(db) == original
    tracedb.write(db, tmp_path / "trace.db")
    assert (tmp_path / "trace.db").read_bytes() == original
    assert tracedb.verify(db) == []
    assert tracedb.read(io.BytesIO(original), lazy=False) == db


@pytest.mark.parametrize("name", DATABASES)
def test_time_range_covers_every_element(reference: Path, name: str) -> None:
    db = tracedb.read(trace_db(reference, name))
    assert (db.min_timestamp, db.max_timestamp) == tracedb.time_bounds(db.lines)
    # formats.md §3.5: profIndex = 1..n in order, one line per non-summary profile
    assert [line.prof_index for line in db.lines] == list(range(1, len(db) + 1))


def test_an_empty_line_aliases_the_next_one(reference: Path) -> None:
    raw = trace_db(reference, "loops-cuda-nvidia-t.d").read_bytes()
    db = tracedb.read(raw)
    assert [len(line.elements) for line in db.lines] == [200, 0]
    headers = np.frombuffer(raw, tracedb.TRACE_HEADER_DTYPE, 2, 0x40)
    assert headers["p_start"][0] == headers["p_start"][1] == headers["p_end"][1]


def test_values_match_hpctesttools_yaml_dump(reference: Path) -> None:
    text = (reference / "dbase" / "small.yaml").read_text()
    section = text[text.index("trace: !trace.db/v4") :]
    times = [int(t) for t in re.findall(r"timestamp: (\d+)", section)]
    ctx = [int(c) for c in re.findall(r"ctx_id: (\d+)", section)]
    (low,) = (int(t) for t in re.findall(r"min: (\d+)", section))
    (high,) = (int(t) for t in re.findall(r"max: (\d+)", section))
    db = tracedb.read(trace_db(reference, "small.d"))
    assert (db.min_timestamp, db.max_timestamp) == (low, high)
    assert db.lines[0].elements["timestamp"].tolist() == times
    assert db.lines[0].elements["ctx_id"].tolist() == ctx


def test_dump_lists_every_element(reference: Path) -> None:
    db = tracedb.read(trace_db(reference, "loops-cputime-t.d"))
    out = io.StringIO()
    tracedb.dump(db, out)
    text = out.getvalue()
    assert len(re.findall(r"^  \d+ ctx \d+$", text, re.M)) == sum(len(x.elements) for x in db.lines)
    assert "line 3: profile 4: 167 elements" in text
    assert "line order: 3 2 1 0" in text


def test_sniff_tells_trace_db_from_the_others(reference: Path) -> None:
    d = reference / "dbase" / "small.d"
    assert tracedb.sniff((d / "trace.db").read_bytes()[:64])
    for other in ("profile.db", "cct.db", "meta.db"):
        assert not tracedb.sniff((d / other).read_bytes()[:64])


def test_verify_with_known_contexts_finds_unknown_ones(reference: Path) -> None:
    db = tracedb.read(trace_db(reference, "small.d"))
    used = set(db.lines[0].elements["ctx_id"].tolist()) - {0}
    assert tracedb.verify(db, used) == []
    assert tracedb.verify_contexts(db, np.array(sorted(used))) == []
    missing = max(used)
    problems = tracedb.verify(db, used - {missing})
    assert len(problems) == 1
    assert f"names unknown context {missing}" in problems[0]


# --------------------------------------------------------------------------------------------
# Synthetic traces


@st.composite
def lines(draw: st.DrawFn, prof_index: int) -> TraceLine:
    n = draw(st.integers(0, 20))
    times = sorted(draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)))
    ctx = draw(st.lists(st.integers(0, 2**32 - 1) | st.just(0), min_size=n, max_size=n))
    for i in range(1, n):  # formats.md §3.5: no two consecutive idle elements
        if ctx[i] == 0 and ctx[i - 1] == 0:
            ctx[i] = 1
    line = TraceLine.from_arrays(prof_index, times, ctx)
    extra = draw(st.none() | st.integers(0, 5))
    return line if extra is None else TraceLine(prof_index, line.elements, n + extra)


@st.composite
def databases(draw: st.DrawFn) -> TraceDB:
    n = draw(st.integers(0, 6))
    trace_lines = [draw(lines(i + 1)) for i in range(n)]
    order = draw(st.none() | st.permutations(range(n)))
    low, high = tracedb.time_bounds(trace_lines)
    return TraceDB(trace_lines, low, high, order)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(databases())
def test_read_of_write_gives_the_same_database(db: TraceDB) -> None:
    image = tracedb.to_bytes(db)
    back = tracedb.read(image)
    assert back == db
    assert tracedb.to_bytes(back) == image
    assert tracedb.verify(back) == []


@settings(max_examples=25, deadline=None)
@given(databases(), st.randoms(use_true_random=False))
def test_lines_streamed_in_any_order_give_the_same_file(db: TraceDB, rnd: random.Random) -> None:
    order = list(range(len(db)))
    rnd.shuffle(order)
    image = written_in_pieces(
        tracedb.layout_of(db),
        order,
        tracedb.write_head,
        lambda fd, plan, i: tracedb.write_line(fd, plan, i, db.lines[i].elements),
        tracedb.write_footer,
    )
    assert image == tracedb.to_bytes(db)


def test_layout_gives_8_aligned_lines_with_room() -> None:
    plan = tracedb.layout([1, 2, 3], [3, 0, 2], [3, 4, 2], 5, 9, [2, 0, 1])
    first = 0x40 + 3 * 24
    assert len(plan.head) == first
    # line 2 first (24 bytes), then line 0 (36 -> 40), then line 1 (room 4: 48)
    assert plan.lines_at.tolist() == [first + 24, first + 64, first]
    assert plan.footer_at == first + 64 + 48


def test_equality_sees_room_order_and_elements() -> None:
    a = TraceLine.from_arrays(1, [1, 2], [3, 0])
    b = TraceLine.from_arrays(2, [1, 5], [3, 4])
    base = TraceDB([a, b], 1, 5)
    assert base == TraceDB([a, b], 1, 5, [1, 0])
    assert base != TraceDB([a, b], 1, 5, [0, 1])
    assert base != TraceDB([a, TraceLine(2, b.elements, 3)], 1, 5)
    assert base != TraceDB([a, TraceLine.from_arrays(2, [1, 6], [3, 4])], 1, 5)
    assert base != TraceDB([a, b], 0, 5)


# --------------------------------------------------------------------------------------------
# Damaged files


@pytest.fixture()
def loops(reference: Path) -> bytes:
    return trace_db(reference, "loops-cputime-t.d").read_bytes()


def _full_read(image: bytes) -> TraceDB:
    db = tracedb.read(image, lazy=False)
    tracedb.verify(db, [1, 2, 3])
    tracedb.dump(db, io.StringIO())
    return db


@pytest.mark.filterwarnings("ignore::pyhpctk.errors.FormatWarning")
def test_truncation_at_every_offset_is_a_format_error(reference: Path) -> None:
    small = trace_db(reference, "small.d").read_bytes()
    whole = tracedb.read(small)
    for cut in truncations(small, tracedb.read, tracedb.FOOTER):
        with contextlib.suppress(FormatError):
            back = tracedb.read(cut, lazy=False)
            # what is left must still hold every element
            assert back.lines[0] == TraceLine(1, whole.lines[0].elements, back.lines[0].room)


@pytest.mark.parametrize(
    ("offset", "raw", "section", "problem"),
    [
        (0, b"HPCTOOLKIS", "header", "bad magic"),
        (10, b"meta", "header", "format id"),
        (14, bytes([5]), "header", "major version"),
        (-8, b"trace.dB", "footer", "missing footer"),
        (0x2C, bytes([8]), "CtxTraces", "szTrace 8"),
    ],
)
def test_bad_headers_name_section_and_problem(
    loops: bytes, offset: int, raw: bytes, section: str, problem: str
) -> None:
    with pytest.raises(FormatError) as caught:
        tracedb.read(patched(loops, offset, raw))
    assert (caught.value.section, caught.value.path) == (section, "<buffer>")
    assert problem in caught.value.problem


def test_newer_minor_version_warns_and_reads(loops: bytes) -> None:
    with pytest.warns(FormatWarning):
        db = tracedb.read(patched(loops, 15, bytes([1])))
    assert db == tracedb.read(loops)


def test_pointer_past_the_end_is_a_format_error(loops: bytes) -> None:
    # line 1's pEnd ({CTH} at 0x40 + 24 * i, pEnd at +0x10)
    image = patched(loops, 0x40 + 24 + 0x10, (len(loops) + 4).to_bytes(8, "little"))
    with pytest.raises(FormatError, match="CtxTraces: trace line 1"):
        tracedb.read(image)


def _element_at(db: TraceDB, line: int, index: int) -> int:
    return int(tracedb.layout_of(db).lines_at[line]) + 12 * index


def test_time_going_backwards_is_a_format_error(loops: bytes) -> None:
    db = tracedb.read(loops)
    at = _element_at(db, 2, 5)
    image = patched(loops, at, (1).to_bytes(8, "little"))
    lazy = tracedb.read(image)
    assert lazy.lines[0] == db.lines[0]
    with pytest.raises(FormatError, match="trace line 2: element 5 goes back in time"):
        lazy.lines[2]
    assert tracedb.verify(lazy) == ["line 2: element 5 goes back in time (not time-sorted)"]


def test_two_consecutive_idle_elements_are_a_format_error(loops: bytes) -> None:
    db = tracedb.read(loops)
    image = loops
    for j in (7, 8):
        image = patched(image, _element_at(db, 1, j) + 8, bytes(4))
    with pytest.raises(FormatError, match="trace line 1: elements 7 and 8 are both idle"):
        tracedb.read(image, lazy=False)


def test_an_unknown_context_is_found_by_verify_not_read(loops: bytes) -> None:
    db = tracedb.read(loops)
    known = set().union(*(set(x.elements["ctx_id"].tolist()) for x in db.lines)) - {0}
    image = patched(loops, _element_at(db, 0, 3) + 8, (999_999).to_bytes(4, "little"))
    damaged = tracedb.read(image, lazy=False)
    problems = tracedb.verify(damaged, known)
    assert problems == [
        "line 0 (profile 1): element 3 names unknown context 999999 (1 such elements)"
    ]


@pytest.mark.parametrize("name", ["small.d", "loops-cuda-nvidia-t.d"])
def test_every_corrupted_byte_gives_a_format_error_or_a_readable_file(
    reference: Path, name: str
) -> None:
    image = trace_db(reference, name).read_bytes()
    step = max(1, len(image) // 600)  # every header byte, and a spread of element bytes
    offsets = sorted(set(range(0x70)) | set(range(0, len(image), step)) | {len(image) - 1})
    assert corruption_sweep(image, offsets, _full_read) > 0

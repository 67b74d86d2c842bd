"""Tests of the logical (Python) frame metadata file ``logical/python.XXXXXXXX`` (formats.md §1.10).

The reference data holds no such file, so the expected bytes are built here by hand from the
spec, stanza by stanza, as hpcrun's ``cleanup_metadata_store`` writes them.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk import formats
from pyhpctk.errors import FormatError
from pyhpctk.formats import logical
from pyhpctk.formats.logical import LogicalMetadata, LogicalStanza


def spec_bytes(stanzas: list[tuple[int, bytes, int, bytes, int]]) -> bytes:
    """``HPCLOGICAL`` then {u32 fid; str funcname; u8 mangling; str filename; u32 lineno}."""
    out = b"HPCLOGICAL"
    for fid, func, mangling, file, line in stanzas:
        out += struct.pack(">I", fid) + struct.pack(">I", len(func)) + func
        out += bytes([mangling]) + struct.pack(">I", len(file)) + file + struct.pack(">I", line)
    return out


EXAMPLE = [
    (2, b"main", 0, b"/app/run.py", 10),  # a Python function
    (1, b"", 0, b"/app/run.py", 0),  # module-level code: no function name
    (3, b"_ZN3fooEv", 1, b"", 0),  # a C++ function called from Python
]


def example() -> LogicalMetadata:
    return LogicalMetadata(
        [
            LogicalStanza(2, "main", 0, "/app/run.py", 10),
            LogicalStanza(1, "", 0, "/app/run.py", 0),
            LogicalStanza(3, "_ZN3fooEv", 1, "", 0),
        ]
    )


def test_read_decodes_the_spec_layout_in_file_order() -> None:
    assert logical.read(spec_bytes(EXAMPLE)) == example()


def test_write_produces_the_spec_layout() -> None:
    assert logical.to_bytes(example()) == spec_bytes(EXAMPLE)
    assert logical.to_bytes(LogicalMetadata()) == b"HPCLOGICAL"


def test_paths_streams_and_detection(tmp_path: Path) -> None:
    path = tmp_path / "logical" / "python.0badf00d"
    path.parent.mkdir()
    logical.write(example(), path)
    stream = io.BytesIO()
    logical.write(example(), stream)
    assert path.read_bytes() == stream.getvalue()
    assert logical.read(path) == logical.read(io.BytesIO(stream.getvalue())) == example()
    assert logical.sniff(path.read_bytes()[:64]) and not logical.sniff(b"HPCRUN-trace")
    assert formats.detect(path.read_bytes()[:64]) == "logical"


def test_by_fid_indexes_stanzas() -> None:
    assert example().by_fid()[3].funcname == "_ZN3fooEv"
    assert sorted(example().by_fid()) == [1, 2, 3]


names = st.text(st.characters(codec="utf-8", blacklist_characters="\0"), max_size=20)  # C strings
stanzas = st.builds(
    LogicalStanza,
    st.integers(0, 2**32 - 1),
    names,
    st.integers(0, 255),
    names,
    st.integers(0, 2**32 - 1),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(stanzas, max_size=10))
def test_read_of_write_gives_back_random_metadata(items: list[LogicalStanza]) -> None:
    metadata = LogicalMetadata(items)
    data = logical.to_bytes(metadata)
    assert logical.read(data) == metadata
    assert logical.to_bytes(logical.read(data)) == data
    expected = [
        (s.fid, s.funcname.encode(), s.mangling, s.filename.encode(), s.lineno) for s in items
    ]
    assert data == spec_bytes(expected)


def test_non_utf8_names_round_trip_exactly() -> None:
    data = spec_bytes([(1, b"f\xff", 0, b"/x/\xe9.py", 3)])
    metadata = logical.read(data)
    assert metadata.stanzas[0].funcname == "f\udcff"
    assert logical.to_bytes(metadata) == data


def test_every_truncation_is_an_error_except_at_stanza_boundaries() -> None:
    data = spec_bytes(EXAMPLE)
    boundaries = {len(spec_bytes(EXAMPLE[:k])): k for k in range(len(EXAMPLE) + 1)}
    for size in range(len(data)):
        if size in boundaries:
            assert len(logical.read(data[:size]).stanzas) == boundaries[size]
        else:
            with pytest.raises(FormatError):
                logical.read(data[:size])


def test_truncated_stanza_error_names_the_stanza(tmp_path: Path) -> None:
    path = tmp_path / "python.00000001"
    path.write_bytes(spec_bytes(EXAMPLE)[:-2])
    with pytest.raises(FormatError) as info:
        logical.read(path)
    assert info.value.section == "stanza 2" and str(path) in str(info.value)


def test_wrong_magic_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="bad magic"):
        logical.read(b"HPCLOGICAX" + spec_bytes(EXAMPLE)[10:])
    with pytest.raises(FormatError):
        logical.read(tmp_path / "absent")


def test_a_huge_string_length_is_an_error_not_a_crash() -> None:
    with pytest.raises(FormatError, match="truncated"):
        logical.read(b"HPCLOGICAL" + struct.pack(">II", 1, 0xFFFFFFFF) + b"abc")


def test_verify_reports_reserved_duplicate_and_nameless_stanzas() -> None:
    assert logical.verify(example()) == []
    bad = LogicalMetadata(
        [
            LogicalStanza(0, "f", 0, "a.py", 1),
            LogicalStanza(4, "", 0, "", 0),
            LogicalStanza(4, "", 2, "b.py", 9),
        ]
    )
    assert logical.verify(bad) == [
        "stanza 0 (fid 0): fid 0 is reserved for unknown frames",
        "stanza 1 (fid 4): neither a function name nor a file name",
        "stanza 2 (fid 4): fid appears more than once",
        "stanza 2 (fid 4): module-level code has lineno 9, hpcrun writes 0",
        "stanza 2 (fid 4): unknown mangling 2",
    ]


def test_dump_shows_each_stanza_kind() -> None:
    text = logical.dumps(example())
    assert text.splitlines() == [
        "logical metadata, 3 stanzas",
        "  fid 2: main at /app/run.py:10 mangling=none",
        "  fid 1: <module> at /app/run.py:0 mangling=none",
        "  fid 3: _ZN3fooEv at <no file> mangling=C++",
    ]

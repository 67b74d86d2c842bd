"""Tests of the ``.hpctrace`` v1.01 reader and writer (formats.md §2) and of verify_trace."""

from __future__ import annotations

import io
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk import formats
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import hpcrun, hpctrace
from pyhpctk.formats.hpcrun_model import (
    CCT_NODE_DTYPE,
    TRACE_RECORD_DTYPE,
    HpcrunProfile,
    HpctraceFile,
    placeholder_ip,
    traces_equal,
)

SMALL = "small.m/testmeas-small-000000-000-11ac0300-5560-0"
STREAM = "loops-cuda-nvidia-t.m/testmeas-loops-cuda-000000-500-590a0502-3293-0"
EMPTY = "loops-cuda-nvidia-t.m/testmeas-loops-cuda-000000-000-590a0502-3293-0"


def traces(reference: Path) -> list[Path]:
    files = sorted((reference / "meas").glob("*/*.hpctrace"))
    assert len(files) == 9  # formats.md §7: one trace per profile
    return files


def oracle(data: bytes) -> tuple[str, int, list[tuple[int, int]]]:
    """formats.md §2 read record by record: (version, flags, [(time, node)])."""
    assert data[:18] == b"HPCRUN-trace______" and data[23:24] == b"b"
    (flags,) = struct.unpack_from(">Q", data, 24)
    records = [struct.unpack_from(">QI", data, at) for at in range(32, len(data), 12)]
    return data[18:23].decode(), flags, records


def as_oracle(trace: HpctraceFile) -> tuple[str, int, list[tuple[int, int]]]:
    return trace.version, trace.flags, [(int(t), int(n)) for t, n in trace.records]


def make_trace(records: list[tuple[int, int]], flags: int = 0) -> HpctraceFile:
    return HpctraceFile(flags=flags, records=np.array(records, dtype=TRACE_RECORD_DTYPE))


def make_profile(ids: list[int], disorder: str = "0") -> HpcrunProfile:
    nodes = [(ids[0], 0, 0, placeholder_ip("^Primary"), 1)]
    nodes += [(i, ids[0], 1, 0x10 * k, 1) for k, i in enumerate(ids[1:])]
    return HpcrunProfile(
        nvpairs=[("trace-disorder", disorder)], cct=np.array(nodes, dtype=CCT_NODE_DTYPE)
    )


# ---------------------------------------------------------------------------------------------
# Reference files


def test_every_reference_trace_round_trips_byte_for_byte(reference: Path) -> None:
    for file in traces(reference):
        assert hpctrace.to_bytes(hpctrace.read(file)) == file.read_bytes(), file


def test_reader_agrees_with_the_struct_oracle(reference: Path) -> None:
    for file in traces(reference):
        assert as_oracle(hpctrace.read(file)) == oracle(file.read_bytes()), file


def test_reference_traces_match_the_inventory(reference: Path) -> None:
    # formats.md §7: small has 13 records; the GPU stream 200 with the call-trace flag; the CPU
    # thread of a GPU run an empty 32-byte trace.
    meas = reference / "meas"
    small = hpctrace.read(meas / f"{SMALL}.hpctrace")
    assert (small.version, small.flags, len(small.records)) == ("01.01", 0, 13)
    stream = hpctrace.read(meas / f"{STREAM}.hpctrace")
    assert stream.flags == 0x4 and len(stream.records) == 200
    assert len(hpctrace.read(meas / f"{EMPTY}.hpctrace").records) == 0
    assert "call-trace" in hpctrace.dumps(stream)


def test_reference_traces_verify_clean_against_their_profiles(reference: Path) -> None:
    for file in traces(reference):
        profile = hpcrun.read(file.with_suffix(".hpcrun"))
        assert hpctrace.verify_trace(hpctrace.read(file), profile) == [], file


def test_sources_sniff_and_detection(reference: Path) -> None:
    file = reference / "meas" / f"{SMALL}.hpctrace"
    data = file.read_bytes()
    expected = hpctrace.read(file)
    for source in (str(file), data, memoryview(data), io.BytesIO(data)):
        assert hpctrace.read(source) == expected
    assert hpctrace.sniff(data[:64]) and not hpctrace.sniff(b"HPCRUN-profile____04.00b")
    assert formats.detect(data[:64]) == "hpctrace"


def test_dump_lists_every_record(reference: Path) -> None:
    file = reference / "meas" / f"{SMALL}.hpctrace"
    text = hpctrace.dumps(hpctrace.read(file))
    _, _, records = oracle(file.read_bytes())
    assert text.startswith("hpctrace, format 01.01, flags 0x0\n")
    for i, (time, node) in enumerate(records):
        assert f"{i:6d} {time} " in text and text.count(f"node {node}\n") >= 1
    assert len(text.splitlines()) == 2 + len(records)


# ---------------------------------------------------------------------------------------------
# Round trips


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)), max_size=40),
    st.sampled_from([0, 2, 4, 6, 0xF0]),
)
def test_read_of_write_gives_back_a_random_trace(
    records: list[tuple[int, int]], flags: int
) -> None:
    trace = make_trace(records, flags)
    data = hpctrace.to_bytes(trace)
    assert len(data) == 32 + 12 * len(records)
    back = hpctrace.read(data)
    assert traces_equal(back, trace) and back == trace
    assert as_oracle(back) == oracle(data)


def test_version_1_00_has_a_24_byte_header_and_round_trips() -> None:
    data = b"HPCRUN-trace______01.00b" + struct.pack(">QI", 5, 7) + struct.pack(">QI", 9, 11)
    trace = hpctrace.read(data)
    assert trace.version == "01.00" and trace.flags == 0
    assert trace.records["time"].tolist() == [5, 9] and trace.records["node_id"].tolist() == [7, 11]
    assert hpctrace.to_bytes(trace) == data


def test_write_to_path_and_stream(tmp_path: Path) -> None:
    trace = make_trace([(1, 13), (2, 15)], flags=4)
    hpctrace.write(trace, tmp_path / "t.hpctrace")
    stream = io.BytesIO()
    hpctrace.write(trace, stream)
    assert (tmp_path / "t.hpctrace").read_bytes() == stream.getvalue()
    assert hpctrace.read(tmp_path / "t.hpctrace") == trace


def test_equality_sees_record_differences() -> None:
    assert make_trace([(1, 13)]) != make_trace([(1, 15)])
    assert make_trace([(1, 13)]) != make_trace([(1, 13)], flags=4)


# ---------------------------------------------------------------------------------------------
# Bad input


def raises(data: bytes, *words: str) -> None:
    with pytest.raises(FormatError) as info:
        hpctrace.read(data)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_truncations_are_errors_unless_they_fall_on_a_record_boundary(reference: Path) -> None:
    # A trace has no footer: cutting between records leaves a valid, shorter trace.
    for file in traces(reference):
        data = file.read_bytes()
        for size in range(len(data)):
            if size >= 32 and (size - 32) % 12 == 0:
                assert len(hpctrace.read(data[:size]).records) == (size - 32) // 12
            else:
                raises(data[:size])


def test_wrong_magic_version_endianness(reference: Path) -> None:
    data = (reference / "meas" / f"{SMALL}.hpctrace").read_bytes()
    raises(b"HPCRUN-trace_____X" + data[18:], "header", "bad magic")
    raises(data[:18] + b"02.01" + data[23:], "header", "newer major")
    raises(data[:18] + b"1.01x" + data[23:], "header", "MM.mm")
    raises(data[:23] + b"l" + data[24:], "header", "endianness")


def test_newer_minor_version_warns_and_reads(reference: Path) -> None:
    data = (reference / "meas" / f"{SMALL}.hpctrace").read_bytes()
    with pytest.warns(FormatWarning, match="01.05"):
        trace = hpctrace.read(data[:18] + b"01.05" + data[23:])
    assert trace.version == "01.05" and len(trace.records) == 13


def test_unaligned_record_area_is_an_error(reference: Path) -> None:
    data = (reference / "meas" / f"{SMALL}.hpctrace").read_bytes()
    raises(data + b"\0" * 5, "records", "multiple of 12")


def test_data_centric_traces_are_refused() -> None:
    data = hpctrace.to_bytes(make_trace([(1, 13)], flags=1))
    raises(data, "header", "data-centric")


def test_flipping_any_header_byte_reads_cleanly_or_raises(reference: Path) -> None:
    data = (reference / "meas" / f"{SMALL}.hpctrace").read_bytes()
    for at in range(32):
        for xor in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[at] ^= xor
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FormatWarning)
                    hpctrace.read(bytes(corrupt))
            except FormatError:
                pass


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError):
        hpctrace.read(tmp_path / "absent.hpctrace")


# ---------------------------------------------------------------------------------------------
# verify and verify_trace


def test_verify_trace_finds_unknown_nodes_and_even_ids() -> None:
    profile = make_profile([12, 13, 15])
    problems = hpctrace.verify_trace(make_trace([(1, 13), (2, 17), (3, 14)]), profile)
    assert problems == [
        "records: record 2 names node 14, an even (not retained) id (1 such records)",
        "records: record 1 names node 17, not in the profile's CCT (2 such records)",
    ]


def test_verify_trace_allows_disorder_only_within_the_window() -> None:
    records = [(10, 13), (30, 13), (20, 13), (40, 13)]  # one step back, one position
    assert hpctrace.verify_trace(make_trace(records), make_profile([12, 13], "1")) == []
    problems = hpctrace.verify_trace(make_trace(records), make_profile([12, 13], "0"))
    assert problems == [
        "records: record 2 at time 20 is earlier than a record more than 0 positions before it "
        "(trace-disorder 0)"
    ]
    far = [(10, 13), (30, 13), (31, 13), (20, 13)]  # two positions back
    assert hpctrace.verify_trace(make_trace(far), make_profile([12, 13], "1")) != []
    assert hpctrace.verify_trace(make_trace(far), make_profile([12, 13], "2")) == []


def test_verify_flags_unknown_and_data_centric_bits() -> None:
    problems = hpctrace.verify(make_trace([], flags=0x11))
    assert "header: unknown flag bits 0x10" in problems
    assert "header: data-centric traces are not supported" in problems
    assert hpctrace.verify(make_trace([(1, 13)], flags=4)) == []

"""Tests of the ``.hpcrun`` v4.0 reader and writer (formats.md §1) against HPCToolkit's files.

The oracle is a slow, obvious struct-based parser written here from formats.md alone; the fast
numpy reader must agree with it on every reference file and on random synthetic profiles.
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyhpctk import formats
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import hpcrun, logical
from pyhpctk.formats.hpcrun_model import (
    CCT_NODE_DTYPE,
    ID_TUPLE_ELEMENT_DTYPE,
    METRIC_VALUE_DTYPE,
    NODE_START_DTYPE,
    HpcrunProfile,
    LoadModule,
    MetricDescriptor,
    metric_flags,
    placeholder_ip,
    profiles_equal,
)

SMALL = "small.m/testmeas-small-000000-000-11ac0300-5560-0.hpcrun"
CUDA_CPU = "loops-cuda-nvidia-t.m/testmeas-loops-cuda-000000-000-590a0502-3293-0.hpcrun"


def profiles(reference: Path) -> list[Path]:
    files = sorted((reference / "meas").glob("*/*.hpcrun"))
    assert len(files) == 9  # formats.md §7: 1 + 4 + 2 + 2 profiles
    return files


# ---------------------------------------------------------------------------------------------
# The oracle: formats.md §1 read record by record with struct.


def oracle(data: bytes) -> dict[str, Any]:
    footer = struct.unpack(">14Q", data[-112:])
    assert footer[13] == 0x48504352554E736D

    def string(pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from(">I", data, pos)
        return data[pos + 4 : pos + 4 + n].decode("utf-8", "surrogateescape"), pos + 4 + n

    result: dict[str, Any] = {"version": data[18:23].decode()}
    pos = 24
    (n,) = struct.unpack_from(">I", data, pos)
    pos += 4
    pairs = []
    for _ in range(n):
        key, pos = string(pos)
        value, pos = string(pos)
        pairs.append((key, value))
    assert pos == footer[1]
    result["nvpairs"] = pairs

    pos = footer[2]
    (n,) = struct.unpack_from(">I", data, pos)
    pos += 4
    modules = []
    for _ in range(n):
        (lm_id,) = struct.unpack_from(">H", data, pos)
        path, pos = string(pos + 2)
        (flags,) = struct.unpack_from(">Q", data, pos)
        pos += 8
        modules.append((lm_id, path, flags))
    assert pos == footer[3]
    result["load_modules"] = modules

    pos = footer[4]
    (n,) = struct.unpack_from(">Q", data, pos)
    pos += 8
    nodes = []
    for _ in range(n):
        nodes.append(struct.unpack_from(">IIHQB", data, pos))
        pos += 19
    assert pos == footer[5]
    result["cct"] = nodes

    pos = footer[6]
    (n,) = struct.unpack_from(">I", data, pos)
    pos += 4
    metrics = []
    for _ in range(n):
        name, pos = string(pos)
        description, pos = string(pos)
        flags = data[pos : pos + 16]
        (period,) = struct.unpack_from(">Q", data, pos + 16)
        formula, pos = string(pos + 24)
        fmt, pos = string(pos)
        tail = struct.unpack_from(">HHQQ", data, pos)  # threshold_mean as its bits
        pos += 20
        metrics.append((name, description, flags, period, formula, fmt, *tail))
    assert pos == footer[7]
    result["metrics"] = metrics

    pos = footer[8]
    (n,) = struct.unpack_from(">H", data, pos)
    pos += 2
    names = []
    for _ in range(n):
        (kind,) = struct.unpack_from(">H", data, pos)
        name, pos = string(pos + 2)
        names.append((kind, name))
    assert pos == footer[9]
    result["id_names"] = names

    pos = footer[10]
    (n,) = struct.unpack_from(">H", data, pos)
    pos += 2
    result["id_tuple"] = [struct.unpack_from(">HQQ", data, pos + 18 * i) for i in range(n)]
    pos += 18 * n
    n_values, n_nodes = struct.unpack_from(">QI", data, pos)
    pos += 12
    result["values"] = [struct.unpack_from(">QH", data, pos + 10 * i) for i in range(n_values)]
    pos += 10 * n_values
    starts = [struct.unpack_from(">IQ", data, pos + 12 * i) for i in range(n_nodes + 1)]
    pos += 12 * (n_nodes + 1)
    assert pos == footer[11]
    assert starts[-1] == (0x656E6421, n_values)
    result["node_starts"] = starts[:-1]
    return result


def as_oracle(profile: HpcrunProfile) -> dict[str, Any]:
    """The same shape as :func:`oracle`, from a model object."""
    return {
        "version": profile.version,
        "nvpairs": list(profile.nvpairs),
        "load_modules": [(m.id, m.path, m.flags) for m in profile.load_modules],
        "cct": [tuple(int(x) for x in node) for node in profile.cct],
        "metrics": [
            (
                m.name,
                m.description,
                bytes(m.flags),
                m.period,
                m.formula,
                m.format,
                m.is_frequency,
                m.is_multiplexed,
                int.from_bytes(struct.pack(">d", m.threshold_mean), "big"),
                m.num_samples,
            )
            for m in profile.metrics
        ],
        "id_names": list(profile.id_names),
        "id_tuple": [tuple(int(x) for x in e) for e in profile.id_tuple],
        "values": [tuple(int(x) for x in v) for v in profile.values],
        "node_starts": [tuple(int(x) for x in s) for s in profile.node_starts],
    }


# ---------------------------------------------------------------------------------------------
# Synthetic profiles


def make_profile(
    nodes: list[tuple[int, int, int, int, int]],
    values: Sequence[tuple[int, list[tuple[int, int]]]] = (),
    metrics: list[MetricDescriptor] | None = None,
    load_modules: list[LoadModule] | None = None,
) -> HpcrunProfile:
    """A profile from (id, parent, lm, ip, flags) nodes and (node, [(bits, metric)]) values."""
    flat = [v for _, pairs in values for v in pairs]
    starts, at = [], 0
    for node_id, pairs in values:
        starts.append((node_id, at))
        at += len(pairs)
    return HpcrunProfile(
        nvpairs=HEADER_PAIRS,
        load_modules=load_modules if load_modules is not None else [LoadModule(1, "/bin/x")],
        cct=np.array(nodes, dtype=CCT_NODE_DTYPE),
        metrics=metrics if metrics is not None else [MetricDescriptor("CPUTIME (sec)")],
        id_tuple=np.array([(0x4001, 7, 0), (0xC003, 0, 0)], dtype=ID_TUPLE_ELEMENT_DTYPE),
        values=np.array(flat, dtype=METRIC_VALUE_DTYPE),
        node_starts=np.array(starts, dtype=NODE_START_DTYPE),
    )


HEADER_PAIRS = [
    ("program-name", "x"),
    ("mpi-rank", "0"),
    ("thread-id", "0"),
    ("host-id", "1"),
    ("process-id", "1"),
]
PRIMARY = placeholder_ip("^Primary")
MAIN = placeholder_ip("| Main  ")


def simple_nodes() -> list[tuple[int, int, int, int, int]]:
    return [(12, 0, 0, PRIMARY, 1), (14, 12, 0, MAIN, 1), (16, 14, 1, 0x1000, 1)]


def real_bits(x: float) -> int:
    return int.from_bytes(struct.pack(">d", x), "big")


u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
text = st.text(st.characters(codec="utf-8", blacklist_characters="\0"), max_size=12)  # C strings


@st.composite
def random_profiles(draw: st.DrawFn) -> HpcrunProfile:
    n = draw(st.integers(1, 25))
    ids = draw(st.lists(st.integers(1, 2**32 - 1), min_size=n, max_size=n, unique=True))
    nodes = [(ids[0], 0, 0, PRIMARY, draw(st.integers(0, 255)))]
    for i in range(1, n):
        parent = ids[draw(st.integers(0, i - 1))]  # parents before children
        nodes.append((ids[i], parent, draw(u16), draw(u64), draw(st.integers(0, 255))))
    metrics = [
        MetricDescriptor(
            draw(text),
            draw(text),
            draw(st.binary(min_size=16, max_size=16)),
            draw(u64),
            draw(text),
            draw(text),
            draw(u16),
            draw(u16),
            draw(st.floats()),
            draw(u64),
        )
        for _ in range(draw(st.integers(0, 4)))
    ]
    values: list[tuple[int, list[tuple[int, int]]]] = []
    if metrics:
        for node in nodes:
            if draw(st.booleans()):
                pairs = draw(
                    st.lists(
                        st.tuples(u64, st.integers(0, len(metrics) - 1)), min_size=1, max_size=3
                    )
                )
                values.append((node[0], pairs))
    profile = make_profile(
        nodes,
        values,
        metrics,
        [LoadModule(i + 1, draw(text), draw(u64)) for i in range(draw(st.integers(0, 4)))],
    )
    profile.nvpairs = draw(st.lists(st.tuples(text, text), max_size=4))
    profile.id_names = draw(st.lists(st.tuples(u16, text), max_size=4))
    profile.id_tuple = np.array(
        draw(st.lists(st.tuples(u16, u64, u64), max_size=4)), dtype=ID_TUPLE_ELEMENT_DTYPE
    )
    return profile


# ---------------------------------------------------------------------------------------------
# Reference files


def test_every_reference_profile_round_trips_byte_for_byte(reference: Path) -> None:
    for file in profiles(reference):
        data = file.read_bytes()
        assert hpcrun.to_bytes(hpcrun.read(file)) == data, file


def test_reader_agrees_with_the_struct_oracle_on_every_reference_profile(reference: Path) -> None:
    for file in profiles(reference):
        assert as_oracle(hpcrun.read(file)) == oracle(file.read_bytes()), file


def test_reference_profiles_verify_clean(reference: Path) -> None:
    for file in profiles(reference):
        assert hpcrun.verify(hpcrun.read(file)) == [], file


def test_small_profile_matches_the_inventory(reference: Path) -> None:
    # formats.md §7: 13 CCT nodes, metric CPUTIME (sec) real, 5 values; §1.2 offsets.
    profile = hpcrun.read(reference / "meas" / SMALL)
    assert len(profile.cct) == 13 and len(profile.values) == 5
    assert [m.name for m in profile.metrics] == ["CPUTIME (sec)"]
    assert profile.metrics[0].is_real
    assert profile.header("program-name") == "testmeas-small"
    assert int(profile.cct["lm_ip"][0]) == PRIMARY and int(profile.cct["parent_id"][0]) == 0
    footer = struct.unpack(">14Q", hpcrun.to_bytes(profile)[-112:])
    small_offsets = (0, 0x1AA, 0x400, 0x868, 0xC00, 0xCFF, 0x1000, 0x105A)
    assert footer[:13] == (*small_offsets, 0x1400, 0x1467, 0x1800, 0x18BE, 0x1C00)


def test_read_accepts_paths_buffers_and_streams(reference: Path) -> None:
    file = reference / "meas" / SMALL
    data = file.read_bytes()
    expected = hpcrun.read(str(file))
    for source in (file, data, memoryview(data), bytearray(data), io.BytesIO(data)):
        assert hpcrun.read(source) == expected


def test_sniff_and_format_detection(reference: Path) -> None:
    file = reference / "meas" / SMALL
    assert hpcrun.sniff(file.read_bytes()[:64])
    assert not hpcrun.sniff(file.with_suffix(".hpctrace").read_bytes()[:64])
    assert formats.detect(file.read_bytes()[:64]) == "hpcrun"


def test_decoded_values_match_the_doubles_in_the_file(reference: Path) -> None:
    data = (reference / "meas" / SMALL).read_bytes()
    expected = oracle(data)
    node_ids, metric, values = hpcrun.decoded_values(hpcrun.read(data))
    starts = [s for _, s in expected["node_starts"]] + [len(expected["values"])]
    owners = []
    for (node, _), first, stop in zip(expected["node_starts"], starts, starts[1:], strict=False):
        owners += [node] * (stop - first)
    doubles = [struct.unpack(">d", bits.to_bytes(8, "big"))[0] for bits, _ in expected["values"]]
    assert node_ids.tolist() == owners
    assert metric.tolist() == [m for _, m in expected["values"]]
    assert values.tolist() == doubles
    assert node_ids.dtype == np.uint32 and metric.dtype == np.uint16 and values.dtype == np.float64


def test_decoded_values_decode_integers_and_scale_by_period() -> None:
    metrics = [
        MetricDescriptor("count", flags=metric_flags(value_format=1), period=1000),
        MetricDescriptor("secs", flags=metric_flags(value_format=2), period=3),
    ]
    profile = make_profile(simple_nodes(), [(16, [(7, 0), (real_bits(0.5), 1)])], metrics)
    node_ids, metric, values = hpcrun.decoded_values(profile)
    assert node_ids.tolist() == [16, 16] and metric.tolist() == [0, 1]
    assert values.tolist() == [7.0, 0.5]
    assert hpcrun.decoded_values(profile, scaled=True)[2].tolist() == [7000.0, 1.5]


# ---------------------------------------------------------------------------------------------
# Writer layout and round trips


def test_writer_puts_every_section_and_the_footer_on_1024_byte_boundaries() -> None:
    profile = make_profile(simple_nodes(), [(16, [(real_bits(1.0), 0)])])
    data = hpcrun.to_bytes(profile)
    footer = struct.unpack(">14Q", data[-112:])
    assert footer[13] == 0x48504352554E736D and data[-8:] == b"HPCRUNsm"
    assert footer[12] == len(data) - 112
    starts, ends = footer[0:12:2], footer[1:12:2]
    assert all(s % 1024 == 0 for s in starts) and footer[12] % 1024 == 0
    for end, next_start in zip(ends, (*starts[1:], footer[12]), strict=True):
        assert next_start == (end + 1023) // 1024 * 1024
        assert data[end:next_start] == bytes(next_start - end)
    # the end! sentinel closes the sparse section
    assert data[footer[11] - 12 : footer[11]] == b"end!" + struct.pack(">Q", 1)


def test_write_to_path_and_stream_gives_the_same_bytes(tmp_path: Path) -> None:
    profile = make_profile(simple_nodes(), [(16, [(real_bits(2.0), 0)])])
    hpcrun.write(profile, tmp_path / "p.hpcrun")
    stream = io.BytesIO()
    hpcrun.write(profile, stream)
    assert (tmp_path / "p.hpcrun").read_bytes() == stream.getvalue() == hpcrun.to_bytes(profile)
    assert hpcrun.read(tmp_path / "p.hpcrun") == profile


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_profiles())
def test_read_of_write_gives_back_a_random_profile(profile: HpcrunProfile) -> None:
    data = hpcrun.to_bytes(profile)
    back = hpcrun.read(data)
    assert profiles_equal(back, profile)
    assert back == profile
    assert as_oracle(back) == oracle(data)
    assert hpcrun.to_bytes(back) == data


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_profiles())
def test_a_reversed_cct_puts_a_child_before_its_parent(profile: HpcrunProfile) -> None:
    if len(profile.cct) < 2:
        return
    profile.cct = profile.cct[::-1].copy()
    raises_format_error(hpcrun.to_bytes(profile), "cct", "follows")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_profiles())
def test_decoded_values_agree_with_a_value_by_value_decoding(profile: HpcrunProfile) -> None:
    node_ids, metric, values = hpcrun.decoded_values(profile, scaled=True)
    bounds = [int(s) for s in profile.node_starts["start"]] + [len(profile.values)]
    for k, node in enumerate(profile.node_starts["node_id"].tolist()):
        for i in range(bounds[k], bounds[k + 1]):
            bits, m = (int(x) for x in profile.values[i])
            desc = profile.metrics[m]
            if desc.value_format == 2:
                expected = struct.unpack(">d", bits.to_bytes(8, "big"))[0] * float(desc.period)
            else:
                expected = float(bits) * float(desc.period)
            assert node_ids[i] == node and metric[i] == m
            assert values[i] == expected or (np.isnan(values[i]) and np.isnan(expected))


def test_an_empty_profile_round_trips() -> None:
    data = hpcrun.to_bytes(HpcrunProfile())
    assert len(data) == 6 * 1024 + 112
    assert hpcrun.read(data) == HpcrunProfile()
    assert "cct: the CCT is empty (hpcrun always writes a ^Primary root)" in hpcrun.verify(
        HpcrunProfile()
    )


def test_non_utf8_strings_round_trip_exactly() -> None:
    profile = make_profile(simple_nodes(), load_modules=[LoadModule(1, "/tmp/caf\udce9.so")])
    data = hpcrun.to_bytes(profile)
    assert b"/tmp/caf\xe9.so" in data
    assert hpcrun.read(data).load_modules[0].path == "/tmp/caf\udce9.so"


def test_equality_sees_array_differences() -> None:
    a = make_profile(simple_nodes(), [(16, [(1, 0)])])
    b = make_profile(simple_nodes(), [(16, [(2, 0)])])
    c = make_profile(simple_nodes()[:2])
    assert a != b and a != c and a == make_profile(simple_nodes(), [(16, [(1, 0)])])


# ---------------------------------------------------------------------------------------------
# Bad input


def raises_format_error(data: bytes, *words: str) -> FormatError:
    with pytest.raises(FormatError) as info:
        hpcrun.read(data)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    return info.value


def test_every_truncation_of_every_reference_profile_is_a_format_error(reference: Path) -> None:
    for file in profiles(reference):
        data = file.read_bytes()
        step = 1 if file.name.startswith("testmeas-small") else 13
        for size in range(0, len(data), step):
            raises_format_error(data[:size])


def test_error_names_the_file_and_the_section(reference: Path, tmp_path: Path) -> None:
    data = (reference / "meas" / SMALL).read_bytes()
    (tmp_path / "cut.hpcrun").write_bytes(data[:-1])
    with pytest.raises(FormatError) as info:
        hpcrun.read(tmp_path / "cut.hpcrun")
    assert info.value.path == str(tmp_path / "cut.hpcrun") and info.value.section == "footer"
    assert str(info.value).startswith(f"{tmp_path / 'cut.hpcrun'}: footer: ")


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError):
        hpcrun.read(tmp_path / "absent.hpcrun")


def test_wrong_magic_version_and_endianness(reference: Path) -> None:
    data = (reference / "meas" / SMALL).read_bytes()
    raises_format_error(b"HPCRUN-profilX" + data[14:], "header", "bad magic")
    raises_format_error(data[:18] + b"05.00" + data[23:], "header", "newer major")
    raises_format_error(data[:18] + b"03.00" + data[23:], "header", "older")
    raises_format_error(data[:18] + b"4.000" + data[23:], "header", "not of the form")
    raises_format_error(data[:23] + b"l" + data[24:], "header", "endianness")


def test_newer_minor_version_warns_and_still_reads(reference: Path) -> None:
    data = (reference / "meas" / SMALL).read_bytes()
    newer = data[:18] + b"04.07" + data[23:]
    with pytest.warns(FormatWarning, match="04.07"):
        profile = hpcrun.read(newer)
    assert profile.version == "04.07" and len(profile.cct) == 13
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FormatWarning)
        assert hpcrun.to_bytes(profile) == newer


def patch_footer(data: bytes, field: int, value: int) -> bytes:
    at = len(data) - 112 + 8 * field
    return data[:at] + struct.pack(">Q", value) + data[at + 8 :]


def test_footer_offsets_past_the_end_or_out_of_order(reference: Path) -> None:
    data = (reference / "meas" / SMALL).read_bytes()
    raises_format_error(patch_footer(data, 5, 10**9), "footer", "past the footer")
    raises_format_error(patch_footer(data, 4, 0x300), "footer", "out of order")
    raises_format_error(patch_footer(data, 5, 0xB00), "footer", "before its start")
    raises_format_error(patch_footer(data, 12, 0x1800), "footer", "footer_start")
    raises_format_error(patch_footer(data, 0, 8), "footer", "hdr_start")
    raises_format_error(patch_footer(data, 13, 1), "footer", "HPCRUNsm")


def test_a_section_must_end_exactly_where_the_footer_says(reference: Path) -> None:
    data = (reference / "meas" / SMALL).read_bytes()
    raises_format_error(patch_footer(data, 5, 0xD00), "cct", "parsed to 0xcff")
    raises_format_error(patch_footer(data, 3, 0x867), "load map", "truncated")


def test_cct_parent_after_child_is_an_error() -> None:
    nodes = [(12, 0, 0, PRIMARY, 1), (16, 14, 1, 0x1000, 1), (14, 12, 0, MAIN, 1)]
    raises_format_error(hpcrun.to_bytes(make_profile(nodes)), "cct", "follows")


def test_cct_with_no_root_or_two_roots_is_an_error() -> None:
    cycle = [(12, 14, 0, PRIMARY, 1), (14, 12, 0, MAIN, 1)]
    raises_format_error(hpcrun.to_bytes(make_profile(cycle)), "cct", "no root")
    two = [(12, 0, 0, PRIMARY, 1), (14, 0, 0, PRIMARY, 1)]
    raises_format_error(hpcrun.to_bytes(make_profile(two)), "cct", "2 roots")
    # formats.md §1.5: a GPU_ROOT outlined-range root may sit beside ^Primary.
    gpu = [(12, 0, 0, PRIMARY, 1), (14, 0, 65533, 0, 1)]
    assert len(hpcrun.read(hpcrun.to_bytes(make_profile(gpu))).cct) == 2


def test_cct_duplicate_ids_and_unknown_parents_are_errors() -> None:
    dup = [(12, 0, 0, PRIMARY, 1), (14, 12, 0, MAIN, 1), (14, 12, 1, 8, 1)]
    raises_format_error(hpcrun.to_bytes(make_profile(dup)), "cct", "more than once")
    orphan = [(12, 0, 0, PRIMARY, 1), (14, 99, 0, MAIN, 1)]
    raises_format_error(hpcrun.to_bytes(make_profile(orphan)), "cct", "not in the CCT")


def test_sparse_values_on_unknown_node_or_metric_are_errors() -> None:
    data = hpcrun.to_bytes(make_profile(simple_nodes(), [(18, [(1, 0)])]))
    raises_format_error(data, "sparse metrics", "node 18")
    data = hpcrun.to_bytes(make_profile(simple_nodes(), [(16, [(1, 1)])]))
    raises_format_error(data, "sparse metrics", "metric index 1 out of range")


def test_broken_end_sentinel_is_an_error() -> None:
    data = bytearray(hpcrun.to_bytes(make_profile(simple_nodes(), [(16, [(1, 0)])])))
    end = struct.unpack(">Q", data[-112 + 88 : -112 + 96])[0]
    data[end - 12 : end - 8] = b"end?"
    raises_format_error(bytes(data), "sparse metrics", "sentinel")


def test_flipping_any_header_or_footer_byte_reads_cleanly_or_raises(reference: Path) -> None:
    data = (reference / "meas" / SMALL).read_bytes()
    hdr_end = struct.unpack(">Q", data[-104:-96])[0]
    for at in [*range(hdr_end), *range(len(data) - 112, len(data))]:
        for xor in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[at] ^= xor
            read_or_format_error(bytes(corrupt))


def read_or_format_error(data: bytes) -> HpcrunProfile | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FormatWarning)
            return hpcrun.read(data)
    except FormatError:
        return None


def test_flipping_any_section_byte_reads_cleanly_or_raises(reference: Path) -> None:
    # Every byte of every section and of the footer of small.m (holes are never read), and every
    # byte of the CCT, dictionary and sparse sections of a GPU profile.
    for name, sections in ((SMALL, range(7)), (CUDA_CPU, (2, 4, 5, 6))):
        data = (reference / "meas" / name).read_bytes()
        footer = struct.unpack(">14Q", data[-112:])
        bounds = [(footer[2 * k], footer[2 * k + 1]) for k in range(6)]
        bounds.append((len(data) - 112, len(data)))
        for k in sections:
            for at in range(*bounds[k]):
                corrupt = bytearray(data)
                corrupt[at] ^= 0x5A
                read_or_format_error(bytes(corrupt))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_corruption_reads_cleanly_or_raises_and_then_dumps(
    reference: Path, data: st.DataObject
) -> None:
    files = profiles(reference)
    raw = bytearray(files[data.draw(st.integers(0, len(files) - 1))].read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    profile = read_or_format_error(bytes(raw))
    if profile is None:
        return
    hpcrun.verify(profile)
    hpcrun.dump(profile, io.StringIO())


# ---------------------------------------------------------------------------------------------
# verify


def test_verify_reports_what_hpcrun_never_writes() -> None:
    metrics = [MetricDescriptor("a"), MetricDescriptor("b", flags=bytes(16))]
    nodes = [*simple_nodes(), (18, 14, 7, 0x10, 1)]
    profile = make_profile(nodes, [(18, [(1, 1), (1, 0)]), (16, [(0, 0)])], metrics)
    problems = hpcrun.verify(profile)
    expected = [
        "cct: nodes use load module ids [7] missing from the load map",
        "metric table: metric 1 (b): valFmt 0 is neither 1 (int) nor 2 (real)",
        "sparse metrics: nodes with values are not in CCT (file) order",
        "sparse metrics: metric indices are not strictly ascending in a node",
        "sparse metrics: a zero value is stored (hpcrun stores only non-zeros)",
    ]
    assert problems == expected


def test_verify_lists_fatal_problems_of_an_in_memory_profile_without_raising() -> None:
    nodes = [(12, 0, 0, PRIMARY, 1), (16, 14, 1, 0x1000, 1), (14, 12, 0, MAIN, 1)]
    problems = hpcrun.verify(make_profile(nodes, [(20, [(1, 3)])]))
    assert any(p.startswith("cct: ") and "follows" in p for p in problems)
    assert any("metric index 3 out of range" in p for p in problems)
    assert any("node 20, not in the CCT" in p for p in problems)


def test_verify_flags_a_root_that_is_not_primary_and_missing_header_pairs() -> None:
    profile = make_profile([(12, 0, 0, MAIN, 1)])
    profile.nvpairs = []
    problems = hpcrun.verify(profile)
    assert "cct: root 12 is not the ^Primary placeholder" in problems
    assert "header: nv-pair 'thread-id' is missing" in problems


# ---------------------------------------------------------------------------------------------
# dump


def test_dump_of_small_shows_tree_metrics_id_tuple_and_values(reference: Path) -> None:
    profile = hpcrun.read(reference / "meas" / SMALL)
    text = hpcrun.dumps(profile)
    assert "  program-name = testmeas-small\n" in text
    assert "'^Primary' <primary root>" in text and "'| Main  ' <program root>" in text
    assert "valFmt=real" in text and "type=raw" in text
    assert "NODE(LOGIC_LOCAL) physical=0x11ac0300" in text
    assert "THREAD(LOGIC_ONLY)" in text
    # children are indented one step below their parent
    lines = text.splitlines()
    primary = next(i for i, line in enumerate(lines) if "^Primary" in line)
    main = next(i for i, line in enumerate(lines) if "| Main" in line)
    indent = len(lines[primary]) - len(lines[primary].lstrip())
    assert len(lines[main]) - len(lines[main].lstrip()) == indent + 2
    values = oracle((reference / "meas" / SMALL).read_bytes())["values"]
    first = struct.unpack(">d", values[0][0].to_bytes(8, "big"))[0]
    assert f"#0 CPUTIME (sec) = {first!r}" in text


def test_dump_of_a_gpu_profile_decodes_gpu_placeholders(reference: Path) -> None:
    text = hpcrun.dumps(hpcrun.read(reference / "meas" / CUDA_CPU))
    assert "'GPUKernl' <gpu kernel>" in text and "move2proc=1" in text


def test_dump_shows_int_values_and_period_scaling() -> None:
    metrics = [MetricDescriptor("count", flags=metric_flags(value_format=1), period=1000)]
    text = hpcrun.dumps(make_profile(simple_nodes(), [(16, [(7, 0)])], metrics))
    assert "#0 count = 7 x1000 = 7000.0" in text


def test_dump_decodes_python_logical_frames(tmp_path: Path) -> None:
    modules = [LoadModule(1, "/bin/python3"), LoadModule(2, "logical/python.0badf00d")]
    nodes = [*simple_nodes(), (18, 16, 2, (3 << 32) | 12, 1), (20, 18, 2, (9 << 32) | 4, 1)]
    profile = make_profile(nodes, load_modules=modules)
    meta = logical.LogicalMetadata([logical.LogicalStanza(3, "work", 0, "app.py", 10)])
    (tmp_path / "logical").mkdir()
    logical.write(meta, tmp_path / "logical" / "python.0badf00d")
    found = hpcrun.logical_modules(profile, tmp_path)
    assert found == {2: meta}
    out = io.StringIO()
    hpcrun.dump(profile, out, logical=found)
    assert "python work (app.py:10) line 12" in out.getvalue()
    assert "logical lm 2 fid 9 line 4" in out.getvalue()
    assert "logical lm 2 fid 3 line 12" in hpcrun.dumps(profile)

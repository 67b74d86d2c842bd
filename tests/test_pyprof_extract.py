"""pyprof reads profiles without the strict reader's checks and lets extract() check them: it must
refuse exactly what ``hpcrun.read`` refuses, in the same words, and turn what it accepts into the
same arrays as before (the call-path tree, values and trace records)."""

from __future__ import annotations

import dataclasses
import struct
import warnings
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk.analysis.extract import extract
from pyhpctk.analysis.unify import RawTree
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import hpcrun, hpctrace

SMALL = "small.m/testmeas-small-000000-000-11ac0300-5560-0"
CUDA_CPU = "loops-cuda-nvidia-t.m/testmeas-loops-cuda-000000-000-590a0502-3293-0"
CCT, SPARSE = 2, 5  # sections of the footer (formats.md §1.9)


def outcome(data: bytes, trace: hpctrace.HpctraceFile | None) -> str | tuple[object, ...]:
    """The strict reader's error, or what extract() of a non-strict read gives (which must agree
    with extract() of the strict read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FormatWarning)
        try:
            strict = hpcrun.read(data)
        except FormatError as error:
            strict_error = str(error)
            try:
                extract(hpcrun.read(data, strict=False), trace, "p")
            except FormatError as again:
                assert str(again) == strict_error
                return strict_error
            raise AssertionError(
                f"extract() took a profile the reader refuses: {strict_error}"
            ) from None
        try:
            expected = snapshot(extract(strict, trace, "p"))
        except FormatError as error:
            expected = str(error)
        try:
            actual = snapshot(extract(hpcrun.read(data, strict=False), trace, "p"))
        except FormatError as error:
            actual = str(error)
    assert actual == expected
    return actual


def snapshot(data: object) -> tuple[object, ...]:
    from pyhpctk.analysis.unify import ProfileData

    assert isinstance(data, ProfileData) and isinstance(data.tree, RawTree)
    arrays = (data.value_node, data.value_metric, data.value, data.trace_time, data.trace_node)
    return (
        tuple(data.tree.parent),
        tuple(data.tree.keys),
        *(None if a is None else (a.dtype.str, a.tobytes()) for a in arrays),
    )


def section_bytes(data: bytes, section: int) -> range:
    footer = struct.unpack(">14Q", data[-112:])
    return range(footer[2 * section], footer[2 * section + 1])


def test_every_reference_profile_extracts_as_after_a_strict_read(reference: Path) -> None:
    for path in sorted((reference / "meas").glob("*/*.hpcrun")):
        trace_path = path.with_suffix(".hpctrace")
        trace = hpctrace.read(trace_path) if trace_path.exists() else None
        result = outcome(path.read_bytes(), trace)
        assert isinstance(result, tuple), result  # none of them is damaged


def test_a_damaged_cct_or_value_section_is_refused_in_the_strict_readers_words(
    reference: Path,
) -> None:
    refused = 0
    for name in (SMALL, CUDA_CPU):
        data = (reference / "meas" / (name + ".hpcrun")).read_bytes()
        trace = hpctrace.read(reference / "meas" / (name + ".hpctrace"))
        for section in (CCT, SPARSE):
            for at in section_bytes(data, section):
                for xor in (0x01, 0x5A):
                    corrupt = bytearray(data)
                    corrupt[at] ^= xor
                    refused += isinstance(outcome(bytes(corrupt), trace), str)
    assert refused > 100  # the loop did meet damage, not only harmless bytes


def damaged(profile: hpcrun.HpcrunProfile, what: str) -> bytes:
    """``profile`` (the reference small.m, 5 values on its last nodes) with one kind of damage
    the strict reader refuses."""
    cct, values = profile.cct.copy(), profile.values.copy()
    starts = profile.node_starts.copy()
    if what == "two roots":
        cct["parent_id"][1] = 0
    elif what == "id 0":
        cct["id"][2] = 0
    elif what == "duplicate id":
        cct["id"][3] = cct["id"][2]
    elif what == "missing parent":
        cct["parent_id"][3] = int(cct["id"].max()) + 7
    elif what == "parent after child":
        cct["parent_id"][1] = cct["id"][-1]
    elif what == "own parent":
        cct["parent_id"][2] = cct["id"][2]
    elif what == "unknown node":
        starts["node_id"][0] = int(cct["id"].max()) + 7
    elif what == "metric past the table":
        values["metric"][0] = len(profile.metrics)
    elif what == "first run not at 0":
        starts["start"][0] = 1
    elif what == "runs out of order":
        starts["start"][-1] = len(values) + 1
    elif what == "values of no node":
        starts = starts[:0]
    return hpcrun.to_bytes(dataclasses.replace(profile, cct=cct, values=values, node_starts=starts))


DAMAGE = (
    "two roots",
    "id 0",
    "duplicate id",
    "missing parent",
    "parent after child",
    "own parent",
    "unknown node",
    "metric past the table",
    "first run not at 0",
    "runs out of order",
    "values of no node",
)


def test_each_kind_of_damage_is_refused_in_the_strict_readers_words(reference: Path) -> None:
    profile = hpcrun.read(reference / "meas" / (SMALL + ".hpcrun"))
    assert len(profile.node_starts) >= 2 and len(profile.cct) > 4
    for what in DAMAGE:
        result = outcome(damaged(profile, what), None)
        assert isinstance(result, str), what


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_random_damage_is_refused_in_the_strict_readers_words(
    reference: Path, data: st.DataObject
) -> None:
    raw = bytearray((reference / "meas" / (CUDA_CPU + ".hpcrun")).read_bytes())
    places = [*section_bytes(bytes(raw), CCT), *section_bytes(bytes(raw), SPARSE)]
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.sampled_from(places))] = data.draw(st.integers(0, 255))
    outcome(bytes(raw), None)


def test_integer_metrics_are_converted_and_scaled_by_their_period(reference: Path) -> None:
    """Real and integer values side by side, periods other than 1 (the GPU PC-sampling profile
    of the reference data, its periods changed): the values hpcprof would scale."""
    files = sorted((reference / "meas").glob("*/*.hpcrun"))
    profile = max((hpcrun.read(f) for f in files), key=lambda p: len(p.values))
    kinds = {m.is_real for m in profile.metrics}
    assert kinds == {True, False} and len(profile.values) > 100
    profile.metrics = [
        dataclasses.replace(m, period=3 + i % 5) for i, m in enumerate(profile.metrics)
    ]
    _, metric, decoded = profile.decoded_values(scaled=True)
    extracted = extract(profile, None, "p")
    assert np.array_equal(extracted.value_metric, metric.astype(np.int64))
    assert extracted.value.tobytes() == np.asarray(decoded, dtype=np.float64).tobytes()

"""cct.db v4.0 (formats.md §3.4): byte-identical rewrites (modulo the uninitialised header bytes),
the transpose of profile.db, round trips, streamed writes and typed errors."""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import formats_helpers
from formats_helpers import (
    DATABASES,
    corruption_sweep,
    patched,
    truncations,
    written_in_pieces,
    yaml_blocks,
)
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import cctdb, cctdb_check, profiledb
from pyhpctk.formats.cctdb import CctDB, ContextValues
from pyhpctk.formats.profiledb import ProfileDB, ProfileInfo, ProfileValues


def db_file(reference: Path, name: str, file: str = "cct.db") -> Path:
    return formats_helpers.db_file(reference, name, file)


# --------------------------------------------------------------------------------------------
# hpcprof's files


@pytest.mark.parametrize("name", DATABASES)
def test_write_of_read_gives_hpcprofs_bytes_with_zeroed_junk(
    reference: Path, name: str, tmp_path: Path
) -> None:
    original = db_file(reference, name).read_bytes()
    db = cctdb.read(db_file(reference, name))
    ours = cctdb.to_bytes(db)
    # formats.md §3.9.2: hpcprof leaves 0x20-0x2f uninitialised; we write zeros there.
    assert ours[0x20:0x30] == bytes(16)
    assert original[0x20:0x30] != bytes(16)  # so the normalisation below is not a no-op
    assert ours == cctdb.normalise(original)
    assert ours[:0x20] == original[:0x20] and ours[0x30:] == original[0x30:]
    cctdb.write(db, tmp_path / "cct.db")
    assert (tmp_path / "cct.db").read_bytes() == ours
    assert cctdb.read(io.BytesIO(original), lazy=False) == db


def test_reader_ignores_the_uninitialised_header_bytes(reference: Path) -> None:
    original = db_file(reference, "small.d").read_bytes()
    junk = original[:0x20] + os.urandom(16) + original[0x30:]
    assert cctdb.read(junk) == cctdb.read(original)


@pytest.mark.parametrize("name", DATABASES)
def test_cct_db_is_the_transpose_of_profile_db(reference: Path, name: str) -> None:
    contexts = cctdb.read(db_file(reference, name))
    profiles = profiledb.read(db_file(reference, name, "profile.db"))
    assert cctdb.transpose(profiles, contexts.n_contexts) == contexts
    assert cctdb_check.verify_against_profiles(contexts, profiles) == []
    back = cctdb.transpose_back(contexts, len(profiles))
    assert back[0] == ProfileValues.empty()  # the summary is not in cct.db
    assert back[1:] == list(profiles.values)[1:]
    assert cctdb.verify(contexts) == []


def test_a_changed_value_breaks_the_transpose(reference: Path) -> None:
    image = bytearray(db_file(reference, "small.d").read_bytes())
    contexts = cctdb.read(bytes(image))
    at = int(cctdb.layout_of(contexts).values_at[3]) + 4  # context 3's first value
    image[at : at + 8] = np.float64(42.0).tobytes()
    profiles = profiledb.read(db_file(reference, "small.d", "profile.db"))
    problems = cctdb_check.verify_against_profiles(cctdb.read(bytes(image)), profiles)
    assert problems == ["context 3: values differ from profile.db's"]


def _yaml_contexts(text: str) -> list[dict[tuple[int, int], float]]:
    """Per context, {(metric, profile): value} from hpctesttool's YAML dump."""
    return yaml_blocks(text, "context: !cct.db/v4", "trace: !trace.db/v4", "cct.db/v4/PerContext")


@pytest.mark.parametrize("name", ["small", "small.nostruct"])
def test_values_match_hpctesttools_yaml_dump(reference: Path, name: str) -> None:
    expected = _yaml_contexts((reference / "dbase" / f"{name}.yaml").read_text())
    db = cctdb.read(db_file(reference, f"{name}.d"))
    assert len(expected) == db.n_contexts
    for c in range(db.n_contexts):
        block = db.context(c)
        ours = {
            (int(m), int(p)): float(v)
            for m, p, v in zip(
                block.value_metric_ids(),
                block.values["prof_index"],
                block.values["value"],
                strict=True,
            )
        }
        assert ours == expected[c]


def test_dump_lists_contexts_metrics_and_profiles(reference: Path) -> None:
    db = cctdb.read(db_file(reference, "loops-cputime-t.d"))
    out = io.StringIO()
    cctdb.dump(db, out)
    text = out.getvalue()
    nv, _ = db.value_counts()
    assert len(re.findall(r" p\d+=\S+", text)) == int(nv.sum())
    assert len(re.findall(r"^ctx \d+:", text, re.M)) == int(np.count_nonzero(nv))
    assert re.search(r"^  m\d+: p1=", text, re.M)


def test_sniff_tells_cct_db_from_the_others(reference: Path) -> None:
    d = reference / "dbase" / "small.d"
    assert cctdb.sniff((d / "cct.db").read_bytes()[:64])
    for other in ("profile.db", "trace.db", "meta.db"):
        assert not cctdb.sniff((d / other).read_bytes()[:64])


# --------------------------------------------------------------------------------------------
# Synthetic data


@st.composite
def profile_databases(draw: st.DrawFn) -> ProfileDB:
    n = draw(st.integers(1, 6))
    infos = [ProfileInfo(True, None)] + [ProfileInfo(False, ()) for _ in range(n - 1)]
    blocks = []
    for _ in range(n):
        cells = draw(
            st.dictionaries(
                st.tuples(st.integers(0, 60), st.integers(0, 2**16 - 1) | st.integers(0, 5)),
                st.floats(allow_nan=False).filter(lambda v: v != 0),
                max_size=25,
            )
        )
        keys = list(cells)
        blocks.append(
            ProfileValues.from_triples(
                [k[0] for k in keys], [k[1] for k in keys], [cells[k] for k in keys]
            )
        )
    return ProfileDB(infos, blocks)


def slow_transpose(db: ProfileDB, n_contexts: int) -> CctDB:
    """The obvious oracle: a dictionary of dictionaries, one value at a time."""
    cells: dict[int, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for p, (info, block) in enumerate(db):
        if info.is_summary:
            continue
        for c, m, v in zip(
            block.value_ctx_ids().tolist(),
            block.values["metric_id"].tolist(),
            block.values["value"].tolist(),
            strict=True,
        ):
            cells[c][m][p] = v
    contexts = []
    for c in range(n_contexts):
        triples = [(m, p, v) for m, ps in cells[c].items() for p, v in ps.items()]
        contexts.append(
            ContextValues.from_triples(
                [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples]
            )
        )
    return CctDB(contexts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile_databases(), st.integers(0, 5))
def test_transpose_agrees_with_the_slow_oracle_and_inverts(db: ProfileDB, extra: int) -> None:
    top = max((int(b.ctx_ids()[-1]) + 1 for b in db.values[1:] if b.n_contexts), default=0)
    fast = cctdb.transpose(db, top + extra)
    assert fast == slow_transpose(db, top + extra)
    assert cctdb.transpose(db).n_contexts == top
    assert cctdb.transpose_back(fast, len(db))[1:] == list(db.values)[1:]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile_databases())
def test_read_of_write_gives_the_same_database(db: ProfileDB) -> None:
    contexts = cctdb.transpose(db)
    listed = CctDB(list(contexts.values))  # same data, not packed
    image = cctdb.to_bytes(contexts)
    assert cctdb.to_bytes(listed) == image
    back = cctdb.read(image)
    assert back == contexts == listed
    assert cctdb.to_bytes(back) == image
    assert cctdb.read(image, lazy=False) == contexts


@settings(max_examples=25, deadline=None)
@given(profile_databases(), st.randoms(use_true_random=False))
def test_blocks_streamed_in_any_order_give_the_same_file(db: ProfileDB, rnd: random.Random) -> None:
    contexts = cctdb.transpose(db)
    order = list(range(contexts.n_contexts))
    rnd.shuffle(order)
    image = written_in_pieces(
        cctdb.layout_of(contexts),
        order,
        cctdb.write_head,
        lambda fd, plan, c: cctdb.write_block(fd, plan, c, contexts.values[c]),
        cctdb.write_footer,
    )
    assert image == cctdb.to_bytes(contexts)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cct.db")
        cctdb.write(contexts, path)  # the chunked whole-object writer
        assert Path(path).read_bytes() == cctdb.to_bytes(contexts)


def test_chunked_writer_crosses_chunk_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(7)
    contexts = [
        ContextValues.from_triples(rng.integers(0, 4, 6), np.arange(6), rng.random(6) + 1.0)
        if c % 3
        else ContextValues.empty()
        for c in range(50)
    ]
    db = CctDB(contexts)
    monkeypatch.setattr(cctdb, "_CHUNK_BYTES", 100)
    cctdb.write(db, tmp_path / "cct.db")
    assert (tmp_path / "cct.db").read_bytes() == cctdb.to_bytes(db)
    assert cctdb.read(tmp_path / "cct.db") == db


def test_layout_places_blocks_in_ctx_order_4_aligned() -> None:
    plan = cctdb.layout([2, 0, 1], [1, 0, 3])
    first = 0x40 + 3 * 32
    assert len(plan.head) == first
    assert plan.values_at.tolist() == [first, first + 24 + 12, first + 24 + 12]
    assert plan.metric_indices_at.tolist() == [first + 24, first + 36, first + 36 + 12]
    assert plan.footer_at == first + 36 + 12 + 32  # 3 metric indices: 30 bytes, padded to 32


# --------------------------------------------------------------------------------------------
# Damaged files


@pytest.fixture()
def small(reference: Path) -> bytes:
    return db_file(reference, "small.d").read_bytes()


def _full_read(image: bytes) -> CctDB:
    """Read eagerly (one vectorised pass), and check it agrees with the lazy, per-context path."""
    lazy_problems = None
    with contextlib.suppress(FormatError):
        lazy_problems = cctdb.verify(cctdb.read(image))
    try:
        db = cctdb.read(image, lazy=False)
    except FormatError as error:
        assert error.section.endswith(" values") <= bool(lazy_problems)
        raise
    assert lazy_problems == []  # what the eager read accepts, every lazy access accepts
    assert cctdb.verify(db) == []
    cctdb.dump(db, io.StringIO())
    return db


@pytest.mark.filterwarnings("ignore::pyhpctk.errors.FormatWarning")
def test_truncation_at_every_offset_is_a_format_error(small: bytes) -> None:
    whole = cctdb.read(small)
    for cut in truncations(small, cctdb.read, cctdb.FOOTER):
        with contextlib.suppress(FormatError):
            assert _full_read(cut) == whole


@pytest.mark.parametrize(
    ("offset", "raw", "section", "problem"),
    [
        (0, b"hpctoolkit", "header", "bad magic"),
        (10, b"prof", "header", "format id"),
        (14, bytes([5]), "header", "major version"),
        (-8, b"__ctx.dc", "footer", "missing footer"),
        (0x3C, bytes([16]), "CtxInfos", "szCtx 16"),
    ],
)
def test_bad_headers_name_section_and_problem(
    small: bytes, offset: int, raw: bytes, section: str, problem: str
) -> None:
    with pytest.raises(FormatError) as caught:
        cctdb.read(patched(small, offset, raw))
    assert (caught.value.section, caught.value.path) == (section, "<buffer>")
    assert problem in caught.value.problem


def test_newer_minor_version_warns_and_reads(small: bytes) -> None:
    with pytest.warns(FormatWarning):
        db = cctdb.read(patched(small, 15, bytes([1])))
    assert db == cctdb.read(small)


def test_pointer_past_the_end_is_a_format_error(small: bytes) -> None:
    # context 2's pMetricIndices ({CI} at 0x40 + 32 * c, pMetricIndices at +0x18)
    image = patched(small, 0x40 + 2 * 32 + 0x18, (len(small) - 12).to_bytes(8, "little"))
    with pytest.raises(FormatError, match="CtxInfos: context 2: block points past the end"):
        cctdb.read(image)


def test_unsorted_metric_ids_are_found_when_the_context_is_read(small: bytes) -> None:
    db = cctdb.read(small)
    c = next(c for c in range(db.n_contexts) if db.context(c).n_metrics >= 2)
    at = int(cctdb.layout_of(db).metric_indices_at[c])
    first, second = small[at : at + 10], small[at + 10 : at + 20]
    image = patched(small, at, second[:2] + first[2:] + first[:2] + second[2:])
    lazy = cctdb.read(image)
    assert lazy.context(0) == db.context(0)
    with pytest.raises(FormatError, match=f"context {c} values: metric ids are not strictly"):
        lazy.context(c)
    assert any(f"context {c}:" in p for p in cctdb.verify(lazy))


def test_unsorted_profile_indices_are_a_format_error(reference: Path) -> None:
    image = db_file(reference, "loops-cputime-t.d").read_bytes()
    db = cctdb.read(image)
    c = next(
        c
        for c in range(db.n_contexts)
        if len(db.context(c).metric(int(db.context(c).metric_ids()[0]))) >= 2
    )
    at = int(cctdb.layout_of(db).values_at[c])
    image = patched(image, at, image[at + 12 : at + 24] + image[at : at + 12])
    with pytest.raises(FormatError, match="profile indices are not strictly ascending"):
        cctdb.read(image, lazy=False)


@pytest.mark.parametrize("name", ["small.d", "loops-cuda-nvidia-t.nostruct.d"])
def test_every_corrupted_byte_gives_a_format_error_or_a_readable_file(
    reference: Path, name: str
) -> None:
    image = db_file(reference, name).read_bytes()
    n_contexts = int.from_bytes(image[0x38:0x3C], "little")
    infos_end = 0x40 + 32 * n_contexts
    # every byte of the header and context infos; every third byte of the blocks
    offsets = [*range(infos_end), *range(infos_end, len(image), 3), len(image) - 1]
    assert corruption_sweep(image, offsets, _full_read) > 0


@st.composite
def raw_blocks(draw: st.DrawFn) -> ContextValues:
    """Blocks with arbitrary (often broken) ids, starts and values."""
    nm = draw(st.integers(0, 5))
    nv = draw(st.integers(0, 8))
    metrics = np.zeros(nm, cctdb.CCT_METRIC_INDEX_DTYPE)
    metrics["metric_id"] = draw(st.lists(st.integers(0, 4), min_size=nm, max_size=nm))
    metrics["start"] = draw(st.lists(st.integers(0, 9), min_size=nm, max_size=nm))
    values = np.zeros(nv, cctdb.CCT_VALUE_DTYPE)
    values["prof_index"] = draw(st.lists(st.integers(0, 4), min_size=nv, max_size=nv))
    values["value"] = draw(st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=nv, max_size=nv))
    return ContextValues(metrics, values)


@settings(max_examples=120, deadline=None)
@given(st.lists(raw_blocks(), max_size=4))
def test_the_vectorised_check_agrees_with_the_per_context_check(
    blocks: list[ContextValues],
) -> None:
    mb = np.cumsum([0] + [b.n_metrics for b in blocks])
    vb = np.cumsum([0] + [b.n_values for b in blocks])
    metrics = np.concatenate(
        [b.metric_indices for b in blocks] + [ContextValues.empty().metric_indices]
    )
    values = np.concatenate([b.values for b in blocks] + [ContextValues.empty().values])
    packed = cctdb.packed_problems(metrics, values, mb, vb)
    per_block = [(c, p) for c, b in enumerate(blocks) for p in b.problems()]
    # every rule broken somewhere is reported once, for the first context that breaks it
    first: dict[str, int] = {}
    for c, p in per_block:
        first.setdefault(p, c)
    first_packed: dict[str, int] = {}
    for c, p in packed:
        first_packed[p] = min(c, first_packed.get(p, c))
    assert first_packed == first

"""profile.db v4.0 (formats.md §3.3): byte-identical rewrites of hpcprof's files, round trips,
streamed writes, lazy reads, and typed errors for damaged files."""

from __future__ import annotations

import contextlib
import io
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
    yaml_blocks,
)
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import profiledb
from pyhpctk.formats.profiledb import IdTupleElement, ProfileDB, ProfileInfo, ProfileValues


def profile_db(reference: Path, name: str) -> Path:
    return db_file(reference, name, "profile.db")


# --------------------------------------------------------------------------------------------
# hpcprof's files


@pytest.mark.parametrize("name", DATABASES)
def test_write_of_read_gives_hpcprofs_bytes(reference: Path, name: str, tmp_path: Path) -> None:
    original = profile_db(reference, name).read_bytes()
    db = profiledb.read(profile_db(reference, name))
    assert profiledb.to_bytes(db) == original
    profiledb.write(db, tmp_path / "profile.db")  # the os.pwrite path
    assert (tmp_path / "profile.db").read_bytes() == original
    stream = io.BytesIO()
    profiledb.write(db, stream)
    assert stream.getvalue() == original
    assert profiledb.read(io.BytesIO(original)) == db  # a binary file object reads too


@pytest.mark.parametrize("name", DATABASES)
def test_reference_files_verify_clean_and_read_the_same_lazily(reference: Path, name: str) -> None:
    lazy = profiledb.read(profile_db(reference, name))
    eager = profiledb.read(profile_db(reference, name).read_bytes(), lazy=False)
    assert profiledb.verify(lazy) == []
    assert lazy == eager
    assert lazy.profiles[0].is_summary and lazy.profiles[0].id_tuple is None
    assert all(not p.is_summary and p.id_tuple for p in lazy.profiles[1:])


def test_block_order_is_recovered_from_the_file(reference: Path) -> None:
    # formats.md §3.3: threads' blocks come in arbitrary order, the summary's block last.
    path = profile_db(reference, "loops-cputime-t.d")
    db = profiledb.read(path)
    raw = path.read_bytes()
    infos = np.frombuffer(raw, profiledb.PROFILE_INFO_DTYPE, len(db), 0x40)
    assert list(db.block_order) == np.argsort(infos["p_values"]).tolist()
    assert db.block_order[-1] == 0
    assert db.block_order != profiledb.default_block_order(db.profiles)


def test_reads_are_lazy_views_of_the_mapped_file(reference: Path) -> None:
    db = profiledb.read(profile_db(reference, "loops-cputime-t.d"))
    block = db.block(1)
    assert not block.values.flags.owndata and not block.values.flags.writeable


def _yaml_profiles(text: str) -> list[dict[tuple[int, int], float]]:
    """Per profile, {(context, metric): value} from hpctesttool's YAML dump."""
    return yaml_blocks(
        text, "profile: !profile.db/v4", "context: !cct.db/v4", "profile.db/v4/Profile"
    )


@pytest.mark.parametrize("name", ["small", "small.nostruct"])
def test_values_match_hpctesttools_yaml_dump(reference: Path, name: str) -> None:
    expected = _yaml_profiles((reference / "dbase" / f"{name}.yaml").read_text())
    db = profiledb.read(profile_db(reference, f"{name}.d"))
    assert len(expected) == len(db)
    for i, block in enumerate(db.values):
        ours = {
            (int(c), int(m)): float(v)
            for c, m, v in zip(
                block.value_ctx_ids(), block.values["metric_id"], block.values["value"], strict=True
            )
        }
        assert ours == expected[i]


@pytest.mark.parametrize("name", ["small.d", "loops-cuda-nvidiapc-t.d"])
def test_context_lookup_agrees_with_a_linear_scan(reference: Path, name: str) -> None:
    block = profiledb.read(profile_db(reference, name)).block(0)
    ctx = block.value_ctx_ids().tolist()
    metric = block.values["metric_id"].tolist()
    for c in range(int(max(ctx)) + 2):
        want = [m for m, cc in zip(metric, ctx, strict=True) if cc == c]
        assert block.context(c)["metric_id"].tolist() == want


def test_dump_shows_id_tuples_and_every_value(reference: Path) -> None:
    db = profiledb.read(profile_db(reference, "loops-cuda-nvidia-t.d"))
    out = io.StringIO()
    profiledb.dump(db, out)
    text = out.getvalue()
    assert "profile 0: summary" in text
    assert "NODE 0 (physical 0x590a0502) / GPUCONTEXT 1 / GPUSTREAM 7" in text
    pairs = re.findall(r" m(\d+)=(\S+)", text)
    nv, _ = db.value_counts()
    assert len(pairs) == int(nv.sum())
    assert {float(v) for _, v in pairs} == {
        float(x) for b in db.values for x in b.values["value"].tolist()
    }


def test_sniff_tells_profile_db_from_the_others(reference: Path) -> None:
    d = reference / "dbase" / "small.d"
    assert profiledb.sniff((d / "profile.db").read_bytes()[:64])
    for other in ("cct.db", "trace.db", "meta.db"):
        assert not profiledb.sniff((d / other).read_bytes()[:64])


# --------------------------------------------------------------------------------------------
# Synthetic databases: round trips and streamed writes

id_elements = st.builds(
    IdTupleElement,
    kind=st.integers(0, 255),
    is_physical=st.booleans(),
    logical_id=st.integers(0, 2**32 - 1),
    physical_id=st.integers(0, 2**64 - 1),
)


@st.composite
def blocks(draw: st.DrawFn) -> ProfileValues:
    cells = draw(
        st.dictionaries(
            st.tuples(st.integers(0, 2**32 - 1) | st.integers(0, 40), st.integers(0, 2**16 - 1)),
            st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: v != 0),
            max_size=30,
        )
    )
    keys = list(cells)
    return ProfileValues.from_triples(
        [k[0] for k in keys], [k[1] for k in keys], [cells[k] for k in keys]
    )


@st.composite
def databases(draw: st.DrawFn) -> ProfileDB:
    n = draw(st.integers(0, 6))
    profiles = [
        ProfileInfo(
            is_summary=draw(st.booleans()),
            id_tuple=draw(st.none() | st.lists(id_elements, max_size=4).map(tuple)),
        )
        for _ in range(n)
    ]
    values = [draw(blocks()) for _ in range(n)]
    order = draw(st.none() | st.permutations(range(n)))
    return ProfileDB(profiles, values, order)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(databases())
def test_read_of_write_gives_the_same_database(db: ProfileDB) -> None:
    image = profiledb.to_bytes(db)
    back = profiledb.read(image)
    assert back == db
    assert profiledb.to_bytes(back) == image
    assert profiledb.read(image, lazy=False) == db


@settings(max_examples=25, deadline=None)
@given(databases(), st.randoms(use_true_random=False))
def test_blocks_streamed_in_any_order_give_the_same_file(db: ProfileDB, rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    indices = list(range(len(db)))
    rnd.shuffle(indices)  # ranks finish in any order
    image = written_in_pieces(
        profiledb.layout_of(db),
        indices,
        profiledb.write_head,
        lambda fd, plan, i: profiledb.write_block(fd, plan, i, db.values[i]),
        profiledb.write_footer,
    )
    assert image == profiledb.to_bytes(db)


def test_layout_is_an_exclusive_scan_of_block_sizes() -> None:
    profiles = [ProfileInfo(True, None), ProfileInfo(False, ()), ProfileInfo(False, ())]
    nv, nc = [3, 0, 5], [2, 0, 1]
    plan = profiledb.layout(profiles, nv, nc, [2, 1, 0])
    first = len(plan.head)
    size2 = 52 + 12  # 5 values: 50 bytes, padded to 52; then one 12-byte index
    assert plan.values_at.tolist() == [first + size2, first + size2, first]
    assert plan.ctx_indices_at.tolist() == [first + size2 + 32, first + size2, first + 52]
    assert plan.footer_at == first + size2 + 32 + 24
    assert all(int(a) % 4 == 0 for a in plan.values_at)


def test_equality_sees_a_changed_value_and_a_changed_order() -> None:
    block = ProfileValues.from_triples([1, 1, 2], [0, 3, 0], [1.0, 2.0, 3.0])
    other = ProfileValues.from_triples([1, 1, 2], [0, 3, 0], [1.0, 2.5, 3.0])
    infos = [ProfileInfo(True, None), ProfileInfo(False, ())]
    assert ProfileDB(infos, [block, block]) == ProfileDB(infos, [block, block], [1, 0])
    assert ProfileDB(infos, [block, block]) != ProfileDB(infos, [block, other])
    assert ProfileDB(infos, [block, block]) != ProfileDB(infos, [block, block], [0, 1])


def test_from_triples_sorts_and_drops_zeros() -> None:
    block = ProfileValues.from_triples([5, 2, 5, 2, 7], [1, 4, 0, 2, 9], [1.0, 2.0, 3.0, 4.0, 0.0])
    assert block.ctx_ids().tolist() == [2, 5]
    assert block.values["metric_id"].tolist() == [2, 4, 0, 1]
    assert block.values["value"].tolist() == [4.0, 2.0, 3.0, 1.0]
    assert block.problems() == []
    with pytest.raises(ValueError, match="twice"):
        ProfileValues.from_triples([1, 1], [2, 2], [1.0, 2.0])


# --------------------------------------------------------------------------------------------
# Damaged files


@pytest.fixture()
def small(reference: Path) -> bytes:
    return profile_db(reference, "small.d").read_bytes()


def _full_read(image: bytes) -> ProfileDB:
    db = profiledb.read(image, lazy=False)
    profiledb.verify(db)
    profiledb.dump(db, io.StringIO())
    return db


@pytest.mark.filterwarnings("ignore::pyhpctk.errors.FormatWarning")
def test_truncation_at_every_offset_is_a_format_error(small: bytes) -> None:
    whole = profiledb.read(small)
    for cut in truncations(small, profiledb.read, profiledb.FOOTER):
        with contextlib.suppress(FormatError):
            assert _full_read(cut) == whole  # only dropped padding can be harmless


@pytest.mark.parametrize(
    ("offset", "raw", "section", "problem"),
    [
        (0, b"HPCTOOLKIX", "header", "bad magic"),
        (10, b"ctxt", "header", "format id"),
        (14, bytes([5]), "header", "major version"),
        (-1, b"X", "footer", "missing footer"),
    ],
)
def test_bad_headers_name_section_and_problem(
    small: bytes, offset: int, raw: bytes, section: str, problem: str
) -> None:
    image = patched(small, offset, raw)
    with pytest.raises(FormatError) as caught:
        profiledb.read(image)
    assert caught.value.section == section
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"<buffer>: {section}: ")


def test_error_names_the_file(tmp_path: Path, small: bytes) -> None:
    path = tmp_path / "profile.db"
    path.write_bytes(small[:-3])
    with pytest.raises(FormatError, match=re.escape(str(path))):
        profiledb.read(path)


def test_newer_minor_version_warns_and_reads(small: bytes) -> None:
    with pytest.warns(FormatWarning, match="minor version"):
        db = profiledb.read(patched(small, 15, bytes([1])))
    assert db == profiledb.read(small)


def test_pointer_past_the_end_is_a_format_error(small: bytes) -> None:
    # profile 1's pValues (formats.md §3.3: {PI} at 0x40 + 48 * i, pValues at +0x08)
    image = patched(small, 0x40 + 48 + 0x08, (len(small) - 20).to_bytes(8, "little"))
    with pytest.raises(FormatError, match="ProfileInfos: profile 1: value block points past"):
        profiledb.read(image)


def test_unsorted_context_ids_are_found_when_the_block_is_read(small: bytes) -> None:
    db = profiledb.read(small)
    at = int(profiledb.layout_of(db).ctx_indices_at[1])
    first, second = small[at : at + 12], small[at + 12 : at + 24]
    # swap the ctx ids of the first two entries, keeping their start indices
    image = patched(small, at, second[:4] + first[4:] + first[:4] + second[4:])
    lazy = profiledb.read(image)  # lazy: the damage is not touched yet
    assert lazy.block(0) == db.block(0)
    with pytest.raises(FormatError, match="profile 1 values: context ids are not strictly"):
        lazy.block(1)
    with pytest.raises(FormatError):
        profiledb.read(image, lazy=False)


def test_unsorted_metric_ids_are_a_format_error(small: bytes) -> None:
    db = profiledb.read(small)
    block = db.block(1)
    ctx = int(np.flatnonzero(np.diff(block.bounds().astype(np.int64)) >= 2)[0])
    start = int(block.ctx_indices["start"][ctx])
    at = int(profiledb.layout_of(db).values_at[1]) + 10 * start
    a, b = small[at : at + 10], small[at + 10 : at + 20]
    image = patched(small, at, b + a)
    with pytest.raises(FormatError, match="metric ids are not strictly ascending"):
        profiledb.read(image, lazy=False)


@pytest.mark.parametrize("name", ["small.d", "loops-cuda-nvidia-t.nostruct.d"])
def test_every_corrupted_byte_gives_a_format_error_or_a_readable_file(
    reference: Path, name: str
) -> None:
    image = profile_db(reference, name).read_bytes()

    def swept_read(bad: bytes) -> ProfileDB:
        lazy_problems = None
        with contextlib.suppress(FormatError):
            lazy_problems = profiledb.verify(profiledb.read(bad))
        try:
            return _full_read(bad)
        except FormatError as error:
            # a damaged block found by the eager read is a problem for the lazy verify
            assert error.section.endswith(" values") <= bool(lazy_problems)
            raise

    def flip(offset: int) -> int:
        return 0xFF if offset % 2 else 0x01

    assert corruption_sweep(image, range(len(image)), swept_read, flip) > 0


# --------------------------------------------------------------------------------------------
# The IdTuples section, built at once, against one tuple at a time


def _id_tuples_one_by_one(profiles: list[ProfileInfo], base: int) -> tuple[bytes, list[int]]:
    """The slow, obvious IdTuples section (formats.md §3.3): each tuple's header and elements."""
    out = bytearray()
    pointers = []
    for info in profiles:
        if info.id_tuple is None:
            pointers.append(0)
            continue
        pointers.append(base + len(out))
        out += len(info.id_tuple).to_bytes(2, "little") + bytes(6)
        for e in info.id_tuple:
            out += bytes([e.kind, 0]) + (
                profiledb.ID_FLAG_PHYSICAL if e.is_physical else 0
            ).to_bytes(2, "little")
            out += e.logical_id.to_bytes(4, "little") + e.physical_id.to_bytes(8, "little")
    return bytes(out), pointers


element_st = st.builds(
    IdTupleElement,
    st.integers(0, 255),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**64 - 1),
)
info_st = st.one_of(
    st.builds(ProfileInfo, st.just(True), st.none()),
    st.builds(ProfileInfo, st.just(False), st.lists(element_st, max_size=5).map(tuple)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(info_st, max_size=20), st.integers(0, 100))
def test_id_tuples_section_matches_one_tuple_at_a_time(
    profiles: list[ProfileInfo], base8: int
) -> None:
    built = profiledb._id_tuples_bytes(profiles, 8 * base8)
    assert built == _id_tuples_one_by_one(profiles, 8 * base8)

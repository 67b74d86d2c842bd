"""``pyhpctk verify`` refuses content no tool can write: ids missing from their tables, NaN and
negative times, non-numeric header nv-pairs, trace times outside their file's own bounds.

Each test corrupts one real file (HPCToolkit's reference data, or one our writers wrote) in
``tmp_path`` and asserts the one line ``verify`` prints; ``dump`` still shows the file.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.main import main
from pyhpctk.formats import cctdb, hpcrun, logical, metadb, profiledb, tracedb
from pyhpctk.formats.hpcrun_model import CCT_NODE_DTYPE, LoadModule

SMALL_STEM = "testmeas-small-000000-000-11ac0300-5560-0"


def verify_problems(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """``verify``'s problem lines (exit status 1: problems, nothing unreadable)."""
    status = main(["verify", str(path)])
    out, err = capsys.readouterr()
    assert status == 1, (out, err)
    assert err == ""
    return [line.removeprefix("problem: ") for line in out.splitlines()]


def dump_text(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["dump", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def patch(path: Path, offset: int, layout: str, *values: object) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(layout, data, offset, *values)
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------
# Measurements


@pytest.fixture
def small(reference: Path, tmp_path: Path) -> Path:
    """A copy of small.m: one .hpcrun and its .hpctrace."""
    meas = tmp_path / "small.m"
    meas.mkdir()
    for suffix in (".hpcrun", ".hpctrace"):
        shutil.copyfile(
            reference / "meas" / "small.m" / (SMALL_STEM + suffix), meas / (SMALL_STEM + suffix)
        )
    return meas


def rewrite_profile(meas: Path, change: object) -> Path:
    """Read small.m's profile, let ``change(profile)`` edit it, write it back with our writer."""
    path = meas / (SMALL_STEM + ".hpcrun")
    profile = hpcrun.read(path)
    profile.values = profile.values.copy()
    change(profile)  # type: ignore[operator]
    hpcrun.write(profile, path)
    return path


def with_header(profile: hpcrun.HpcrunProfile, key: str, value: str) -> None:
    profile.nvpairs = [(k, value if k == key else v) for k, v in profile.nvpairs]


def test_a_header_number_that_is_not_a_number_is_a_problem(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewrite_profile(small, lambda p: with_header(p, "mpi-rank", "%"))
    assert verify_problems(small, capsys) == [
        f"{path}: header: nv-pair 'mpi-rank' is '%', not a decimal integer"
    ]
    assert "mpi-rank = %" in dump_text(small, capsys)


def test_a_trace_bound_that_is_not_a_number_is_a_problem(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewrite_profile(small, lambda p: with_header(p, "trace-max-time", "soon"))
    assert verify_problems(path, capsys) == [
        f"{path}: header: nv-pair 'trace-max-time' is 'soon', not a decimal number of nanoseconds"
    ]


def test_a_trace_span_that_ends_before_it_starts_is_a_problem(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def swap(profile: hpcrun.HpcrunProfile) -> None:
        low, high = profile.header("trace-min-time"), profile.header("trace-max-time")
        with_header(profile, "trace-min-time", high)
        with_header(profile, "trace-max-time", low)

    path = rewrite_profile(small, swap)
    problems = verify_problems(path, capsys)
    assert problems == [
        f"{path}: header: trace-min-time 1714021985220628000 is after trace-max-time "
        "1714021984008891000"
    ]


def set_value(profile: hpcrun.HpcrunProfile, index: int, value: float) -> None:
    profile.values["value_bits"][index] = int.from_bytes(struct.pack(">d", value), "big")


def test_a_nan_value_is_a_problem(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = rewrite_profile(small, lambda p: set_value(p, 1, float("nan")))
    assert verify_problems(path, capsys) == [
        f"{path}: sparse metrics: node 28 has a value that is not a finite number, nan, for "
        "metric 0 (CPUTIME (sec)) (1 such values)"
    ]
    assert "CPUTIME (sec) = nan" in dump_text(path, capsys)


def test_a_negative_time_is_a_problem(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = rewrite_profile(small, lambda p: set_value(p, 2, -0.25))
    assert verify_problems(path, capsys) == [
        f"{path}: sparse metrics: node 38 has a negative time, -0.25, for metric 0 "
        "(CPUTIME (sec)) (1 such values)"
    ]


def test_dump_shows_a_profile_whose_value_names_a_metric_the_table_lacks(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def point_past_the_table(profile: hpcrun.HpcrunProfile) -> None:
        profile.values["metric"][4] = 9

    path = rewrite_profile(small, point_past_the_table)
    assert main(["verify", str(path)]) == 2  # hpcprof could not use it: unreadable
    assert "metric index 9 out of range" in capsys.readouterr().err
    text = dump_text(path, capsys)
    assert "# problem: sparse metrics: metric index 9 out of range: the table has 1 metrics" in text
    assert "metric=9" in text


def test_trace_times_outside_the_profiles_own_bounds_are_a_problem(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = small / (SMALL_STEM + ".hpctrace")
    # formats.md §2: record 12 (the last) at 32 + 12 * 12; one second past trace-max-time.
    patch(trace, 32 + 12 * 12, ">Q", 1714021985220628000 + 10**9)
    assert verify_problems(small, capsys) == [
        f"{trace}: records: record 12 at time 1714021986220628000 lies outside the profile's "
        "trace-min-time..trace-max-time 1714021984008891000..1714021985220628000 "
        "(1 such records)"
    ]


def test_a_python_frame_naming_a_function_its_logical_file_lacks_is_a_problem(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "logical/python.0badf00d"

    def add_python_frames(profile: hpcrun.HpcrunProfile) -> None:
        profile.load_modules = [*profile.load_modules, LoadModule(18, name, 0)]
        frames = np.array(
            [(42, 20, 18, (1 << 32) | 5, 1), (44, 42, 18, (7 << 32) | 9, 1)], CCT_NODE_DTYPE
        )
        profile.cct = np.concatenate([profile.cct, frames])

    path = rewrite_profile(small, add_python_frames)
    (small / "logical").mkdir()
    logical.write(
        logical.LogicalMetadata([logical.LogicalStanza(1, "main", 0, "a.py", 1)]), small / name
    )
    assert verify_problems(small, capsys) == [
        f"{path}: cct: nodes 44 name Python functions (fids 7) that {name} does not list"
    ]


# ---------------------------------------------------------------------------------------------
# Databases


@pytest.fixture
def small_db(reference: Path, tmp_path: Path) -> Path:
    db = tmp_path / "small.d"
    for name in ("meta.db", "profile.db", "cct.db", "trace.db"):
        db.mkdir(exist_ok=True)
        shutil.copyfile(reference / "dbase" / "small.d" / name, db / name)
    return db


def profile_block(db: Path, index: int) -> tuple[int, int, int, int]:
    """``(pValues, nValues, pCtxIndices, nCtxs)`` of profile ``index`` of ``db/profile.db``."""
    blocks = profiledb.read(db / "profile.db").values
    assert isinstance(blocks, profiledb._db.FileBlocks)
    (nv, nc), (pv, pc) = blocks.counts(), blocks.pointers()
    return int(pv[index]), int(nv[index]), int(pc[index]), int(nc[index])


def context_block(db: Path, ctx: int) -> tuple[int, int]:
    """``(pValues, pMetricIndices)`` of context ``ctx`` of ``db/cct.db``."""
    blocks = cctdb.read(db / "cct.db").values
    assert isinstance(blocks, profiledb._db.FileBlocks)
    pv, pm = blocks.pointers()
    return int(pv[ctx]), int(pm[ctx])


def test_a_nan_in_profile_db_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p_values, _, _, _ = profile_block(small_db, 1)
    path = small_db / "profile.db"
    patch(path, p_values + 2, "<d", float("nan"))  # {u16 metricId; f64 value}, formats.md §3.3
    assert verify_problems(path, capsys) == [
        f"{path}: profile 1: 1 values are not finite numbers (the first is nan)"
    ]
    assert "=nan" in dump_text(path, capsys)


def test_a_nan_in_cct_db_is_a_problem(small_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p_values, _ = context_block(small_db, 0)
    path = small_db / "cct.db"
    patch(path, p_values + 4, "<d", float("inf"))  # {u32 profIndex; f64 value}, §3.4
    assert verify_problems(path, capsys) == [
        f"{path}: context 0: 1 values are not finite numbers (the first is inf)"
    ]


def test_a_profile_context_far_past_the_context_count_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, p_ctx, n_ctx = profile_block(small_db, 1)
    patch(small_db / "profile.db", p_ctx + 12 * (n_ctx - 1), "<I", 0xFFFFFF00)  # the last ctxId
    problems = verify_problems(small_db, capsys)
    assert (
        f"{small_db / 'profile.db'}: profile 1: contexts 4294967040 are past cct.db's context "
        "count 24" in problems
    )


def test_a_meta_db_context_past_the_context_count_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # cct.db with fewer contexts: nCtxs (formats.md §3.4, at 0x30 + 8) cut from 24 to 20.
    patch(small_db / "cct.db", 0x30 + 8, "<I", 20)
    problems = verify_problems(small_db, capsys)
    assert f"{small_db / 'meta.db'}: contexts 21, 22 are past cct.db's context count 20" in (
        problems
    )


def test_a_metric_id_meta_db_does_not_define_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p_values, n_values, _, _ = profile_block(small_db, 1)
    # The last value of the last context: raising its metric id keeps the ids ascending.
    patch(small_db / "profile.db", p_values + 10 * (n_values - 1), "<H", 999)
    p_values, n_values, _, _ = profile_block(small_db, 0)  # the summary: statMetricIds
    patch(small_db / "profile.db", p_values + 10 * (n_values - 1), "<H", 998)
    problems = verify_problems(small_db, capsys)
    profile = small_db / "profile.db"
    assert f"{profile}: profile 1: metric ids 999 are not propMetricIds of meta.db" in problems
    assert f"{profile}: profile 0: metric ids 998 are not statMetricIds of meta.db" in problems


def test_a_cct_db_metric_or_profile_that_does_not_exist_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p_values, p_metrics = context_block(small_db, 0)
    patch(small_db / "cct.db", p_metrics, "<H", 77)  # context 0's only metric (execution, 3)
    patch(small_db / "cct.db", p_values, "<I", 5)  # its only profile (1 of 2)
    problems = verify_problems(small_db, capsys)
    cct = small_db / "cct.db"
    assert f"{cct}: context 0: metric ids 77 are not propMetricIds of meta.db" in problems
    assert (
        f"{cct}: context 0: profile indices 5 are not thread profiles of profile.db (2 profiles)"
        in problems
    )


def test_a_negative_time_in_a_database_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p_values, _, _, _ = profile_block(small_db, 1)
    patch(small_db / "profile.db", p_values + 2, "<d", -1.5)
    problems = verify_problems(small_db, capsys)
    assert (
        f"{small_db / 'profile.db'}: profile 1: 1 negative times (metric ids 3, first -1.5)"
        in problems
    )


def test_an_id_tuple_kind_without_a_name_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuples_at = int(np.frombuffer((small_db / "profile.db").read_bytes(), "<u8", 1, 0x28)[0])
    patch(small_db / "profile.db", tuples_at + 8, "B", 42)  # the first element's kind (§3.3)
    problems = verify_problems(small_db, capsys)
    assert (
        f"{small_db / 'profile.db'}: profile 1: id tuple kinds [42] have no name in meta.db "
        "(8 id names)" in problems
    )


def trace_header_at(db: Path) -> int:
    """Where trace.db's first {CTH} is (formats.md §3.5: pTraces at 0x20)."""
    return int(np.frombuffer((db / "trace.db").read_bytes(), "<u8", 1, 0x20)[0])


def test_a_trace_line_of_the_summary_profile_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    patch(small_db / "trace.db", trace_header_at(small_db), "<I", 0)
    problems = verify_problems(small_db, capsys)
    assert (
        f"{small_db / 'trace.db'}: line 0: profile index 0 is not a thread profile of profile.db "
        "(2 profiles)" in problems
    )


def test_two_trace_lines_of_one_profile_are_a_problem(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.db"
    shutil.copyfile(reference / "dbase" / "loops-cputime-t.d" / "trace.db", path)
    at = int(np.frombuffer(path.read_bytes(), "<u8", 1, 0x20)[0])
    patch(path, at + 24, "<I", 1)  # line 1 (profile 2) now claims profile 1 as well
    assert verify_problems(path, capsys) == [f"{path}: profiles [1] have more than one trace line"]


def test_a_trace_db_range_that_ends_before_it_starts_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_db / "trace.db"
    low, high = struct.unpack_from("<QQ", path.read_bytes(), 0x30)
    patch(path, 0x30, "<QQ", high, low)
    problems = verify_problems(path, capsys)
    assert f"{path}: the database's range {high}..{low} ends before it starts" in problems


def test_a_meta_db_string_outside_the_strings_section_is_a_problem(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_db / "meta.db"
    meta = metadb.read(path)
    # Point the first module's path at the title, a string of the General section (§3.2, §3.6).
    data = path.read_bytes()
    modules_at = int(np.frombuffer(data, "<u8", 1, 0x10 + 16 * 5 + 8)[0])
    entries = int(np.frombuffer(data, "<u8", 1, modules_at)[0])
    title = int(np.frombuffer(data, "<u8", 1, int(np.frombuffer(data, "<u8", 1, 0x18)[0]))[0])
    patch(path, entries + 8, "<Q", title)
    strings_size, strings_at = struct.unpack_from("<QQ", data, 0x10 + 16 * 4)
    assert verify_problems(path, capsys) == [
        f"{path}: Modules: string pointer 0x{title:x} is not the start of a string of the "
        f"Strings section [0x{strings_at:x}, 0x{strings_at + strings_size:x})"
    ]
    assert meta.title in dump_text(path, capsys)


def test_dump_shows_a_trace_db_line_out_of_time_order(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_db / "trace.db"
    line = tracedb.read(path).lines[0]
    start = int(np.frombuffer(path.read_bytes(), "<u8", 1, trace_header_at(small_db) + 8)[0])
    patch(path, start, "<Q", int(line.elements["timestamp"][-1]) + 1)  # the first goes last
    text = dump_text(path, capsys)
    assert "# problem: element 1 goes back in time (not time-sorted)" in text
    assert f"  {int(line.elements['timestamp'][-1]) + 1} ctx " in text


def test_dump_of_a_directory_shows_every_readable_file_and_marks_the_unreadable_one(
    small_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = small_db / "profile.db"
    profile.write_bytes(profile.read_bytes()[:100])
    assert main(["dump", str(small_db)]) == 2
    out, err = capsys.readouterr()
    assert f"# unreadable: {profile}: header: section 0 at 0x30 (+112 bytes) runs past" in out
    assert "=== cct.db (cctdb)" in out and "=== trace.db (tracedb)" in out
    assert err.splitlines() == [line for line in err.splitlines() if "pyhpctk: error: " in line]
    assert len(err.splitlines()) == 1

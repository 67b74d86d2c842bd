"""pyprof-mpi's parts in one process: rounds under a memory cap, splits, the bulk tree merge.

:func:`run_distributed` over a :class:`SerialComm` runs the whole distributed code path (the
cct.db rounds, the summary with loop children sent to their parent's owner, the profile.db and
trace.db blocks written at scanned offsets) without MPI; its files must equal serial pyprof's.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk.analysis import balance
from pyhpctk.analysis.comm import SerialComm
from pyhpctk.analysis.distributed import BYTES_PER_VALUE, plan_rounds, run_distributed, split_even
from pyhpctk.analysis.exchange import (
    COLUMN_DTYPES,
    METRIC,
    PROFILE,
    PROFILE_LEN,
    RUN_CTX,
    RUN_LEN,
    VALUE,
    Columns,
    own_window,
)
from pyhpctk.analysis.metrics import SUM
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import _real_infos, _stand_ins, run
from pyhpctk.analysis.stats import TreeShape
from pyhpctk.analysis.unify import RawKey, RawTree
from pyhpctk.cli.pyprof import parse_size
from pyhpctk.errors import UsageError
from pyhpctk.formats import cctdb, profiledb

FILES = ("meta.db", "profile.db", "cct.db", "trace.db", "metrics/default.yaml")


@pytest.mark.parametrize(
    ("name", "ignore_structs", "metrics"),
    [
        ("loops-cputime-t", False, "sum"),
        ("loops-cputime-t", True, "stats"),
        ("loops-cuda-nvidia-t", False, "sum"),
        ("loops-cuda-nvidiapc-t", False, "sum"),
        ("small", False, "stats"),
    ],
)
def test_rounds_under_a_tiny_memory_cap_give_pyprofs_files(
    reference: Path, tmp_path: Path, name: str, ignore_structs: bool, metrics: str
) -> None:
    measurement = reference / "meas" / f"{name}.m"
    serial = tmp_path / "serial"
    run(
        ProfOptions.build(
            [measurement], output=serial, ignore_structs=ignore_structs, metrics=metrics
        )
    )
    capped = tmp_path / "capped"
    options = ProfOptions.build(
        [measurement], output=capped, ignore_structs=ignore_structs, metrics=metrics
    )
    limit = 3 * BYTES_PER_VALUE  # three values per round: hundreds of rounds, profiles read twice
    report = run_distributed(options, SerialComm(), memory_limit=limit)
    n_values = cctdb.read(serial / "cct.db").value_counts()[0]
    assert len(plan_rounds(np.asarray(n_values), 1, limit)) > 10
    for file in FILES:
        if (serial / file).exists() or (capped / file).exists():
            assert filecmp.cmp(serial / file, capped / file, shallow=False), file
    assert report.output == capped and report.problems == ()


def test_existing_output_is_refused_before_any_work(reference: Path, tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "notes.txt").write_text("mine")
    options = ProfOptions.build([reference / "meas" / "small.m"], output=tmp_path / "db")
    with pytest.raises(Exception, match="already exists"):
        run_distributed(options, SerialComm())
    assert (tmp_path / "db" / "notes.txt").read_text() == "mine"


counts = st.lists(st.integers(0, 50), min_size=0, max_size=60)


@settings(max_examples=60, deadline=None)
@given(counts, st.integers(1, 5), st.integers(1, 40))
def test_rounds_cover_every_context_once_within_the_budget(
    values: list[int], ranks: int, per_rank: int
) -> None:
    array = np.asarray(values, dtype=np.int64)
    limit = per_rank * BYTES_PER_VALUE
    rounds = plan_rounds(array, ranks, limit)
    covered = [c for start, stop in rounds for c in range(start, stop)]
    assert covered == list(range(len(values)))
    for start, stop in rounds:
        assert stop > start
        # Over budget only when a single context alone is.
        assert int(array[start:stop].sum()) <= per_rank * ranks or stop - start == 1


@settings(max_examples=60, deadline=None)
@given(counts, st.integers(1, 6), st.sampled_from([1.0, 0.5, 0.25]))
def test_split_even_gives_contiguous_balanced_ranges(
    values: list[int], parts: int, first: float
) -> None:
    array = np.asarray(values, dtype=np.int64)
    bounds = split_even(array, parts, first)
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == len(values)
    assert np.all(np.diff(bounds) >= 0)
    total = int(array.sum())
    largest = int(array.max()) if len(values) else 0
    capacity = [first] + [1.0] * (parts - 1)
    for r in range(parts):
        share = int(array[bounds[r] : bounds[r + 1]].sum())
        assert share <= total * capacity[r] / sum(capacity) + largest + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    counts,
    st.lists(st.floats(0.5, 2.0), min_size=1, max_size=6),
    st.sampled_from([1.0, 0.5, 0.25]),
)
def test_split_even_follows_the_ranks_speeds(
    values: list[int], speeds: list[float], first: float
) -> None:
    array = np.asarray(values, dtype=np.int64)
    parts = len(speeds)
    bounds = split_even(array, parts, first, np.asarray(speeds))
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == len(values)
    assert np.all(np.diff(bounds) >= 0)
    total = int(array.sum())
    largest = int(array.max()) if len(values) else 0
    capacity = [first * speeds[0], *speeds[1:]]
    for r in range(parts):
        share = int(array[bounds[r] : bounds[r + 1]].sum())
        assert share <= total * capacity[r] / sum(capacity) + largest + 1e-6


def test_a_faster_rank_gets_more() -> None:
    array = np.full(1000, 7, dtype=np.int64)
    bounds = split_even(array, 3, 1.0, np.array([1.0, 2.0, 1.0]))
    assert np.diff(bounds).tolist() == [250, 500, 250]


class _Gathering(SerialComm):
    """Four ranks' probe times, as the allgather would bring them."""

    size = 4

    def __init__(self, seconds: list[float]) -> None:
        self.seconds = seconds

    def allgather(self, obj: object) -> list[object]:
        assert isinstance(obj, float) and obj > 0  # this rank's own probe ran
        return list(self.seconds)


def test_rank_speeds_are_against_the_median_and_clipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(balance.SPEEDS_ENV, raising=False)
    monkeypatch.setattr(balance, "PROBE_ROUNDS", 1)
    speeds = balance.rank_speeds(_Gathering([0.02, 0.04, 0.02, 0.2]))
    # speeds 50, 25, 50, 5 against the median 37.5; the last clipped at half
    assert speeds == pytest.approx([4 / 3, 2 / 3, 4 / 3, 0.5])
    # within 10 % of the median: equal (noise moves no work)
    speeds = balance.rank_speeds(_Gathering([0.0105, 0.0095, 0.01, 0.01]))
    assert speeds.tolist() == [1.0, 1.0, 1.0, 1.0]
    speeds = balance.rank_speeds(_Gathering([0.01, 0.01, 0.0105, 0.008]))
    assert speeds.tolist() == [1.0, 1.0, 1.0, pytest.approx(1.25)]
    assert balance.rank_speeds(SerialComm()).tolist() == [1.0]


def test_cct_db_shares_follow_how_fast_each_rank_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(balance.SPEEDS_ENV, raising=False)
    probed = np.array([1.0, 1.0, 1.0, 1.0])
    big = float(balance.MIN_READ_BYTES)
    # rates 40, 20, 42, 5 MB/s against the median 30: 4/3, 2/3, 1.4, clipped 0.5
    speeds = balance.read_speeds(probed, [40e6, 20e6, 42e6, 5e6], big)
    assert speeds == pytest.approx([4 / 3, 2 / 3, 1.4, 0.5])
    # shares too small to time, a rank that read nothing, one rank: the probe's speeds stay
    assert balance.read_speeds(probed, [40e6, 20e6, 42e6, 5e6], big - 1) is probed
    assert balance.read_speeds(probed, [40e6, 0.0, 42e6, 5e6], big) is probed
    assert balance.read_speeds(np.ones(1), [40e6], big).tolist() == [1.0]
    # speeds the environment fixed stay fixed
    monkeypatch.setenv(balance.SPEEDS_ENV, "even")
    assert balance.read_speeds(probed, [40e6, 20e6, 42e6, 5e6], big) is probed


def test_the_probe_keeps_the_median_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([0.0, 1.0, 10.0, 10.002, 20.0, 20.003, 30.0, 30.001, 40.0, 40.002])
    monkeypatch.setattr(balance.time, "perf_counter", lambda: next(ticks))
    assert balance.probe(rounds=1, times=5) == pytest.approx(0.002)


def test_the_speeds_setting_fixes_them_or_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = _Gathering([1.0] * 4)
    monkeypatch.setenv(balance.SPEEDS_ENV, "even")
    assert balance.rank_speeds(comm).tolist() == [1.0] * 4
    monkeypatch.setenv(balance.SPEEDS_ENV, " 1, 2,0.5,1 ")
    assert balance.rank_speeds(comm).tolist() == [1.0, 2.0, 0.5, 1.0]
    for bad in ("1,2,3", "1,2,3,0", "1,2,3,x", "1,2,3,nan"):
        monkeypatch.setenv(balance.SPEEDS_ENV, bad)
        with pytest.raises(UsageError, match="give 'even' or 4 positive numbers"):
            balance.rank_speeds(comm)


keys = st.tuples(st.sampled_from(["/bin/a", "/lib/b.so", None]), st.integers(0, 4), st.booleans())
forests = st.lists(st.lists(keys, min_size=1, max_size=5).map(tuple), min_size=0, max_size=15)


def _tree(paths: list[tuple[RawKey, ...]]) -> RawTree:
    tree = RawTree()
    for path in paths:
        node = -1
        for key in path:
            node = tree.node(node, key)
    return tree


@settings(max_examples=80, deadline=None)
@given(forests, forests)
def test_bulk_merge_numbers_nodes_as_one_by_one_insertion(
    left: list[tuple[RawKey, ...]], right: list[tuple[RawKey, ...]]
) -> None:
    bulk, expected = _tree(left), _tree(left)
    other = _tree(right)
    mapping = bulk.merge(other)
    # The reference: insert the other tree's nodes one at a time, in its order.
    one_by_one = []
    for parent, key in zip(other.parent, other.keys, strict=True):
        one_by_one.append(expected.node(-1 if parent < 0 else one_by_one[parent], key))
    assert mapping.tolist() == one_by_one
    assert bulk.parent == expected.parent and bulk.keys == expected.keys


@settings(max_examples=60, deadline=None)
@given(st.lists(forests, min_size=2, max_size=5), st.booleans())
def test_folding_trees_numbers_nodes_as_one_by_one_insertion(
    trees: list[list[tuple[RawKey, ...]]], collide: bool
) -> None:
    """Successive merges (a rank folding its profiles) keep the path index true, and a path
    hash shared by different paths falls back to the level-wise lookup with the same result."""
    from pyhpctk.analysis import unify

    original = unify._path_mix
    if collide:  # every node of a depth level gets one hash: hits that are not the same path
        unify._path_mix = lambda parent, offset, key: parent * np.uint64(3)
    try:
        folded, expected = _tree(trees[0]), _tree(trees[0])
        for paths in trees[1:]:
            other = _tree(paths)
            mapping = folded.merge(other)
            one_by_one: list[int] = []
            for parent, key in zip(other.parent, other.keys, strict=True):
                one_by_one.append(expected.node(-1 if parent < 0 else one_by_one[parent], key))
            assert mapping.tolist() == one_by_one
        assert folded.parent == expected.parent and folded.keys == expected.keys
    finally:
        unify._path_mix = original


@settings(max_examples=30, deadline=None)
@given(forests)
def test_a_tree_survives_the_trip_to_another_rank(paths: list[tuple[RawKey, ...]]) -> None:
    tree = _tree(paths)
    back = RawTree.from_wire(tree.wire())
    assert back.parent == tree.parent and back.keys == tree.keys


def test_sizes_are_read_with_binary_units() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("2g") == 2 << 30
    for bad in ("lots", "-1G", "0"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_a_profile_dropped_for_its_metric_table_leaves_no_trace(
    reference: Path, tmp_path: Path
) -> None:
    """The rank folds profiles into its tree while reading; a later veto makes it fold again."""
    from pyhpctk.formats import hpcrun

    measurement = tmp_path / "m"
    measurement.mkdir()
    source = next((reference / "meas" / "loops-cputime-t.m").glob("*-001-*.hpcrun"))
    good = hpcrun.read(source)
    hpcrun.write(good, measurement / source.name)
    odd = hpcrun.read(next((reference / "meas" / "small.m").glob("*.hpcrun")))
    odd.metrics[0].period = 7  # same metric name, another period: vetoed after reading
    hpcrun.write(odd, measurement / source.name.replace("-001-", "-002-"))
    serial = tmp_path / "serial"
    expected = run(ProfOptions.build([measurement], output=serial, ignore_structs=True))
    capped = tmp_path / "mpi"
    options = ProfOptions.build([measurement], output=capped, ignore_structs=True)
    report = run_distributed(options, SerialComm())
    assert report.problems == expected.problems and len(report.problems) == 1
    assert "metric table disagrees" in report.problems[0]
    for file in FILES:
        if (serial / file).exists():
            assert filecmp.cmp(serial / file, capped / file, shallow=False), file


def test_extract_merges_sibling_frames_with_the_same_key(reference: Path) -> None:
    """Two children of one node naming the same frame become one raw node (values summed)."""
    from pyhpctk.analysis.extract import extract
    from pyhpctk.formats import hpcrun

    profile = hpcrun.read(next((reference / "meas" / "small.m").glob("*.hpcrun")))
    plain = extract(profile, None, "p")
    cct = profile.cct.copy()
    leaves = np.setdiff1d(cct["id"], cct["parent_id"])
    twin = cct[cct["id"] == leaves[-1]].copy()
    twin["id"] = int(cct["id"].max()) + 2  # a new node id, same parent and same frame
    profile.cct = np.concatenate([cct, twin])
    doubled = extract(profile, None, "p")
    assert len(doubled.tree) == len(plain.tree)
    assert doubled.tree.keys == plain.tree.keys and doubled.tree.parent == plain.tree.parent


def test_without_a_limit_rounds_still_keep_messages_under_mpis_int() -> None:
    from pyhpctk.analysis.distributed import MAX_ROUND_VALUES

    assert plan_rounds(np.asarray([5, 7, 0, 3]), 2, None) == [(0, 4)]
    big = np.full(10, MAX_ROUND_VALUES // 4, dtype=np.int64)
    rounds = plan_rounds(big, 1, None)
    assert len(rounds) >= 3 and rounds[0][0] == 0 and rounds[-1][1] == 10
    assert all(int(big[a:b].sum()) <= MAX_ROUND_VALUES for a, b in rounds)
    # 18 bytes a value, pickled, in one message between two ranks: under 2 GiB.
    assert MAX_ROUND_VALUES * 18 < 2**31


def test_the_listing_rank0_broadcasts_gives_every_rank_the_same_sources(tmp_path: Path) -> None:
    """Rank 0 lists the measurements once (names, traces beside them, sizes) and broadcasts
    them in a compact form; each rank makes the sources it reads from it."""
    import pickle

    from pyhpctk.analysis import inputs

    first, second = tmp_path / "a.m", tmp_path / "b.m"
    for directory in (first, second):
        directory.mkdir()
    (first / "p-1.hpcrun").write_bytes(b"x" * 10)
    (first / "p-1.hpctrace").write_bytes(b"y" * 7)
    (first / "p-0.hpcrun").write_bytes(b"x" * 3)
    (first / "p-0.hpctrace").mkdir()  # not a file: no trace
    (second / "q.hpcrun").write_bytes(b"x" * 5)
    (second / "notes.txt").write_text("not a profile")
    listing = inputs.discover([first, second])
    received = pickle.loads(pickle.dumps(listing))
    expected = [
        inputs.ProfileSource(first, first / "p-0.hpcrun", None),
        inputs.ProfileSource(first, first / "p-1.hpcrun", first / "p-1.hpctrace"),
        inputs.ProfileSource(second, second / "q.hpcrun", None),
    ]
    for sources in (listing, received):
        assert list(sources) == expected and sources[1:] == expected[1:]
        assert sources.sizes == [3, 17, 5]
        assert [sources.measurement(i) for i in range(3)] == [first, first, second]
    assert len(pickle.dumps(listing)) < len(pickle.dumps(expected))


def test_briefs_share_equal_tables_and_keep_each_profiles_own(reference: Path) -> None:
    """A rank's briefs hold one object per distinct metric table and module list (the
    all-gather pickles each once), each brief still its own profile's."""
    import pickle

    from pyhpctk.analysis import inputs
    from pyhpctk.analysis.screening import ProfileBrief, briefs_of, load_profile

    sources = inputs.discover(
        [reference / "meas" / f"{n}.m" for n in ("loops-cuda-nvidia-t", "small")]
    )
    loaded = [load_profile(i, s) for i, s in enumerate(sources)] * 3
    plain = [ProfileBrief.of(item) for item in loaded]
    shared = briefs_of(loaded)
    assert shared == plain
    tables = {tuple(b.metrics) for b in plain}
    assert len(tables) > 1  # the two GPU profiles share one table, small.m has another
    assert len({id(b.metrics) for b in shared}) == len(tables)
    assert len({id(b.module_paths) for b in shared}) == len(
        {tuple(b.module_paths.items()) for b in plain}
    )
    assert len(pickle.dumps(shared)) < len(pickle.dumps(plain))


class _ThreadWorld:
    """``size`` ranks as threads of this process: just the allgather the test needs."""

    def __init__(self, size: int) -> None:
        import threading

        self.size = size
        self.slots: list[object] = [None] * size
        self.barrier = threading.Barrier(size)
        self.calls = 0

    def comm(self, rank: int) -> object:
        world = self

        class Rank:
            def __init__(self) -> None:
                self.rank, self.size = rank, world.size

            def allgather(self, obj: object) -> list[object]:
                world.slots[rank] = obj
                world.barrier.wait()
                everyone = list(world.slots)
                if rank == 0:
                    world.calls += 1
                world.barrier.wait()
                return everyone

        return Rank()


def _on_ranks(size: int, function: object) -> list[object]:
    """``on_all_shared(comm, function(rank))`` on ``size`` thread ranks: each one's result or
    exception, and the number of allgathers."""
    import threading

    from pyhpctk.analysis.comm import on_all_shared

    world = _ThreadWorld(size)
    results: list[object] = [None] * size

    def rank(r: int) -> None:
        try:
            results[r] = on_all_shared(world.comm(r), function(r))  # type: ignore[arg-type, operator]
        except Exception as error:
            results[r] = error

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return [*results, world.calls]


def test_one_allgather_shares_every_ranks_part_or_stops_every_rank() -> None:
    from pyhpctk.analysis.comm import DistributedError
    from pyhpctk.analysis.screening import ProfileError

    *results, calls = _on_ranks(3, lambda r: lambda: (f"kept {r}", r * 10))
    assert results == [(f"kept {r}", [0, 10, 20]) for r in range(3)] and calls == 1

    def failing(r: int) -> object:
        def function() -> tuple[str, int]:
            if r >= 1:
                raise ProfileError(f"rank {r} failed")
            return "kept", r

        return function

    *results, calls = _on_ranks(3, failing)
    assert calls == 1
    assert isinstance(results[1], ProfileError) and str(results[1]) == "rank 1 failed"
    for r in (0, 2):  # the first rank's error, on every other rank
        assert isinstance(results[r], DistributedError) and str(results[r]) == "rank 1 failed"
        assert results[r].exit_code == ProfileError.exit_code
    with pytest.raises(ProfileError):
        from pyhpctk.analysis.comm import on_all_shared

        on_all_shared(SerialComm(), failing(1))


def _window_columns(
    rng: np.random.Generator, ids: np.ndarray, lo: int, hi: int, n_profiles: int
) -> tuple[Columns, list[tuple[int, int, int, float]]]:
    """One owner's received columns: each profile's values sorted by (context, metric id),
    profiles in order; and every value as (context, metric id, profile, value)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(9)]
    rows: list[tuple[int, int, int, float]] = []
    for profile in range(1, n_profiles + 1):
        keys = [(c, int(m)) for c in range(lo, hi) for m in ids if rng.random() < 0.3]
        if not keys:
            continue
        values = rng.random(len(keys))
        rows += [(c, m, profile, float(v)) for (c, m), v in zip(keys, values, strict=True)]
        ctx = np.array([c for c, _ in keys])
        run_ctx, run_len = np.unique(ctx, return_counts=True)
        for field, column in (
            (METRIC, [m for _, m in keys]),
            (VALUE, values),
            (RUN_CTX, run_ctx),
            (RUN_LEN, run_len),
            (PROFILE, [profile]),
            (PROFILE_LEN, [len(keys)]),
        ):
            parts[field].append(np.asarray(column, dtype=COLUMN_DTYPES[field]))
    arrays = tuple(
        np.concatenate(p) if p else np.zeros(0, d)
        for p, d in zip(parts, COLUMN_DTYPES, strict=True)
    )
    counts = np.array([[len(a) for a in arrays]], dtype=np.int64)
    return Columns(arrays, counts), rows


@pytest.mark.parametrize("spacing", [1, 7000], ids=["ids-dense", "ids-sparse"])
def test_an_owner_lays_out_its_window_context_major(spacing: int) -> None:
    """Blocks by context: values by (metric id, profile), then the metric index, padded to 4
    bytes; whether the window's keys count every id up to the largest or only those present."""
    rng = np.random.default_rng(spacing)
    ids = np.arange(0, 6 * spacing, spacing)
    lo, hi = 3, 40
    received, rows = _window_columns(rng, ids, lo, hi, n_profiles=25)
    shape = TreeShape(
        parent=np.full(hi, -1, np.int64),
        depth=np.zeros(hi, np.int64),
        lexical=np.zeros(hi, bool),
        loop=np.zeros(hi, bool),
    )
    window = own_window(received, lo, hi, shape, (SUM,))
    expected = bytearray()
    for c in range(lo, hi):
        mine = sorted(r for r in rows if r[0] == c)
        records = np.array([(p, v) for _, _, p, v in mine], dtype=cctdb.CCT_VALUE_DTYPE)
        metrics = sorted({m for _, m, _, _ in mine})
        index = np.array(
            [(m, [r[1] for r in mine].index(m)) for m in metrics],
            dtype=cctdb.CCT_METRIC_INDEX_DTYPE,
        )
        expected += records.tobytes() + index.tobytes()
        expected += bytes(-len(index.tobytes()) % 4)
        assert window.n_metrics[c - lo] == len(metrics)
    assert b"".join(bytes(p) for p in window.pieces) == bytes(expected)
    assert window.size == len(expected)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)), max_size=4),
        max_size=30,
    )
)
def test_stand_in_infos_place_every_block_where_the_real_ones_do(
    raw: list[list[tuple[int, int, int]]],
) -> None:
    """Ranks other than 0 lay profile.db out from stand-ins (the tuples' lengths only)."""
    summary = profiledb.ProfileInfo(is_summary=True, id_tuple=None)
    real = [summary, *_real_infos(raw)]
    n = len(real)
    counts = np.arange(n, dtype=np.int64) * 3 % 7
    mine = profiledb.layout([summary, *_stand_ins(raw)], counts, counts + 1)
    theirs = profiledb.layout(real, counts, counts + 1)
    assert len(mine.head) == len(theirs.head)
    assert np.array_equal(mine.values_at, theirs.values_at)
    assert np.array_equal(mine.ctx_indices_at, theirs.ctx_indices_at)
    assert mine.footer_at == theirs.footer_at

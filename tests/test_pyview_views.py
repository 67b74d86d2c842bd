"""pyview's top-down, bottom-up and flat views, on a constructed database and on HPCToolkit's.

The constructed program (two threads) has answers worked out by hand:

    main thread > main
      a.py: 5 > work > loop a.py:10 > a.py: 11        point (3, 1)
                             > loop a.py:12 > a.py: 13    point (2, 2)
                     > a.py: 20                       point (1, 0)
      a.py: 6 > work > a.py: 20                       point (0, 4)
      a.py: 7 > [I] inl > b.py: 3                     point (5, 0)
      a.py: 8 > rec > a.py: 30                        point (1, 1)
                    > a.py: 31 > rec > a.py: 30       point (2, 2)

Thread totals 14 and 10, so the program total is 24.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.formats import cctdb, profiledb
from pyhpctk.present import open_database
from pyhpctk.present.metrics import MetricCatalog, MetricError
from pyhpctk.present.model import Experiment
from pyhpctk.present.render import TextStyle, render_csv, render_json, render_text
from pyhpctk.present.synthetic import Spec, build
from pyhpctk.present.viewmodel import View, ViewNode, ViewOptions
from pyhpctk.present.views import build_view

CPU = "CPUTIME (sec)"


def line(
    n: int, values: tuple[float, ...] = (), children: tuple[Spec, ...] = (), f: str = "a.py"
) -> Spec:
    return Spec("line", file=f, line=n, values={CPU: values} if values else {}, children=children)


def fn(name: str, *children: Spec, kind: str = "function", f: str = "a.py") -> Spec:
    return Spec(kind, name=name, file=f, line=1, children=children)


def loop(n: int, *children: Spec) -> Spec:
    return Spec("loop", file="a.py", line=n, children=children)


def program() -> Experiment:
    work1 = fn(
        "work",
        loop(10, line(11, (3, 1)), loop(12, line(13, (2, 2)))),
        line(20, (1, 0)),
    )
    work2 = fn("work", line(20, (0, 4)))
    inl = fn("inl", line(3, (5, 0), f="b.py"), kind="inlined", f="b.py")
    rec = fn("rec", line(30, (1, 1)), line(31, children=(fn("rec", line(30, (2, 2))),)))
    main = fn(
        "main",
        line(5, children=(work1,)),
        line(6, children=(work2,)),
        line(7, children=(inl,)),
        line(8, children=(rec,)),
    )
    return build(
        [Spec("entry", name="main thread", children=(main,))],
        [CPU],
        [(("THREAD", 0),), (("THREAD", 1),)],
        title="prog",
    )


def view(exp: Experiment, kind: str, depth: int | None = None, threshold: float = 0.0) -> View:
    catalog = MetricCatalog(exp)
    return build_view(kind, catalog, ViewOptions((CPU,), depth=depth, threshold=threshold))


def find(node: ViewNode, *labels: str) -> ViewNode:
    """The descendant reached through children with these labels; a function named ``f``
    matches ``f`` and ``f (file: line)``, as the aggregating views name functions."""
    for label in labels:
        matches = [c for c in node.children if c.label == label or c.label.startswith(label + " (")]
        assert len(matches) == 1, (label, [c.label for c in node.children])
        node = matches[0]
    return node


def iv(node: ViewNode) -> tuple[float, float]:
    """(inclusive, exclusive) of the single metric."""
    return float(node.values[0]), float(node.values[1])


# -- top-down ----------------------------------------------------------------------------------
def test_top_down_sorts_children_by_inclusive_value() -> None:
    v = view(program(), "top-down")
    main = find(v.root, "main thread", "main")
    assert [c.label for c in main.children] == ["a.py: 5", "a.py: 8", "a.py: 7", "a.py: 6"]
    assert [iv(c)[0] for c in main.children] == [9.0, 6.0, 5.0, 4.0]
    assert iv(v.root)[0] == 24.0


def test_top_down_shows_loops_lines_and_inlined_calls_as_hpctoolkit_does() -> None:
    v = view(program(), "top-down")
    main = find(v.root, "main thread", "main")
    outer = find(main, "a.py: 5", "work", "loop at a.py: 10")
    assert iv(outer) == (8.0, 4.0)  # lex_aware: the nested loop is not exclusive to the outer
    assert iv(find(outer, "loop at a.py: 12")) == (4.0, 4.0)
    inlined = find(main, "a.py: 7", "[I] inl")
    assert inlined.kind == "inlined"
    assert iv(find(inlined, "b.py: 3")) == (5.0, 5.0)


def test_hot_path_is_marked_and_stops_below_half_of_the_parent() -> None:
    v = view(program(), "top-down")
    hot = [n.label for _, n in v.root.walk() if n.hot]
    assert hot == ["prog", "main thread", "main"]  # a.py: 5 holds 9 of 24, under half


def test_depth_limits_levels_but_the_hot_path_stays_expanded() -> None:
    v = view(program(), "top-down", depth=1)
    thread = find(v.root, "main thread")
    main = find(thread, "main")
    assert main.children == [] and main.hidden == 4


def test_threshold_hides_small_scopes_and_counts_them() -> None:
    v = view(program(), "top-down", threshold=20.0)  # 20% of 24 = 4.8
    main = find(v.root, "main thread", "main")
    assert [c.label for c in main.children] == ["a.py: 5", "a.py: 8", "a.py: 7"]
    assert main.hidden == 1


# -- bottom-up ---------------------------------------------------------------------------------
def test_bottom_up_sums_every_instance_and_splits_over_callers() -> None:
    v = view(program(), "bottom-up")
    work = find(v.root, "work")
    assert iv(work) == (13.0, 13.0)
    assert iv(find(work, "main")) == (13.0, 13.0)
    assert iv(find(work, "main", "main thread")) == (13.0, 13.0)


def test_bottom_up_counts_recursion_once() -> None:
    v = view(program(), "bottom-up")
    rec = find(v.root, "rec")
    assert iv(rec) == (6.0, 6.0)  # not 6 + 4
    assert iv(find(rec, "main")) == (6.0, 2.0)
    assert iv(find(rec, "rec")) == (4.0, 4.0)
    assert iv(find(v.root, "main")) == (24.0, 0.0)
    assert iv(v.root) == (24.0, 0.0)  # the program is no function: no self cost (#36 item 6)


# -- flat --------------------------------------------------------------------------------------
def test_flat_view_groups_module_file_function_loop_line() -> None:
    v = view(program(), "flat")
    afile = find(v.root, "app", "a.py")
    assert iv(find(v.root, "app")) == (24.0, 24.0)
    assert iv(afile) == (24.0, 24.0)
    work = find(afile, "work")
    assert iv(work) == (13.0, 13.0)
    outer = find(work, "loop at a.py: 10")
    assert iv(outer) == (8.0, 4.0)
    assert iv(find(outer, "loop at a.py: 12", "a.py: 13")) == (4.0, 4.0)
    assert iv(find(work, "a.py: 20")) == (5.0, 5.0)  # two contexts of one line
    rec = find(afile, "rec")
    assert iv(rec) == (6.0, 6.0)
    assert iv(find(rec, "a.py: 30")) == (6.0, 6.0)
    main = find(afile, "main")
    assert iv(main) == (24.0, 0.0)
    assert iv(find(main, "[I] inl")) == (5.0, 5.0)  # inlined code is not main's exclusive cost


# -- metrics -----------------------------------------------------------------------------------
def test_derived_metric_from_a_formula_is_computed_per_scope_and_after_aggregation() -> None:
    exp = program()
    catalog = MetricCatalog(exp)
    name = catalog.derive("share = 100 * cputime / 24")
    for kind in ("top-down", "bottom-up", "flat"):
        v = build_view(kind, catalog, ViewOptions((CPU, name)))
        for _, node in v.root.walk():
            inc, exc, d_inc, d_exc = (float(x) for x in node.values)
            assert d_inc == pytest.approx(100 * inc / 24)
            assert d_exc == pytest.approx(100 * exc / 24)


def test_ratio_of_sums_not_sum_of_ratios_in_aggregated_views() -> None:
    exp = program()
    catalog = MetricCatalog(exp)
    name = catalog.derive("one = cputime / cputime")
    v = build_view("bottom-up", catalog, ViewOptions((name,)))
    assert float(find(v.root, "work").values[0]) == 1.0


def test_metric_names_resolve_without_unit_and_by_pattern() -> None:
    catalog = MetricCatalog(program())
    assert catalog.resolve("cputime") == CPU
    assert catalog.resolve("CPUTIME (SEC)") == CPU
    assert catalog.select(["CPU*"]) == [CPU]
    with pytest.raises(MetricError, match=r"unknown metric 'cputim'.*did you mean"):
        catalog.resolve("cputim")
    with pytest.raises(MetricError, match="no metric matches"):
        catalog.select(["GPU*"])


# -- HPCToolkit's databases --------------------------------------------------------------------
def top_entries(node: ViewNode, n: int = 3) -> list[tuple[str, float]]:
    return [(c.label, round(float(c.values[0]), 6)) for c in node.children[:n]]


def test_small_top_down_matches_hpctoolkits_dump(reference: Path) -> None:
    # Values from dbase/small.yaml (HPCToolkit's own dump): summary execution of ctx 4
    # (main) 1.210259, ctx 22 (caller) 0.605316, ctx 10 (spinsleep) 0.604943.
    db = open_database(reference / "dbase" / "small.d")
    v = db.view("top-down")
    main = find(v.root, "main thread", "main")
    assert iv(main)[0] == pytest.approx(1.210259)
    callsite = find(main, "small.c: 11")
    assert top_entries(callsite) == [("caller", 0.605316), ("spinsleep", 0.604943)]
    assert [n.label for _, n in v.root.walk() if n.hot][-3:] == [
        "spinsleep",
        "loop at small.c: 3",
        "small.c: 3",
    ]
    assert iv(find(callsite, "spinsleep", "loop at small.c: 3")) == pytest.approx(
        (0.604943, 0.604943)
    )


def test_small_bottom_up_and_flat_match_hpctoolkits_dump(reference: Path) -> None:
    db = open_database(reference / "dbase" / "small.d")
    bu = db.view("bottom-up")
    spin = find(bu.root, "spinsleep")
    assert iv(spin) == pytest.approx((1.210259, 1.210259))
    assert top_entries(spin) == [
        ("caller (small.c: 6)", 0.605316),
        ("main (small.c: 10)", 0.604943),
    ]
    flat = db.view("flat")
    spin_flat = find(flat.root, "testmeas-small", "small.c", "spinsleep")
    assert iv(find(spin_flat, "loop at small.c: 3", "small.c: 3")) == pytest.approx(
        (1.210259, 1.210259)
    )


def test_nostruct_database_shows_instruction_frames(reference: Path) -> None:
    db = open_database(reference / "dbase" / "small.nostruct.d")
    v = db.view("top-down")
    labels = [n.label for _, n in v.root.walk()]
    assert any(lab.startswith("testmeas-small+0x") for lab in labels)
    assert iv(v.root)[0] == pytest.approx(1.210259)


DATABASES = [
    "small.d",
    "small.nostruct.d",
    "loops-cputime-t.d",
    "loops-cputime-t.nostruct.d",
    "loops-cuda-nvidia-t.d",
    "loops-cuda-nvidia-t.nostruct.d",
    "loops-cuda-nvidiapc-t.d",
    "loops-cuda-nvidiapc-t.nostruct.d",
]


@pytest.mark.parametrize("name", DATABASES)
def test_every_reference_database_displays_in_every_view(reference: Path, name: str) -> None:
    path = reference / "dbase" / name
    db = open_database(path)
    metric = db.catalog.default_selection(1)[0]
    # Independent expectation: the per-thread execution totals at ctx 0 from profile.db and the
    # per-context values of cct.db, summed here without pyview.
    pdb = profiledb.read(path / "profile.db")
    prop = db.experiment.metric(metric).prop_id("execution")
    assert prop is not None
    thread_sum = sum(
        float(pdb.block(i).context(0)["value"][pdb.block(i).context(0)["metric_id"] == prop].sum())
        for i in range(1, len(pdb.profiles))
    )
    cct = cctdb.read(path / "cct.db")
    for kind in ("top-down", "bottom-up", "flat"):
        v = db.view(kind, metrics=[metric])
        assert float(v.root.values[0]) == pytest.approx(thread_sum, rel=1e-9), kind
        for _, node in v.root.walk():
            for child in node.children:  # inclusive values never exceed the parent's
                assert float(child.values[0]) <= float(node.values[0]) * (1 + 1e-9) + 1e-12
    top = db.view("top-down", metrics=[metric])
    for entry in top.root.children:
        assert entry.ctx_id is not None
        pairs = cct.context(entry.ctx_id).metric(prop)
        assert float(entry.values[0]) == pytest.approx(float(pairs["value"].sum()), rel=1e-9)


def test_loops_top_down_top_entries_from_the_thread_profiles(reference: Path) -> None:
    path = reference / "dbase" / "loops-cputime-t.d"
    db = open_database(path)
    v = db.view("top-down")
    # application thread vs main thread: compare with cct.db sums over the 4 threads.
    cct = cctdb.read(path / "cct.db")
    prop = db.experiment.metric(CPU).prop_id("execution")
    assert prop is not None
    expected = sorted(
        (
            (e.label, float(cct.context(e.ctx_id or 0).metric(prop)["value"].sum()))
            for e in v.root.children
        ),
        key=lambda kv: -kv[1],
    )
    assert [c.label for c in v.root.children] == [label for label, _ in expected]
    assert {c.label for c in v.root.children} == {"main thread", "application thread"}


def test_gsamp_util_from_the_taxonomy_equals_its_formula(reference: Path) -> None:
    path = reference / "dbase" / "loops-cuda-nvidiapc-t.d"
    db = open_database(path)
    v = db.view("top-down", metrics=["GSAMP:UTIL", "GSAMP:TOT", "GSAMP:EXP"])
    root = v.root.values
    expected = min(100.0, max(0.0, 100.0 * root[2] / root[4]))
    assert float(root[0]) == pytest.approx(expected)
    assert 0 < float(root[0]) <= 100


def test_derived_formula_on_gpu_database(reference: Path) -> None:
    db = open_database(reference / "dbase" / "loops-cuda-nvidia-t.d")
    db.derive("util = gker / gpuop")
    v = db.view("top-down", metrics=["util", "gker", "gpuop"])
    for _, node in v.root.walk():
        u, _, gker, _, gpuop, _ = (float(x) for x in node.values)
        if gpuop:
            assert u == pytest.approx(gker / gpuop)
        else:
            assert math.isnan(u)


def test_columns_by_node_match_the_summary_profile(reference: Path) -> None:
    path = reference / "dbase" / "small.d"
    db = open_database(path)
    arrays = db.arrays([CPU])
    pdb = profiledb.read(path / "profile.db")
    summary = pdb.block(0)
    stat = db.experiment.metric(CPU).stat_id("execution")
    for ctx, inc in zip(arrays["ctx_id"].tolist(), arrays[f"{CPU} (I)"].tolist(), strict=True):
        pairs = summary.context(ctx)
        want = pairs["value"][pairs["metric_id"] == stat]
        assert inc == pytest.approx(float(want[0]) if len(want) else 0.0)
    assert np.all(arrays["parent"][1:] < np.arange(1, len(arrays["parent"])))


def test_deep_recursion_renders_in_every_format() -> None:
    leaf = Spec("line", file="r.py", line=9, values={CPU: (1.0,)})
    node = leaf
    for _ in range(1100):  # deeper than Python's default recursion limit
        node = fn("rec", line(2, children=(node,)), f="r.py")
    exp = build([Spec("entry", name="main thread", children=(node,))], [CPU], [(("THREAD", 0),)])
    catalog = MetricCatalog(exp)
    views = {k: build_view(k, catalog, ViewOptions((CPU,))) for k in ("top-down", "bottom-up")}
    views["flat"] = build_view("flat", catalog, ViewOptions((CPU,)))
    for v in views.values():
        for render in (render_json, render_csv):
            render(v, io.StringIO())
        render_text(v, io.StringIO(), TextStyle())
    top = build_view("top-down", catalog, ViewOptions((CPU,), depth=40, expand_hot=False))
    out = io.StringIO()
    render_json(top, out)
    doc = json.loads(out.getvalue())
    depth, cur = 0, doc["root"]
    while cur["children"]:
        cur, depth = cur["children"][0], depth + 1
    assert depth == 40 and cur["hidden_children"] == 1
    rec = find(views["bottom-up"].root, "rec")
    assert iv(rec) == (1.0, 1.0)  # recursion counted once
    assert iv(find(rec, "rec")) == (1.0, 1.0)


@pytest.mark.parametrize("name", ["small", "loops-cputime-t"])
def test_pyprof_output_displays_like_hpcprofs(reference: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.d"
    assert pyprof([str(reference / "meas" / f"{name}.m"), "-o", str(out), "--no-progress"]) == 0
    ours, theirs = open_database(out), open_database(reference / "dbase" / f"{name}.d")
    for kind in ("top-down", "bottom-up", "flat"):
        rows = [
            [(d, n.label, round(float(n.values[0]), 6)) for d, n in db.view(kind).root.walk()]
            for db in (ours, theirs)
        ]
        assert sorted(rows[0]) == sorted(rows[1]), kind

"""The condensed views (issue #36 item 1) on a constructed program with answers worked out by hand:

    main thread > h0 > a.py: 1 > h1 > a.py: 2 > h2 > a.py: 4 > h3 > a.py: 5 > work
                                              >                              work > a.py: 10  60
                                                                                  > a.py: 11  39
                                    > a.py: 3 > side > a.py: 12                               1
                 > a.py: 7 (5 of its own) > g > a.py: 8                                    15

so h0 passes 100 on to h1, and h1, h2, h3 pass 99 each to work; the total is 120.
"""

from __future__ import annotations

import pytest

from pyhpctk.present.condense import condense
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.synthetic import Spec, build
from pyhpctk.present.viewmodel import View, ViewNode, ViewOptions
from pyhpctk.present.views import build_view

CPU = "CPUTIME (sec)"


def line(n: int, value: float = 0.0, *calls: Spec) -> Spec:
    values = {CPU: (value,)} if value else {}
    return Spec("line", file="a.py", line=n, values=values, children=calls)


def fn(name: str, *children: Spec) -> Spec:
    return Spec("function", name=name, file="a.py", line=1, children=children)


def views(kind: str) -> tuple[View, View]:
    """The view as built and condensed."""
    work = fn("work", line(10, 60), line(11, 39))
    h2 = fn("h2", line(4, 0, fn("h3", line(5, 0, work))))
    h1 = fn("h1", line(2, 0, h2), line(3, 0, fn("side", line(12, 1))))
    main = fn("main", line(1, 0, h1), line(7, 5, fn("g", line(8, 15))))
    exp = build(
        [Spec("entry", name="main thread", children=(main,))], [CPU], [(("THREAD", 0),)], "prog"
    )
    built = build_view(kind, MetricCatalog(exp), ViewOptions((CPU,)))
    return built, condense(built)


def rows(node: ViewNode) -> dict[str, tuple[float, float]]:
    return {c.label: (float(c.values[0]), float(c.values[1])) for c in node.children}


def test_a_calling_line_is_no_row_of_its_own() -> None:
    built, shown = views("top-down")
    (entry,) = shown.root.children
    (main,) = entry.children
    assert main.label == "main"
    # g is named with the line that calls it; the line keeps a row for its own 5 alone.
    calls = rows(main)
    assert calls["g ← a.py: 7"] == (15.0, 15.0)
    assert calls["a.py: 7"] == (5.0, 5.0)
    assert "a.py: 1" not in calls and "a.py: 7" in rows(built.root.children[0].children[0])


def test_a_pass_through_chain_is_one_row_that_says_what_it_hides() -> None:
    _, shown = views("top-down")
    main = shown.root.children[0].children[0]
    # main's calls: h1 (100) passes 99 to h2 (99 % of it), h2 all to h3, h3 all to work.
    chain = next(c for c in main.children if "frames folded" in c.label)
    assert chain.label == "a.py: 1 → h1 → … → work (2 frames folded)"  # main's line 1 calls h1
    # h1's inclusive value; the own time of every call in the chain (work's 99).
    assert (float(chain.values[0]), float(chain.values[1])) == (100.0, 99.0)
    # What leaves the chain on the way (side, from h1) and where the time is spent (work's
    # lines) are its rows.
    assert rows(chain) == {
        "a.py: 10": (60.0, 60.0),
        "a.py: 11": (39.0, 39.0),
        "side ← a.py: 3": (1.0, 1.0),
    }


def test_two_lines_calling_one_chain_are_two_rows_named_by_their_lines() -> None:
    """numpy's matrix product from two lines: each line's call folds into a row of its own,
    which says which line it is (issue #36 item 3: the worker threads below each)."""

    def chain(weight: float) -> Spec:
        kernel = fn("kernel", line(30, weight))
        return fn(
            "matmul", line(20, 0, fn("gemm", line(21, 0, fn("dispatch", line(22, 0, kernel)))))
        )

    main = fn("main", line(1, 0, chain(10.0)), line(2, 0, chain(30.0)))
    exp = build(
        [Spec("entry", name="main thread", children=(main,))], [CPU], [(("THREAD", 0),)], "prog"
    )
    shown = condense(build_view("top-down", MetricCatalog(exp), ViewOptions((CPU,))))
    (entry,) = shown.root.children
    assert {c.label: float(c.values[0]) for c in entry.children[0].children} == {
        "a.py: 1 → matmul → … → kernel (2 frames folded)": 10.0,
        "a.py: 2 → matmul → … → kernel (2 frames folded)": 30.0,
    }


def test_a_chain_stops_before_the_call_that_leaves_the_programs_file() -> None:
    """sklearn's ``main ← app.py: 42 → wrapper ← app.py: 34 → fit ← base.py: 1403``: the line
    that calls into the library (34, issue #36 item 3's fit line) is not folded away; a chain
    within one file (main → h1 → work, all a.py) still is."""

    def lib(name: str, *children: Spec) -> Spec:
        return Spec("function", name=name, file="base.py", line=1, children=children)

    def lib_line(n: int, value: float = 0.0, *calls: Spec) -> Spec:
        values = {CPU: (value,)} if value else {}
        return Spec("line", file="base.py", line=n, values=values, children=calls)

    grow = lib("grow", lib_line(841, 60.0), lib_line(842, 40.0))
    fit = lib("fit", lib_line(1403, 0, lib("inner", lib_line(20, 0, grow))))
    main = fn("main", line(34, 0, lib("wrapper", lib_line(1403, 0, fit))), line(35, 1))
    entry = fn("<module>", line(42, 0, main))
    exp = build(
        [Spec("entry", name="main thread", children=(entry,))], [CPU], [(("THREAD", 0),)], "p"
    )
    shown = condense(build_view("top-down", MetricCatalog(exp), ViewOptions((CPU,))))
    (thread,) = shown.root.children
    (module,) = thread.children
    assert module.label == "<module>"
    (main_row,) = module.children
    assert main_row.label == "main ← a.py: 42"
    assert {c.label: float(c.values[0]) for c in main_row.children} == {
        "a.py: 34 → wrapper → … → grow (2 frames folded)": 100.0,
        "a.py: 35": 1.0,
    }


def test_bottom_up_folds_a_chain_of_single_callers_and_orders_by_own_time() -> None:
    built, shown = views("bottom-up")
    assert shown.columns[shown.sort_column].label == f"{CPU} (E)"
    first = shown.root.children[0]
    assert first.label == "work (a.py: 1)"  # 99 of its own, the most
    (callers,) = first.children
    assert callers.label == "h3 (a.py: 1) ← … ← main (a.py: 1) (2 frames folded)"
    assert float(callers.values[1]) == pytest.approx(99.0)
    assert [c.label for c in callers.children] == ["main thread"]
    assert sum(1 for _ in built.root.walk()) > sum(1 for _ in shown.root.walk())

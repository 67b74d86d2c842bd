"""Native code as pyview shows it after pystruct (issue #36): a constructed program whose answers
are worked out by hand.

    main thread > main (a.py) > a.py: 3 > pkg.m.Shape.area [cython wrapper] > [libm.so]: 0
                                            > pkg.m.Shape.area ([libm.so]) > loop at [libm.so]: 0
                                                                            > [libm.so]: 0     70
                                        > a.py: 4                                              30

The wrapper (Cython's argument parsing, ``__pyx_pw_``) is left out like mypyc's; the lines and
loop of a library without a line map (pystruct's file ``[libm.so]``, line 0) are no rows, and
their 70 stay the body's own time, counted once.
"""

from __future__ import annotations

import pytest

from pyhpctk.present import html
from pyhpctk.present.elide import internal_frames
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.synthetic import Spec, build
from pyhpctk.present.viewmodel import View, ViewNode, ViewOptions
from pyhpctk.present.views import build_view

CPU = "CPUTIME (sec)"
LIB = "[libm.so]"
BODY = "pkg.m.Shape.area"


def _view(kind: str) -> View:
    nowhere = Spec("line", file=LIB, line=0, values={CPU: (70.0,)})
    body = Spec(
        "function",
        name=BODY,
        file=LIB,
        module="/x/libm.so",
        children=(Spec("loop", file=LIB, line=0, children=(nowhere,)),),
    )
    wrapper = Spec(
        "function",
        name=BODY + " [cython wrapper]",
        file=LIB,
        module="/x/libm.so",
        children=(Spec("line", file=LIB, line=0, children=(body,)),),
    )
    main = Spec(
        "function",
        name="main",
        file="a.py",
        line=1,
        children=(
            Spec("line", file="a.py", line=3, children=(wrapper,)),
            Spec("line", file="a.py", line=4, values={CPU: (30.0,)}),
        ),
    )
    exp = build(
        [Spec("entry", name="main thread", children=(main,))], [CPU], [(("THREAD", 0),)], "prog"
    )
    return build_view(kind, MetricCatalog(exp), ViewOptions((CPU,)), internal_frames(exp.tree))


def _all(node: ViewNode) -> list[ViewNode]:
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(current.children)
    return out


def test_no_row_is_a_place_no_source_names_nor_a_cython_wrapper() -> None:
    # Before: rows "[libm.so]", "loop at [libm.so]" and the wrapper stood between a.py: 3 and
    # the body; with them left out the body's self time read 140 (moved to it a second time).
    rows = _all(_view("top-down").root)
    labels = [row.label for row in rows]
    assert not [label for label in labels if LIB in label or "wrapper" in label], labels
    (body,) = [row for row in rows if row.label == BODY]
    assert (float(body.values[0]), float(body.values[1])) == (70.0, 70.0)
    (line,) = [row for row in rows if row.label == "a.py: 3"]
    assert [child.label for child in line.children] == [BODY]


def test_bottom_up_names_a_function_without_source_by_its_library_once() -> None:
    # Before: "pkg.m.Shape.area ([libm.so])", and its own time 140.
    top = {row.label: row for row in _view("bottom-up").root.children}
    body = top[f"{BODY} {LIB}"]
    assert float(body.values[1]) == pytest.approx(70.0)


@pytest.mark.parametrize(
    ("name", "painted"),
    [
        ("libc.so.6 @ 0x85e50", "libc.so.6 (native)"),
        ("libc.so.6+0xcf438", "libc.so.6 (native)"),
        ("sem_post [libc.so.6]", "sem_post [libc.so.6]"),
    ],
)
def test_the_timeline_paints_unknown_code_as_its_library(
    monkeypatch: pytest.MonkeyPatch, name: str, painted: str
) -> None:
    # Before: each "libc.so.6 @ 0x…" was a colour of its own in the legend.
    monkeypatch.setattr(html, "function_of", lambda exp, ctx: name)
    assert html._timeline_name(None, 0) == painted

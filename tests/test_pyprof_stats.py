"""Statistic generation: the numpy propagation against a slow recursive oracle."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk.analysis.metrics import PARTIALS_STATS, PARTIALS_SUM
from pyhpctk.analysis.stats import SparseValues, TreeShape, profile_values, propagate, summarize
from pyhpctk.core.metrics import SCOPE_EXECUTION, SCOPE_FUNCTION, SCOPE_LEX_AWARE, SCOPE_POINT


@st.composite
def trees(draw: st.DrawFn) -> TreeShape:
    n = draw(st.integers(2, 30))
    parent = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parent[i]] + 1
    lexical = [False] + [draw(st.booleans()) for _ in range(1, n)]
    loop = [False] + [draw(st.booleans()) and lexical[i] for i in range(1, n)]
    return TreeShape(
        np.asarray(parent, dtype=np.int64),
        np.asarray(depth, dtype=np.int64),
        np.asarray(lexical, dtype=bool),
        np.asarray(loop, dtype=bool),
    )


@st.composite
def profiles(draw: st.DrawFn, shape: TreeShape) -> tuple[list[int], list[int], list[float]]:
    n = len(shape)
    rows = draw(
        st.lists(
            st.tuples(st.integers(1, n - 1), st.integers(0, 2), st.integers(1, 1000)), max_size=25
        )
    )
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] / 8 for r in rows]


def oracle(shape: TreeShape, ctx: list[int], metric: list[int], value: list[float]):  # type: ignore[no-untyped-def]
    n = len(shape)
    children: dict[int, list[int]] = defaultdict(list)
    for i in range(1, n):
        children[int(shape.parent[i])].append(i)
    point: dict[tuple[int, int], float] = defaultdict(float)
    for c, m, v in zip(ctx, metric, value, strict=True):
        point[(c, m)] += v

    def execution(c: int, m: int) -> float:
        return point[(c, m)] + sum(execution(k, m) for k in children[c])

    def function(c: int, m: int) -> float:
        return point[(c, m)] + sum(function(k, m) for k in children[c] if shape.lexical[k])

    return point, execution, function


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_scopes_match_the_recursive_definition(data: st.DataObject) -> None:
    shape = data.draw(trees())
    ctx, metric, value = data.draw(profiles(shape))
    bases = np.asarray([0, 4, 8], dtype=np.int64)
    sparse = profile_values(
        propagate(
            shape,
            np.asarray(ctx, dtype=np.int64),
            np.asarray(metric, dtype=np.int64),
            np.asarray(value, dtype=np.float64),
        ),
        bases,
    )
    assert sparse.verify() == []
    got = sparse.as_dict()
    point, execution, function = oracle(shape, ctx, metric, value)
    for c in range(len(shape)):
        for m in range(3):
            expect = {
                SCOPE_POINT: point[(c, m)],
                SCOPE_FUNCTION: function(c, m),
                SCOPE_LEX_AWARE: function(c, m),
                SCOPE_EXECUTION: execution(c, m),
            }
            for scope, want in expect.items():
                assert np.isclose(got.get(c, {}).get(4 * m + scope, 0.0), want)


def _loop_shape() -> TreeShape:
    # 0 root -> 1 function (call) -> 2 loop (lexical) -> 3 line, 4 loop -> 5 line
    parent = np.asarray([-1, 0, 1, 2, 2, 4], dtype=np.int64)
    return TreeShape(
        parent,
        np.asarray([0, 1, 2, 3, 3, 4], dtype=np.int64),
        np.asarray([False, False, True, True, True, True]),
        np.asarray([False, False, True, False, True, False]),
    )


def test_summary_lex_aware_of_a_loop_excludes_nested_loops() -> None:
    shape = _loop_shape()
    one = profile_values(
        propagate(shape, np.asarray([3, 5]), np.asarray([0, 0]), np.asarray([2.0, 3.0])),
        np.asarray([0]),
    )
    # Per profile, lex_aware equals function everywhere (as hpcprof writes it).
    assert one.as_dict()[2] == {1: 5.0, 2: 5.0, 3: 5.0}
    summary = summarize(shape, [one, one], PARTIALS_SUM).as_dict()
    assert summary[2] == {1: 10.0, 2: 4.0, 3: 10.0}  # the outer loop: only line 3's 2 + 2
    assert summary[4] == {1: 6.0, 2: 6.0, 3: 6.0}  # the inner loop has no nested loop
    assert summary[1][2] == 10.0  # a function keeps its loops


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_stats_partials_match_numpy(data: st.DataObject) -> None:
    shape = data.draw(trees())
    n_profiles = data.draw(st.integers(1, 4))
    bases = np.asarray([0, 20, 40], dtype=np.int64)
    blocks: list[SparseValues] = []
    for _ in range(n_profiles):
        ctx, metric, value = data.draw(profiles(shape))
        prop = propagate(
            shape,
            np.asarray(ctx, dtype=np.int64),
            np.asarray(metric, dtype=np.int64),
            np.asarray(value, dtype=np.float64),
        )
        blocks.append(profile_values(prop, bases))
    summary = summarize(shape, blocks, PARTIALS_STATS).as_dict()
    per: dict[tuple[int, int], list[float]] = defaultdict(list)
    for block in blocks:
        for c, row in block.as_dict().items():
            for m, v in row.items():
                per[(c, m)].append(v)
    for (c, m), values in per.items():
        if m % 4 == SCOPE_LEX_AWARE:
            continue
        got = summary[c]
        assert np.isclose(got[m], sum(values))  # sum
        assert got[m + 4] == min(values)  # min
        assert got[m + 8] == max(values)  # max
        assert np.isclose(got[m + 12], sum(v * v for v in values))  # sum of squares
        assert got[m + 16] == len(values)  # count

"""Call path unification is an associative, order-independent merge (hypothesis)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk.analysis.unify import ProfileData, RawKey, RawTree, combine, leaf, reduce_pairwise

keys = st.tuples(st.sampled_from(["/bin/a", "/lib/b.so", None]), st.integers(0, 5), st.booleans())
paths = st.lists(st.lists(keys, min_size=1, max_size=4).map(tuple), min_size=1, max_size=12)


def tree_of(path_list: list[tuple[RawKey, ...]]) -> tuple[RawTree, list[int]]:
    """A tree holding every path; the node id of each path's leaf."""
    tree = RawTree()
    leaves = []
    for path in path_list:
        node = -1
        for key in path:
            node = tree.node(node, key)
        leaves.append(node)
    return tree, leaves


def prefixes(path_list: list[tuple[RawKey, ...]]) -> set[tuple[RawKey, ...]]:
    return {path[: i + 1] for path in path_list for i in range(len(path))}


@settings(max_examples=40, deadline=None)
@given(paths, paths, paths)
def test_merge_is_associative_and_keeps_every_path(a, b, c) -> None:  # type: ignore[no-untyped-def]
    left = tree_of(a)[0]
    left.merge(tree_of(b)[0])
    left.merge(tree_of(c)[0])
    bc = tree_of(b)[0]
    bc.merge(tree_of(c)[0])
    right = tree_of(a)[0]
    right.merge(bc)
    assert set(left.paths()) == set(right.paths()) == prefixes(a + b + c)


@settings(max_examples=40, deadline=None)
@given(paths, paths)
def test_merge_maps_each_node_to_the_same_path(a, b) -> None:  # type: ignore[no-untyped-def]
    base, _ = tree_of(a)
    other, _ = tree_of(b)
    other_paths = {node: path for path, node in other.paths().items()}
    mapping = base.merge(other)
    merged_paths = {node: path for path, node in base.paths().items()}
    for node, path in other_paths.items():
        assert merged_paths[int(mapping[node])] == path


def _profile(name: str, path_list: list[tuple[RawKey, ...]]) -> ProfileData:
    tree, leaves = tree_of(path_list)
    return ProfileData(
        name=name,
        tree=tree,
        header={},
        id_tuple=[],
        metrics=[],
        value_node=np.asarray(leaves, dtype=np.int64),
        value_metric=np.zeros(len(leaves), dtype=np.int64),
        value=np.arange(1, len(leaves) + 1, dtype=np.float64),
    )


def _values_by_path(data: ProfileData) -> list[tuple[tuple[RawKey, ...], float]]:
    by_node = {node: path for path, node in data.tree.paths().items()}
    return sorted(
        ((by_node[int(n)], float(v)) for n, v in zip(data.value_node, data.value, strict=True)),
        key=repr,
    )


@settings(max_examples=30, deadline=None)
@given(st.lists(paths, min_size=1, max_size=6), st.integers(1, 4), st.randoms())
def test_reduction_order_does_not_change_any_profile(  # type: ignore[no-untyped-def]
    profiles, jobs, rnd: random.Random
) -> None:
    expected = [_values_by_path(_profile(str(i), p)) for i, p in enumerate(profiles)]
    parts = [leaf(i, _profile(str(i), p)) for i, p in enumerate(profiles)]
    rnd.shuffle(parts)
    unified = reduce_pairwise(parts, jobs)
    assert sorted(i for i, _ in unified.profiles) == list(range(len(profiles)))
    for index, data in unified.profiles:
        assert data.tree is unified.tree
        assert _values_by_path(data) == expected[index]
    assert set(unified.tree.paths()) == prefixes([q for p in profiles for q in p])


def test_combine_folds_right_into_left() -> None:
    a = _profile("a", [(("/x", 1, True), ("/x", 2, True))])
    b = _profile("b", [(("/x", 1, True), ("/x", 3, True))])
    merged = combine(leaf(0, a), leaf(1, b))
    assert len(merged.tree) == 3
    assert [i for i, _ in merged.profiles] == [0, 1]


def test_identifier_tuples_get_dense_logical_ids() -> None:
    from pyhpctk.analysis.screening import id_tuples

    local, only, glob = 1 << 14, 3 << 14, 2 << 14
    node, thread, rank = 1, 3, 2
    tuples = id_tuples(
        [
            [(node | local, 0xBEEF, 0), (rank | glob, 40, 0), (thread | only, 2, 2)],
            [(node | local, 0x0ACE, 0), (rank | glob, 7, 0), (thread | only, 0, 0)],
            [(node | local, 0xBEEF, 0), (rank | glob, 7, 0), (thread | only, 1, 1)],
        ]
    )
    summary = [[(e.kind, e.is_physical, e.logical, e.physical) for e in t] for t in tuples]
    assert summary[0] == [(1, True, 1, 0xBEEF), (2, True, 1, 40), (3, False, 2, 2)]
    assert summary[1] == [(1, True, 0, 0x0ACE), (2, True, 0, 7), (3, False, 0, 0)]
    assert summary[2] == [(1, True, 1, 0xBEEF), (2, True, 0, 7), (3, False, 1, 1)]

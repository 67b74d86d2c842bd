"""pyview's Python API: plain objects and numpy arrays, pandas only when installed."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.errors import UsageError
from pyhpctk.present import open_database
from pyhpctk.present.render import render_json

CPU = "CPUTIME (sec)"


def test_arrays_are_numpy_columns_one_row_per_context(reference: Path) -> None:
    db = open_database(reference / "dbase" / "small.d")
    arrays = db.arrays([CPU])
    n = len(arrays["ctx_id"])
    assert n == 14  # formats.md §7: 13 meta.db contexts + the global context
    assert all(isinstance(a, np.ndarray) and len(a) == n for a in arrays.values())
    assert arrays["parent"][0] == -1 and arrays["depth"][0] == 0
    main = int(np.flatnonzero(arrays["label"] == "main")[0])
    assert arrays["kind"][main] == "function"
    assert arrays[f"{CPU} (I)"][main] == pytest.approx(1.210259)


def test_records_and_tree_dict_are_plain_and_agree(reference: Path) -> None:
    db = open_database(reference / "dbase" / "small.d")
    view = db.view("flat", depth=3)
    rows = db.records(view)
    assert rows[0]["parent"] == -1 and rows[0]["depth"] == 0
    assert all(isinstance(v, (int, float, str, type(None))) for r in rows for v in r.values())
    tree = db.tree_dict(view)
    assert json.loads(json.dumps(tree)) == tree
    count, stack = 0, [tree["root"]]
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node["children"])
    assert count == len(rows)


def test_streamed_json_equals_the_dict(reference: Path) -> None:
    db = open_database(reference / "dbase" / "loops-cputime-t.d")
    view = db.view("bottom-up", depth=4)
    out = io.StringIO()
    render_json(view, out)
    assert json.loads(out.getvalue()) == db.tree_dict(view)


def test_to_pandas_only_when_pandas_is_installed(reference: Path) -> None:
    db = open_database(reference / "dbase" / "small.d")
    view = db.view("top-down")
    if importlib.util.find_spec("pandas") is None:
        with pytest.raises(UsageError, match="needs pandas"):
            db.to_pandas(view)
    else:
        frame = db.to_pandas(view)
        assert list(frame["scope"])[:2] == ["testmeas-small", "main thread"]


def test_sort_by_another_metric_adds_it(reference: Path) -> None:
    db = open_database(reference / "dbase" / "loops-cuda-nvidia-t.d")
    view = db.view("top-down", metrics=["gpuop"], sort="GKER:COUNT")
    assert [c.label for c in view.columns][:2] == ["GKER:COUNT (I)", "GKER:COUNT (E)"]
    assert view.columns[view.sort_column].label == "GKER:COUNT (I)"
    with pytest.raises(UsageError, match="threshold"):
        db.view("top-down", threshold=150.0)

"""pyprof against hpcprof: each reference measurement gives the reference database.

For every measurement of HPCToolkit's test data, ``pyprof meas/X.m`` must mean the same as
``dbase/X.d`` and ``pyprof --ignore-structs meas/X.m`` the same as ``dbase/X.nostruct.d``:
same context tree, metrics, per-profile and summary values (relative error <= 1e-9), traces,
and the same metric taxonomy in ``metrics/default.yaml``. Context ids may differ; the comparison
(:mod:`pyhpctk.analysis.compare`) matches contexts by their paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyhpctk.analysis.compare import (
    compare,
    compare_dirs,
    compare_taxonomies,
    read_view,
    view_of_aggregate,
)
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import aggregate, run
from pyhpctk.cli.pyprof import main

CASES = ["small", "loops-cputime-t", "loops-cuda-nvidia-t", "loops-cuda-nvidiapc-t"]


@pytest.mark.parametrize("ignore_structs", [False, True], ids=["struct", "nostruct"])
@pytest.mark.parametrize("name", CASES)
def test_database_means_the_same_as_hpcprofs(
    reference: Path, tmp_path: Path, name: str, ignore_structs: bool
) -> None:
    expected = reference / "dbase" / (name + (".nostruct.d" if ignore_structs else ".d"))
    output = tmp_path / "db"
    report = run(
        ProfOptions.build(
            [reference / "meas" / f"{name}.m"], output=output, ignore_structs=ignore_structs
        )
    )
    assert report.problems == ()
    assert compare_dirs(expected, output) == []


def test_taxonomy_comparison_notices_a_change(reference: Path) -> None:
    text = (reference / "dbase" / "small.d" / "metrics" / "default.yaml").read_text()
    assert compare_taxonomies(text, text) == []
    assert compare_taxonomies(text, text.replace("[number, percent]", "[number]")) != []
    assert compare_taxonomies(text, text.replace("scope: lex_aware", "scope: point")) != []


def test_comparison_notices_a_changed_value(reference: Path) -> None:
    db = aggregate(ProfOptions.build([reference / "meas" / "small.m"]))
    view = view_of_aggregate(db)
    view.profiles[1].value[-1] *= 1 + 1e-6
    problems = compare(read_view(reference / "dbase" / "small.d"), view)
    assert len(problems) == 1 and "expected" in problems[0]


def test_comparison_notices_a_different_tree(reference: Path) -> None:
    view = view_of_aggregate(aggregate(ProfOptions.build([reference / "meas" / "small.m"])))
    problems = compare(read_view(reference / "dbase" / "small.nostruct.d"), view)
    assert any(p.startswith("context ") for p in problems)


def test_threads_give_the_same_database(reference: Path) -> None:
    measurement = reference / "meas" / "loops-cputime-t.m"
    serial_db = aggregate(ProfOptions.build([measurement]))
    parallel_db = aggregate(ProfOptions.build([measurement], jobs=3))
    assert serial_db.verify() == [] and parallel_db.verify() == []
    assert compare(view_of_aggregate(serial_db), view_of_aggregate(parallel_db)) == []


def test_cli_writes_the_reference_database(reference: Path, tmp_path: Path) -> None:
    output = tmp_path / "small.d"
    status = main(["-o", str(output), "-j", "2", str(reference / "meas" / "small.m")])
    assert status == 0
    assert compare_dirs(reference / "dbase" / "small.d", output) == []

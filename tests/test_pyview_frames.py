"""Every thread in a table, where hatchet's reader sees only the main thread (issue #21 item 8).

``tests/programs/thread_pool.py``: two ThreadPoolExecutor workers spend S of CPU time each in
work(), the main thread S / 4. hatchet's ``from_hpctoolkit_latest`` reads the "main thread"
entry point only (0.11 s of 0.91 s for S = 0.4, checked by hand with llnl-hatchet 2024.1);
:meth:`Database.profile_tables` and :meth:`Database.to_thicket` hold every thread.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.errors import UsageError
from pyhpctk.present import open_database

PROGRAM = Path(__file__).resolve().parent / "programs" / "thread_pool.py"
CPU = "CPUTIME (sec)"
S = 0.3


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("pool")
    measurement, output = where / "m", where / "db"
    assert pyrun_main(["-o", str(measurement), sys.executable, str(PROGRAM), str(S)]) == 0
    run(ProfOptions.build([measurement], output=output))
    return output


def test_every_thread_and_context_is_in_the_table(database: Path) -> None:
    db = open_database(database)
    performance, metadata = db.profile_tables([CPU])
    assert sorted(metadata["thread"]) == [0, 1, 2] and metadata["gpu"] == [False] * 3
    assert set(performance) >= {"node", "profile", "name", "kind", "parent", "depth"}
    assert {f"{CPU} (inc)", CPU} <= set(performance)
    names = np.array(performance["name"], dtype=object)
    profiles, inclusive = performance["profile"], performance[f"{CPU} (inc)"]
    thread_of = dict(zip(metadata["profile"], metadata["thread"], strict=True))
    work = names == "work"
    pairs = zip(profiles[work].tolist(), inclusive[work].tolist(), strict=True)
    by_thread = {thread_of[p]: v for p, v in pairs}
    # Both workers (threads 1 and 2) and the main thread ran work(); each its own share.
    assert by_thread[1] == pytest.approx(S, rel=0.3)
    assert by_thread[2] == pytest.approx(S, rel=0.3)
    assert by_thread[0] == pytest.approx(S / 4, rel=0.4)
    # The rows of one profile at the root hold that profile's total; they add up to the sum.
    root = performance["node"] == 0
    summary = db.catalog.column(CPU, inclusive=True)[0]
    assert float(inclusive[root].sum()) == pytest.approx(float(summary))
    # Each row's parent is a context of the tree, and depths count from the root.
    tree = db.experiment.tree
    assert all(tree.node_of(int(p)) >= 0 for p in performance["parent"][~root])
    assert int(performance["depth"][root][0]) == 0


def test_derived_metrics_have_no_values_per_profile(database: Path) -> None:
    db = open_database(database)
    name = db.derive("twice = 2 * cputime")
    with pytest.raises(UsageError, match="derived metric has no values per profile"):
        db.profile_tables([name])


def test_thicket_frames_need_pandas(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = open_database(database)
    if importlib.util.find_spec("pandas") is not None:
        performance, metadata = db.to_thicket([CPU])
        assert performance.index.names == ["node", "profile"]
        assert metadata.index.name == "profile" and len(metadata) == 3
    real = importlib.import_module

    def without_pandas(name: str, package: str | None = None) -> ModuleType:
        if name == "pandas":
            raise ImportError("No module named 'pandas'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_pandas)
    with pytest.raises(UsageError, match=r"to_thicket\(\) needs pandas: pip install pandas"):
        db.to_thicket([CPU])

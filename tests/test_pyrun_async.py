"""Asyncio-aware stacks (issue #37, item 4): ``pyrun --async-aware``.

``tests/programs/async_tasks.py`` runs the task ``main``, which awaits ``parent``, which gathers
``worker-a`` and ``worker-b``; the workers interleave on one event loop and count their own CPU
time. In pyview's tree (what a user reads) each worker's ``crunch`` must be under the chain
``<task main> → main → <task parent> → parent → <task worker-X> → worker``, right under the main
thread (not under the event loop's frames), with the time the worker counted; with the engine
and with the Python sampler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.cli.pyview import main as pyview

PROGRAM = Path(__file__).resolve().parent / "programs" / "async_tasks.py"
PYRUN = str(Path(sys.executable).parent / "pyrun")
CPU = "CPUTIME (sec) (I)"


def _functions(tree: dict[str, Any], above: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every node's path of function (and thread) scopes, with its inclusive CPU time last."""
    for child in tree.get("children", []):
        if child["kind"] == "line":
            yield from _functions(child, above)
            continue
        path = (*above, str(child["scope"]))
        yield (*path, child["values"].get(CPU, 0.0))
        yield from _functions(child, path)


@pytest.mark.parametrize("sampler", ["engine", "thread"])
def test_each_tasks_time_is_under_the_chain_of_tasks_awaiting_it(
    tmp_path: Path, sampler: str
) -> None:
    out, truth = tmp_path / "m", tmp_path / "truth.json"
    env = dict(os.environ, PYHPCTK_PYRUN_SAMPLER=sampler)
    command = [PYRUN, "--async-aware", "-e", "CPUTIME@1000", "-o", str(out), sys.executable]
    ran = subprocess.run([*command, str(PROGRAM), str(truth)], env=env, capture_output=True)
    assert ran.returncode == 0, ran.stderr
    assert pyprof(["-o", str(tmp_path / "db"), str(out)]) == 0
    view = tmp_path / "view.json"
    assert pyview(["--full", "--json", str(view), str(tmp_path / "db")]) == 0
    rows = list(_functions(json.loads(view.read_text())["root"]))
    spent: dict[str, float] = json.loads(truth.read_text())
    chain = ("main thread", "<task main>", "main", "<task parent>", "parent")
    for name, seconds in spent.items():
        under = (*chain, f"<task {name}>", "worker", "crunch")
        measured = sum(row[-1] for row in rows if row[:-1] == under)  # crunch is no recursion
        assert measured == pytest.approx(seconds, rel=0.15), (name, sampler)
    # The tasks hang right under the thread, not under the event loop's frames; no other
    # path holds a task.
    tasks = [row[:-1] for row in rows if str(row[-2]).startswith("<task ")]
    assert {path[:2] for path in tasks} == {("main thread", "<task main>")}, tasks
    astray = [row for row in rows if "crunch" in row[:-1] and "<task main>" not in row]
    assert not astray, [(" → ".join(row[:-1]), row[-1]) for row in astray]

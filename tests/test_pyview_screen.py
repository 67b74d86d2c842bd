"""Views that fit a screen (issue #21 item 3): hot path, line budget, width, exclusive order,
interpreter frames left out with their cost kept.

``tests/programs/screen.py`` imports a module that spends S at import time (under the import
system's frames), spends 5 S in hot() and calls 150 small functions for S / 50 each: its whole
tree is over 200 rows.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main
from pyhpctk.present import open_database
from pyhpctk.present.condense import condense
from pyhpctk.present.fit import fit_view
from pyhpctk.present.pyview import PIPED_LINES, PyviewOptions, screen
from pyhpctk.present.viewmodel import ViewNode

PROGRAM = Path(__file__).resolve().parent / "programs" / "screen.py"
CPU = "CPUTIME (sec)"
S = 0.1
HEADER_LINES = 3  # title, the note on interpreter frames, column heads


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("screen")
    project = where / "proj"
    (project / "work").mkdir(parents=True)
    shutil.copy(PROGRAM, project / "screen.py")
    measurement, output = where / "m", where / "db"
    command = [sys.executable, str(project / "screen.py"), str(project / "work"), str(S)]
    assert pyrun_main(["-o", str(measurement), *command]) == 0
    run(ProfOptions.build([measurement], output=output))
    return output


def pyview(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def scope(lines: list[str], hidden: bool = False) -> list[str]:
    """The Scope column of the rows (tree drawing, hot-path marks and, unless ``hidden``,
    ``(+N hidden)`` left out)."""
    at = next(i for i, line in enumerate(lines) if line.endswith("Scope"))
    column = lines[at].index("Scope")
    rows = [line[column:].strip().lstrip("* ") for line in lines[at + 1 :]]
    return rows if hidden else [re.sub(r" \(\+\d+ hidden\)$", "", row) for row in rows]


def test_default_view_is_one_row_per_call_and_fits_the_budget(
    capsys: pytest.CaptureFixture[str], database: Path
) -> None:
    full = pyview(capsys, str(database), "--full")
    lines = pyview(capsys, str(database))
    assert len(full) > 200
    # The root, the budget's rows, the line saying how many more there are and the one naming
    # the functions that cost most themselves.
    assert len(lines) == HEADER_LINES + 1 + PIPED_LINES + 2
    assert lines[-2].startswith("... ") and "more rows below the line budget" in lines[-2]
    assert lines[-1].startswith("hottest self: hot ") and "%" in lines[-1]
    rows = scope(lines)[:-2]
    # --full: the function, then the line that calls the next one, each a row.
    assert "hot" in scope(full) and "screen.py: 52" in scope(full)
    # By default one row per call: hot with the line it was called from (issue #36 item 1).
    assert "hot ← screen.py: 52" in rows
    assert "hot" not in rows and "screen.py: 52" not in rows
    # Best-first: hot and its hot line come before the 150 small calls, which fill the rest.
    assert rows.index("hot ← screen.py: 52") < min(
        i for i, r in enumerate(rows) if re.fullmatch(r"f\d+ ← screen\.py: 54", r)
    )
    called = {r for r in scope(full) if r[:1] == "f" and r[1:].isdigit()}  # sampled ones
    assert len(called) > 20
    # With --hot-path the screen is hpcviewer's hot path: the small calls stay folded.
    hot_path = scope(pyview(capsys, str(database), "--hot-path", "50"), hidden=True)
    assert "hot ← screen.py: 52" in [re.sub(r" \(\+\d+ hidden\)$", "", r) for r in hot_path]
    assert not any(re.match(r"burn ← work/many\.py", r) for r in hot_path)
    # --hot-path 100 expands no row holding less than all of its parent: hot's lines stay out.
    assert "screen.py: 42" in rows
    assert "screen.py: 42" not in scope(pyview(capsys, str(database), "--hot-path", "100"))


def test_line_budget_keeps_the_largest_rows_and_says_how_many_more(
    capsys: pytest.CaptureFixture[str], database: Path
) -> None:
    everything = scope(pyview(capsys, str(database), "--hot-path", "0", "--lines", "0"))
    lines = pyview(capsys, str(database), "--hot-path", "0", "--lines", "20")
    rows = scope(lines)[:-1]
    assert len(rows) == 21  # the root and 20 rows
    assert lines[-1].startswith(f"... {len(everything) - 21} more rows below the line budget")
    # The rows kept are the largest: none left out is larger than the smallest kept.
    view = condense(open_database(database).view("top-down", metrics=[CPU]))
    fitted = fit_view(view, 0.0, 20)
    kept = {id(n) for _, n in fitted.view.root.walk()}
    values = {(n.label, round(float(n.values[0]), 12)) for _, n in fitted.view.root.walk()}
    smallest = min(v for _, v in values)
    for _, node in view.root.walk():
        if (node.label, round(float(node.values[0]), 12)) not in values:
            assert float(node.values[0]) <= smallest + 1e-12
    assert fitted.cut == len(everything) - 21 and len(kept) == 21
    assert "hot ← screen.py: 52" in rows


def test_interpreter_frames_are_left_out_and_their_cost_stays_with_the_caller(
    database: Path,
) -> None:
    db = open_database(database)
    shown = db.view("top-down", metrics=[CPU])
    internal = db.view("top-down", metrics=[CPU], show_internal=True)

    def rows(view_root: ViewNode) -> dict[str, ViewNode]:
        return {node.label: node for _, node in view_root.walk()}

    folded, raw = rows(shown.root), rows(internal.root)
    assert any(label.startswith("<frozen importlib") for label in raw)
    assert not any(label.startswith("<frozen importlib") for label in folded)
    assert "interpreter frames" in shown.notes[0]
    # The import line: same inclusive value; the imported module's code right below it.
    imported = folded["screen.py: 49"]
    assert float(imported.values[0]) == pytest.approx(float(raw["screen.py: 49"].values[0]))
    assert float(imported.values[0]) == pytest.approx(S, rel=0.3)
    assert imported.children[0].label.startswith("work/heavy.py: ")
    # Every line: its exclusive value plus its callees' inclusive values is its inclusive
    # value, the elided frames' own time now exclusive to the line that called them.
    for _, node in shown.root.walk():
        if node.kind == "line" and node.children:
            total = float(node.values[1]) + sum(float(c.values[0]) for c in node.children)
            assert total == pytest.approx(float(node.values[0]), rel=1e-9, abs=1e-12)
    for kind in ("bottom-up", "flat"):
        labels = {n.label for _, n in db.view(kind, metrics=[CPU]).root.walk()}
        assert not any("importlib" in label for label in labels), kind
        everything = db.view(kind, metrics=[CPU], show_internal=True)
        assert any("importlib" in n.label for _, n in everything.root.walk()), kind


def test_rows_are_cut_to_the_width(capsys: pytest.CaptureFixture[str], database: Path) -> None:
    lines = pyview(capsys, str(database), "--width", "60", "--hot-path", "0")
    assert max(len(line) for line in lines) <= 60
    assert any(line.endswith("…") for line in lines)
    assert max(len(line) for line in pyview(capsys, str(database), "--full")) > 60


def test_exclusive_order(capsys: pytest.CaptureFixture[str], database: Path) -> None:
    lines = pyview(capsys, str(database), "--bottom-up", "-E", "--lines", "0")
    assert "sorted by CPUTIME (sec) (E)" in lines[0]
    db = open_database(database)
    view = db.view("bottom-up", metrics=[CPU], exclusive=True)
    exclusive = [float(c.values[1]) for c in view.root.children]
    assert exclusive == sorted(exclusive, reverse=True)
    assert view.root.children[0].label == "hot (screen.py: 37)"  # 5 S of its own
    inclusive = [float(c.values[0]) for c in db.view("bottom-up", metrics=[CPU]).root.children]
    assert inclusive == sorted(inclusive, reverse=True)


def test_screen_follows_the_terminal_and_the_options() -> None:
    base = PyviewOptions("db")

    def options(**given: Any) -> PyviewOptions:
        return dataclasses.replace(base, **given)

    terminal = os.terminal_size((120, 40))
    assert screen(options(), terminal) == (120, 34)
    assert screen(options(), None) == (None, PIPED_LINES)
    assert screen(options(lines=0, width=0), terminal) == (None, None)
    assert screen(options(lines=7, width=50), None) == (50, 7)
    assert screen(options(full=True), terminal) == (None, None)

"""Functions by file and name, files by where they sit, module code in its module (#21 item 2).

``tests/programs/same_names``: a program (app.py, tools/util.py) using two packages from a
``site-packages`` directory whose classes both define ``__init__``; it spends 2 S in
``alpha.Model.__init__``, S in ``beta.Model.__init__``, S in ``tools.util.burn`` called from
module-level code and S in that module-level code itself.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.present import open_database
from pyhpctk.present.names import short_paths
from pyhpctk.present.render import render_csv, render_json
from pyhpctk.present.viewmodel import ViewNode

PROGRAM = Path(__file__).resolve().parent / "programs" / "same_names"
CPU = "CPUTIME (sec)"
S = 0.15


def test_files_are_named_inside_their_package_or_the_program() -> None:
    paths = [
        "/venv/lib/python3.11/site-packages/torch/nn/modules/conv.py",
        "/usr/lib/python3/dist-packages/numpy/__init__.py",
        "/opt/py/lib/python3.12/multiprocessing/pool.py",
        "/home/me/proj/app.py",
        "/home/me/proj/pkg/__init__.py",
        "<frozen importlib._bootstrap>",
        "[libc-2.31.so]",
        "rel/x.py",
    ]
    assert short_paths(paths) == (
        "torch/nn/modules/conv.py",
        "numpy/__init__.py",
        "multiprocessing/pool.py",
        "app.py",
        "pkg/__init__.py",
        "<frozen importlib._bootstrap>",
        "[libc-2.31.so]",
        "rel/x.py",
    )
    # Program files sharing no directory but / keep their full paths.
    assert short_paths(["/a/x.py", "/b/y.py"]) == ("/a/x.py", "/b/y.py")


def test_native_sources_do_not_move_the_program_root() -> None:
    # Before: one native source named at its build path (a library's DWARF) made the program's
    # root "/", and the program's own files read absolute in that database only (issue #36).
    own = ["/home/me/proj/app.py", "/home/me/proj/pkg/m.py"]
    native = ["/build/glibc-2.31/malloc/malloc.c", "/home/me/other/ext.c"]
    alone = short_paths(own)
    assert alone == ("app.py", "pkg/m.py")
    assert short_paths([own[0], *native, own[1]]) == (alone[0], *native, alone[1])
    # A program of native sources alone is named relative to where they all are.
    assert short_paths(["/src/a/x.c", "/src/b/y.c"]) == ("a/x.c", "b/y.c")


def test_the_interpreters_own_sources_are_named_in_cpythons_tree() -> None:
    # Before: /tmp/python-build.20260509073455.222/Python-3.11.7/Modules/_randommodule.c: 217
    # (pyenv's build directory, from the interpreter's debug information; issue #36 item 2).
    build = "/tmp/python-build.20260509073455.222/Python-3.11.7"
    paths = [
        f"{build}/Modules/_randommodule.c",
        f"{build}/Modules/clinic/_randommodule.c.h",
        "/build/cpython/Objects/listobject.c",
        "/home/me/proj/app.py",
    ]
    assert short_paths(paths) == (
        "Modules/_randommodule.c [python]",
        "Modules/clinic/_randommodule.c.h [python]",
        "Objects/listobject.c [python]",
        "app.py",
    )
    assert short_paths([*paths[:3], "/home/me/proj/pkg/m.py"])[3] == "m.py"  # root unmoved


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("names")
    site, project = where / "venv" / "site-packages", where / "proj"
    shutil.copytree(PROGRAM / "lib", site)
    shutil.copytree(PROGRAM, project, ignore=shutil.ignore_patterns("lib"))
    measurement, output = where / "m", where / "db"
    command = [sys.executable, str(project / "app.py"), str(site), str(S)]
    assert pyrun_main(["-o", str(measurement), *command]) == 0
    run(ProfOptions.build([measurement], output=output))
    return output


def _rows(node: ViewNode) -> dict[str, float]:
    return {c.label: float(c.values[0]) for c in node.children}


def test_bottom_up_has_one_row_per_function_named_with_its_file(database: Path) -> None:
    db = open_database(database)
    rows = _rows(db.view("bottom-up", metrics=[CPU]).root)
    # Named with their class (the code object's qualified name, issue #36 item 5) and file.
    inits = {label: value for label, value in rows.items() if "__init__ (" in label}
    alpha, beta = "Model.__init__ (alpha/__init__.py: 7)", "Model.__init__ (beta/__init__.py: 10)"
    assert sorted(inits) == [alpha, beta]
    assert inits[alpha] == pytest.approx(2 * S, rel=0.3)
    assert inits[beta] == pytest.approx(S, rel=0.3)
    # Module-level code is the module's: <module> calls burn and has its own time.
    module = next(
        c
        for c in db.view("bottom-up", metrics=[CPU]).root.children
        if c.label == "<module> (app.py)"
    )
    assert float(module.values[1]) == pytest.approx(S, rel=0.3)
    assert "burn (tools/util.py: 6)" in rows


def test_flat_view_files_are_package_paths_and_module_code_is_in_its_module(
    database: Path,
) -> None:
    db = open_database(database)
    flat = db.view("flat", metrics=[CPU])
    (python,) = [c for c in flat.root.children if c.label == "<logical python>"]
    files = {c.label: c for c in python.children}
    assert {"app.py", "tools/util.py", "alpha/__init__.py", "beta/__init__.py"} <= set(files)
    assert "<unknown module>" not in _rows(flat.root)
    (module,) = [c for c in files["app.py"].children if c.label == "<module> (app.py)"]
    assert float(module.values[1]) == pytest.approx(S, rel=0.3)  # its own time, exclusive
    assert float(module.values[0]) == pytest.approx(5 * S, rel=0.3)  # everything it called


def test_csv_and_json_rows_keep_functions_apart_by_file(database: Path) -> None:
    db = open_database(database)
    view = db.view("bottom-up", metrics=[CPU])
    text = io.StringIO()
    render_csv(view, text)
    rows = [r for r in csv.DictReader(io.StringIO(text.getvalue())) if r["depth"] == "1"]
    inits = sorted(
        Path(r["file"]).parent.name for r in rows if r["scope"].startswith("Model.__init__")
    )
    assert inits == ["alpha", "beta"]
    text = io.StringIO()
    render_json(view, text)
    top = json.loads(text.getvalue())["root"]["children"]
    files = sorted(c["file"] for c in top if c["scope"].startswith("Model.__init__ ("))
    assert [Path(f).parent.name for f in files] == ["alpha", "beta"]


def test_top_down_lines_are_named_by_package_and_program_paths(database: Path) -> None:
    db = open_database(database)
    labels = {n.label for _, n in db.view("top-down", metrics=[CPU]).root.walk()}
    assert "tools/util.py: 11" in labels
    assert any(label.startswith("alpha/__init__.py: ") for label in labels)
    assert not any(label.startswith("__init__.py: ") for label in labels)

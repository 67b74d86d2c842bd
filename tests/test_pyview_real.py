"""The default screen of real programs shows their hot code (issue #36 items 1, 5 and 6).

``tests/programs/real/`` holds programs in the style of the issue's: a pyperf-like worker with
seven pass-through frames around a raytrace-like compute (``Vector.__sub__``, ``Point.__sub__``,
``Sphere.intersect``), a ThreadPoolExecutor, six asyncio workers on a queue and a spawn
multiprocessing Pool. Each hot function measures its own thread CPU time (it calls nothing of
Python's while its clock runs), and the program writes the totals: the truth each test reads
the top three self-time functions from. A 30-row terminal leaves 25 rows to the view.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main
from pyhpctk.present import open_database

PROGRAMS = Path(__file__).resolve().parent / "programs" / "real"
#: Each program and its size: about half a second of CPU time in its hot functions.
SIZES = {"raytrace": 6000, "thread_pool": 4000, "asyncio_workers": 3000, "spawn_pool": 1500}
TERMINAL_ROWS = 30
#: title, column heads, a note, the "more rows" and "hottest self" lines, the prompt
BUDGET = TERMINAL_ROWS - 6
HOTTEST = "hottest self: "


def measure(where: Path, name: str, size: int) -> Path:
    """Run program ``name`` under pyrun and pyprof in ``where``: its database ``db`` and its
    own timing ``truth.json`` are there."""
    project = where / "proj"
    shutil.copytree(PROGRAMS, project)
    command = [sys.executable, str(project / f"{name}.py"), str(where / "truth.json")]
    measure_command(where, [*command, str(size)])
    return where


def measure_command(where: Path, command: list[str]) -> Path:
    """pyrun and pyprof of ``command`` in ``where``: the database."""
    assert pyrun_main(["-o", str(where / "m"), *command]) == 0
    run(ProfOptions.build([where / "m"], output=where / "db"))
    return where / "db"


@pytest.fixture(scope="module", params=sorted(SIZES))
def program(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A measured program (:func:`measure`)."""
    name = str(request.param)
    return measure(tmp_path_factory.mktemp(name), name, SIZES[name])


def top_three(where: Path) -> list[str]:
    truth: dict[str, float] = json.loads((where / "truth.json").read_text())
    return sorted(truth, key=lambda name: -truth[name])[:3]


def screen(capsys: pytest.CaptureFixture[str], *argv: str) -> list[tuple[int, str]]:
    """The rows of ``pyview --lines BUDGET ARGV``: (depth, scope), from a screen that fits;
    each function the ``hottest self:`` line names is a row of depth -1."""
    assert main(["--lines", str(BUDGET), *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= TERMINAL_ROWS
    at = next(i for i, line in enumerate(lines) if line.endswith("Scope"))
    column = lines[at].index("Scope")
    rows = []
    for line in lines[at + 1 :]:
        if line.startswith("... "):
            continue
        if line.startswith(HOTTEST):
            names = line.removeprefix(HOTTEST).rsplit(" (", 1)[0].split(" · ")
            rows.extend((-1, name.rsplit(" ", 1)[0]) for name in names)
            continue
        text = line[column:]
        depth = (len(text) - len(text.lstrip(" "))) // 2
        rows.append((depth, re.sub(r" \(\+\d+ hidden\)$", "", text.strip().lstrip("* "))))
    return rows


def named(function: str, row: str) -> bool:
    """Whether ``row`` is ``function``'s: its call, its bottom-up row, or a chain's end."""
    return re.match(rf"(.* → … → )?{re.escape(function)}( ←| \(|$)", row) is not None


def test_default_screen_names_the_top_three_self_time_functions_with_their_class(
    capsys: pytest.CaptureFixture[str], program: Path
) -> None:
    rows = [row for _, row in screen(capsys, str(program / "db"))]
    for function in top_three(program):
        assert "." in function  # Class.method: the qualified name is what the row must show
        assert any(named(function, row) for row in rows), (function, rows)


def test_bottom_up_screen_lists_the_top_self_functions_first_and_not_their_chains(
    capsys: pytest.CaptureFixture[str], program: Path
) -> None:
    rows = screen(capsys, str(program / "db"), "--bottom-up", "-E")
    functions = [row for depth, row in rows if depth == 1]
    # The three that cost most themselves are among the first rows, whatever calls them (native
    # functions, named since pyprof reads the libraries' symbols, may rank among them: a thread
    # pool's pthread_cond_signal under load).
    for function in top_three(program):
        assert any(named(function, row) for row in functions[:8]), (function, functions)
    # Chains of single callers do not fill the screen: every function that costs anything
    # itself is listed before any caller (before: 8 functions and 4 twelve-row chains).
    view = open_database(program / "db").view("bottom-up", exclusive=True)
    costly = [c.label for c in view.root.children if float(c.values[1]) > 0]
    assert len(functions) >= min(len(costly), BUDGET), (costly, rows)


def test_bottom_up_root_is_no_function_of_its_own(
    capsys: pytest.CaptureFixture[str], program: Path
) -> None:
    # Before: the root row read 100 % exclusive (every function's self cost over again).
    assert main([str(program / "db"), "--bottom-up", "-E", "--lines", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith("Scope"))
    root = lines[at + 1].split()
    assert root[1] == "100.0%" and root[3] == "0.0%", lines[at + 1]


def test_a_coroutine_is_one_row_however_the_loop_resumed_it(
    capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Before: asyncio's C accelerator resumed `worker` through task_step or
    # TaskStepMethWrapper_call, and each path was a `worker` row of its own (issue #36: 48/47 %).
    # Three thousand items: the second path holds a few percent, sampled every time.
    where = measure(tmp_path_factory.mktemp("coroutines"), "asyncio_workers", 3000)
    assert main([str(where / "db"), "--lines", "0"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^.*(?:\bworker ←|→ worker \().*$", out, re.M)
    assert len(rows) == 1, out


# A native frame nothing named: ``libc.so.6+0xcf438``, ``python3.11+0x1a2b`` (issue #36 item 2).
# A hidden function named after the nearest symbol before it (``omp_in_final+0xa0 [libgomp.so]``)
# has a name, and its library.
RAW_FRAME = re.compile(r"\S\+0x[0-9a-f]+(?![0-9a-f]| \[)")
#: Programs whose hot code is native libraries', and their sizes: sklearn's OpenMP and OpenBLAS
#: (numpy's), sympy's Python over the interpreter's C.
LIBRARY_SIZES = {"sklearn_pipeline": 3000, "sympy_work": 4}


@pytest.fixture(scope="module", params=sorted(LIBRARY_SIZES))
def library_program(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A measured program whose hot code is a native library's (:func:`measure`)."""
    name = str(request.param)
    pytest.importorskip(name.split("_")[0], reason="sympy and scikit-learn are in the dev extra")
    return measure(tmp_path_factory.mktemp(name), name, LIBRARY_SIZES[name])


@pytest.mark.parametrize("view", [[], ["--bottom-up", "-E"]], ids=["top-down", "bottom-up"])
def test_every_native_frame_on_the_screen_has_a_name_without_pystruct(
    capsys: pytest.CaptureFixture[str], library_program: Path, view: list[str]
) -> None:
    # Before: libc.so.6+0x..., libgomp-e985bcbb.so.1.0.0+0x... and ten
    # libscipy_openblas64_....so+0x... rows: pyprof named only what pystruct had analyzed.
    # (rows of depth -1, on main's screen, are the names a "hottest self:" line lists, less
    # their "[lib.so]": the rows themselves are checked)
    rows = [row for depth, row in screen(capsys, str(library_program / "db"), *view) if depth >= 0]
    assert not [row for row in rows if RAW_FRAME.search(row)], rows
    assert not [row for row in rows if row.startswith("[")], rows  # an unnamed call site


@pytest.fixture(scope="module")
def mypyc_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/programs/real/ with ``geometry.py`` compiled by mypyc beside it."""
    pytest.importorskip("mypyc", reason="mypyc comes with mypy, in the dev extra")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("mypyc needs a C compiler")
    where = tmp_path_factory.mktemp("mypyc")
    project = where / "proj"
    shutil.copytree(PROGRAMS, project)
    mypyc = Path(sys.executable).parent / "mypyc"
    done = subprocess.run(
        [str(mypyc), "geometry.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, MYPYC_OPT_LEVEL="2"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (project / "geometry.py").unlink()  # the compiled module is the one imported
    assert list(project.glob("geometry.*.so")), list(project.iterdir())
    return where


def test_mypyc_compiled_functions_are_named_as_the_source_names_them(
    capsys: pytest.CaptureFixture[str], mypyc_program: Path
) -> None:
    # Before: CPyPy_Vector___dot [geometry.cpython-311-x86_64-linux-gnu.so] and
    # CPyDef_Vector___dot rows, and no row named Vector.dot. The wrapper Python calls is left
    # out: a method and the mypyc runtime helper that does most of its work are two rows,
    # never a chain folded into one row that ends with the helper.
    project = mypyc_program / "proj"
    truth = mypyc_program / "truth.json"
    # About half a second of CPU time in the three methods: compiled, they run ~40x faster.
    command = [sys.executable, str(project / "compiled_geometry.py"), str(truth), "5000000"]
    db = measure_command(mypyc_program, command)
    module = json.loads(Path(f"{truth}.module").read_text())["file"]
    assert module.endswith(".so"), module  # the compiled module, not the Python source
    rows = [row for _, row in screen(capsys, str(db))]
    for function in top_three(mypyc_program):
        assert "." in function
        assert any(named(function, row) for row in rows), (function, rows)
    # No raw address of the compiled module or of a library, no mangled name (a stripped
    # library's code past its last symbol may read ``symbol+0x… [lib]``: test_native_names).
    raw = re.compile(r"(^|\s|← )[\w.+-]+\.so[\w.]*\+0x[0-9a-f]+")
    assert not [row for row in rows if raw.search(row) or "CPyDef_" in row], rows
    assert not [row for row in rows if "mypyc wrapper" in row], rows
    # (a chain that is no method's may fold: the compiled module's import, PyInit_geometry →
    # … → __top_level__, is on the screen when a loaded machine samples it long enough)
    methods = [function.rsplit(".", 1)[-1] for function in top_three(mypyc_program)]
    folded = [row for row in rows if "frames folded" in row]
    assert not [row for row in folded if any(method in row for method in methods)], rows
    assert len(rows) <= BUDGET

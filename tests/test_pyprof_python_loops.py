"""Python loops in the calling context tree: pyrun → pystruct → pyprof (issue #5, item 4).

HPCToolkit places Python samples at function and line; with the structure pystruct recovers
from the sources, pyprof also places them inside the loops that contain them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyhpctk.analysis.compare import read_view
from pyhpctk.analysis.context import LexicalType
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run as run_pyprof
from pyhpctk.analysis.python_loops import PythonLoops
from pyhpctk.cli.pyrun import main as pyrun
from pyhpctk.cli.pystruct import main as pystruct
from pyhpctk.structure.python_source import recover_structure

PROGRAM = """\
import time


def kernel(n):
    total = 0
    for i in range(n):
        for j in range(30):
            total += i * j % 7
    return total


def warmup(n):
    return sum(k * k for k in range(n))


# About 0.2 s of CPU in kernel on any machine: sized by timing a short call, not by a count
# that is long enough only on a slow one.
began = time.process_time()
kernel(300)
kernel(int(300 * 0.2 / max(time.process_time() - began, 1e-6)))
warmup(10)
"""


def _line_of(text: str, source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def test_loop_lookup_follows_the_source(tmp_path: Path) -> None:
    source = tmp_path / "app.py"
    source.write_text(PROGRAM)
    loops = PythonLoops(recover_structure(str(source)).modules[0])
    outer, inner = _line_of("for i in", PROGRAM), _line_of("for j in", PROGRAM)
    body = _line_of("total += i * j", PROGRAM)
    kernel = _line_of("def kernel", PROGRAM)
    assert loops.loops("kernel", kernel, body) == (outer, inner)
    assert loops.loops("kernel", kernel, inner) == (outer, inner)  # a header is in its loop
    assert loops.loops("kernel", kernel, outer) == (outer,)
    assert loops.loops("kernel", kernel, _line_of("return total", PROGRAM)) == ()
    assert loops.loops("kernel", kernel + 1, body) == ()  # not that function: no loops
    assert loops.loops("nosuch", 1, body) == ()


METHOD = """\
class Grid:
    def kernel(self, n):
        total = 0
        for i in range(n):
            total += i
        return total
"""


def test_a_method_is_found_by_its_qualified_name(tmp_path: Path) -> None:
    # pyrun names frames by co_qualname (issue #36 item 5): before, "Grid.kernel" matched no
    # procedure (pystruct's n is co_name) and a method's samples lost their loops.
    source = tmp_path / "grid.py"
    source.write_text(METHOD)
    loops = PythonLoops(recover_structure(str(source)).modules[0])
    first, loop = _line_of("def kernel", METHOD), _line_of("for i in", METHOD)
    body = _line_of("total += i", METHOD)
    assert loops.loops("Grid.kernel", first, body) == (loop,)
    assert loops.loops("kernel", first, body) == (loop,)  # a measurement named by co_name
    assert loops.loops("Other.kernel", first, body) == ()


def test_samples_land_inside_the_python_loops_that_contain_them(tmp_path: Path) -> None:
    source = tmp_path / "app.py"
    source.write_text(PROGRAM)
    measurements = tmp_path / "m"
    assert pyrun(["-e", "CPUTIME@1000", "-o", str(measurements), sys.executable, str(source)]) == 0
    assert pystruct([str(measurements)]) == 0
    database = tmp_path / "db"
    run_pyprof(ProfOptions.build([str(measurements)], output=str(database)))
    view = read_view(database)
    outer, inner = _line_of("for i in", PROGRAM), _line_of("for j in", PROGRAM)
    body = _line_of("total += i * j", PROGRAM)
    loop_paths = []
    for path in view.paths().values():
        steps = [label for label in path if isinstance(label, tuple) and label[0] != "entry"]
        loops = [s[4] for s in steps if int(s[1]) == int(LexicalType.LOOP)]
        if loops:
            loop_paths.append((loops, steps[-1]))
    assert loop_paths, "no loop contexts in the database"
    headers = {tuple(loops) for loops, _ in loop_paths}
    assert (outer, inner) in headers
    lines_in_inner = {
        int(last[4])
        for loops, last in loop_paths
        if tuple(loops) == (outer, inner) and int(last[1]) == int(LexicalType.LINE)
    }
    assert body in lines_in_inner


PACKAGE = """\
import time


def spin(seconds):
    total = 0
    end = time.process_time() + seconds
    while time.process_time() < end:
        for i in range(500):
            total += i * i % 7
    return total
"""


def _loops_by_file(database: Path) -> dict[str, set[int]]:
    """The loop header lines each source file has in the database's calling context tree."""
    found: dict[str, set[int]] = {}
    for path in read_view(database).paths().values():
        for label in path:
            if not isinstance(label, tuple) or label[0] == "entry" or label[3] is None:
                continue
            if int(label[1]) == int(LexicalType.LOOP):
                found.setdefault(str(label[3]), set()).add(int(label[4]))
    return found


def test_every_package_init_keeps_its_loops(tmp_path: Path) -> None:
    """Issue #21, item 4: the ``__init__.py`` of several packages, each with loops that run.

    Before, pystruct wrote every one to ``structs/__init__.py.hpcstruct``, each replacing the
    one before, so only the last package analysed kept its loops in the profile.
    """
    packages = ["alpha", "beta", "gamma"]
    headers: dict[str, tuple[int, int]] = {}
    for number, name in enumerate(packages):
        init = tmp_path / name / "__init__.py"
        init.parent.mkdir()
        # Each package's loops on other lines, so a loop found in one file is that file's own.
        text = "# padding\n" * (3 * number) + PACKAGE
        init.write_text(text)
        headers[str(init)] = (_line_of("while time", text), _line_of("for i in", text))
    app = tmp_path / "app.py"
    app.write_text(
        "".join(f"import {name}\n" for name in packages)
        + "".join(f"{name}.spin(0.15)\n" for name in packages)
    )
    measurements = tmp_path / "m"
    program = [sys.executable, str(app)]
    assert pyrun(["-e", "CPUTIME@1000", "-o", str(measurements), *program]) == 0
    assert pystruct([str(measurements), "-q"]) == 0
    written = sorted(p.name for p in (measurements / "structs").glob("__init__.py*.hpcstruct"))
    # one each (a sample that lands in another package's __init__.py at start-up adds its own)
    ours = [
        name
        for name in written
        if any(
            str(tmp_path / package) in (measurements / "structs" / name).read_text()
            for package in packages
        )
    ]
    assert len(ours) == len(packages), written
    database = tmp_path / "db"
    run_pyprof(ProfOptions.build([str(measurements)], output=str(database)))
    loops = _loops_by_file(database)
    for init, (outer, inner) in headers.items():
        assert loops.get(init) == {outer, inner}, (init, loops)


def test_a_package_init_that_joins_later_moves_and_leaves_no_stale_structure(
    tmp_path: Path,
) -> None:
    """A second ``__init__.py`` appended to a measurement gives the first one a name of its
    own; the file written under the plain name before is removed, not left describing the
    same source twice."""
    for name in ("alpha", "beta"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(PACKAGE)
    measurements = tmp_path / "m"
    for name in ("alpha", "beta"):
        app = tmp_path / f"run_{name}.py"
        app.write_text(f"import {name}\n{name}.spin(0.05)\n")
        args = ["-e", "CPUTIME@1000", "-o", str(measurements), "--append"]
        assert pyrun([*args, sys.executable, str(app)]) == 0
        assert pystruct([str(measurements), "-q"]) == 0
    structs = measurements / "structs"
    inits = sorted(p.name for p in structs.glob("__init__.py*.hpcstruct"))
    # a sample that lands in another package's __init__.py at start-up adds its own
    ours = [
        name
        for name in inits
        if any(
            str(tmp_path / package) in (structs / name).read_text() for package in ("alpha", "beta")
        )
    ]
    assert len(ours) == 2 and "__init__.py.hpcstruct" not in inits, inits
    manifest = json.loads((structs / ".pystruct-manifest.json").read_text())
    assert set(inits) <= set(manifest) and "__init__.py.hpcstruct" not in manifest

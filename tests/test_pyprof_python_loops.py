"""Python loops in the calling context tree: pyrun → pystruct → pyprof (issue #5, item 4).

HPCToolkit places Python samples at function and line; with the structure pystruct recovers
from the sources, pyprof also places them inside the loops that contain them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyhpctk.analysis.compare import read_view
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run as run_pyprof
from pyhpctk.analysis.python_loops import PythonLoops
from pyhpctk.cli.pyrun import main as pyrun
from pyhpctk.cli.pystruct import main as pystruct
from pyhpctk.core.context import LexicalType
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

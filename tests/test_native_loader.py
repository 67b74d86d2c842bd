"""The dynamic loader's functions are native frames like any library's (found comparing the
scikit-learn program's screen with Linux perf, issue #36).

The kernel maps the vDSO a few pages below ld.so (here its header 12 KiB below the loader's
text), and the engine took any module whose text began within 64 KiB of the vDSO's header for
the vDSO, whose frames it leaves out: the loader's frames were dropped and their time was its
libc caller's own (``do_sym``, ``_dl_catch_exception [libc.so.6]``), while perf put 91 % of the
program below in ``do_lookup_x``, ``_dl_lookup_symbol_x``... of ``ld-linux-x86-64.so.2``.

The program loads and unloads SQLite's library (``RTLD_NOW``: every symbol bound, in the
loader) and times the calls itself, the truth: the share of its CPU time spent loading. What
is not the loader's in that time is libc's (``dlopen``'s wrappers, ``malloc``) and the
constructors'; perf puts 91 % of the program's user time in the loader, so the loader's
functions must hold at least four fifths of the loading share.
"""

from __future__ import annotations

import ctypes.util
import json
import sys
from pathlib import Path

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.measure import _engine  # type: ignore[attr-defined]
from pyhpctk.present import open_database

PROGRAM = """\
import _ctypes, json, sys, time

path, truth = sys.argv[1], sys.argv[2]
loading = 0.0
stop = time.process_time() + 1.0
while time.process_time() < stop:
    start = time.thread_time()
    _ctypes.dlclose(_ctypes.dlopen(path, 2))  # RTLD_NOW | RTLD_LOCAL
    loading += time.thread_time() - start
json.dump({"loading": loading, "cpu": time.process_time()}, open(truth, "w"))
"""


def test_the_loaders_functions_hold_the_time_spent_loading(tmp_path: Path) -> None:
    # Before: no function of ld-linux-x86-64.so.2 at all; do_sym [libc.so.6] held its time.
    if not _engine.NATIVE_SUPPORTED:
        pytest.skip("native frames are recorded on x86-64 Linux")
    library = ctypes.util.find_library("sqlite3")
    if library is None:
        pytest.skip("no libsqlite3 to load (the program loads and unloads it)")
    program, truth_file = tmp_path / "load.py", tmp_path / "truth.json"
    program.write_text(PROGRAM)
    command = [sys.executable, str(program), library, str(truth_file)]
    assert pyrun_main(["-o", str(tmp_path / "m"), "-e", "CPUTIME@1000", *command]) == 0
    run(ProfOptions.build([tmp_path / "m"], output=tmp_path / "db"))
    truth = json.loads(truth_file.read_text())
    expected = 100 * truth["loading"] / truth["cpu"]
    assert expected > 50, truth  # the program spends most of its time loading

    view = open_database(tmp_path / "db").view("bottom-up", exclusive=True)
    total = float(view.root.values[0])
    shares = {child.label: 100 * float(child.values[1]) / total for child in view.root.children}
    loader = {label: share for label, share in shares.items() if "[ld-linux" in label}
    top = sorted(shares, key=lambda label: -shares[label])[:5]
    assert sum(loader.values()) >= 0.8 * expected, (expected, top)
    assert "[ld-linux" in top[0], top  # the costliest function is the loader's, by its name
    assert not top[0].startswith("ld-linux"), top  # named: not `ld-linux… @ 0x…`

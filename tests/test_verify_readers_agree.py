"""What ``pyhpctk verify`` accepts, the readers read cleanly; what a reader refuses, verify
reports (issue #32 item 5).

Each test damages one file of a copy of HPCToolkit's ``loops-cputime-t.d`` (which verifies
clean) and runs verify and the reader that choked on it: ``pyview`` as a user runs it, in a
process of its own (no traceback; one line on stderr, or a clean view).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.main import main as pyhpctk
from pyhpctk.formats import profiledb

REFERENCE = "loops-cputime-t.d"


@pytest.fixture
def database(reference: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "db"
    shutil.copytree(reference / "dbase" / REFERENCE, copy)
    return copy


def pyview(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pyhpctk.cli.pyview", "--no-color", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    status = pyhpctk(["verify", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out.splitlines() + err.splitlines()


def test_a_trace_line_of_a_profile_profile_db_lacks_is_reported_and_refused_in_one_line(
    database: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first trace line names profile 99 of a database of 2 profiles: verify's problem,
    and pyview's trace views refuse the trace in one line (it was an IndexError)."""
    trace = database / "trace.db"
    raw = bytearray(trace.read_bytes())
    (section,) = struct.unpack_from("<Q", raw, 0x18)  # the ctxTraces section's pointer
    (lines,) = struct.unpack_from("<Q", raw, section)  # pTraces: the line headers
    struct.pack_into("<I", raw, lines, 99)  # line 0's profIndex
    trace.write_bytes(bytes(raw))
    status, said = verify(database, capsys)
    assert status == 1
    assert any("line 0: profile index 99 is not a thread profile of profile.db" in s for s in said)
    for view in ("--trace-summary", "--blame"):
        done = pyview(view, str(database))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"pyview: error: {trace}: trace line 0: profile index 99 is not")
    assert pyview(str(database)).returncode == 0  # the profile views do not need the trace


def test_a_metric_taxonomy_that_is_not_utf8_is_read_and_checked(
    database: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte that is not UTF-8 in metrics/default.yaml: pyview read it with a
    UnicodeDecodeError. Now a byte in a comment is read past; one in a metric's name makes the
    taxonomy disagree with meta.db, which verify reports and pyview says once, showing meta.db's
    metrics."""
    taxonomy = database / "metrics" / "default.yaml"
    text = taxonomy.read_bytes()
    taxonomy.write_bytes(b"# caf\xe9\n" + text)
    assert verify(database, capsys)[0] == 0
    clean = pyview(str(database))
    assert clean.returncode == 0 and clean.stderr == "", clean.stderr
    name = b"CPUTIME (sec)"
    assert text.count(b"inputs:") and name in text
    taxonomy.write_bytes(text.replace(b"metric: " + name, b"metric: CPU\xff (sec)"))
    status, said = verify(database, capsys)
    assert status == 1
    (problem,) = said
    assert problem.startswith(f"problem: {taxonomy}: metric taxonomy: disagrees with meta.db")
    shown = pyview(str(database))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    (warning,) = shown.stderr.splitlines()
    assert warning.startswith("warning: ") and "showing meta.db's metrics instead" in warning


def test_a_summary_larger_than_the_thread_profiles_it_sums_is_reported(
    database: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every value of the summary profile made 1e300: the views would show 1e300 s of CPU
    time over threads that spent seconds; verify said ok."""
    path = database / "profile.db"
    profiles = profiledb.read(path)
    blocks = [
        profiledb.ProfileValues(np.array(b.ctx_indices), np.array(b.values))
        for b in profiles.values
    ]
    blocks[0].values["value"] = 1e300
    damaged = profiledb.ProfileDB(list(profiles.profiles), blocks, profiles.block_order)
    del profiles
    profiledb.write(damaged, path)
    status, said = verify(database, capsys)
    assert status == 1
    (problem,) = [s for s in said if "summary profile" in s]
    assert problem.startswith(f"problem: {path}: summary profile: ")
    assert "sums are larger than the sums of the thread profiles' values (context 0 " in problem

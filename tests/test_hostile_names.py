"""Names holding NUL, control characters and terminal escape sequences, from pyrun to pyview
(issue #32 item 6).

Python lets a function's name hold any character (``code.replace(co_qualname=...)``) and a thread's
name too. The formats hold C strings, so pyrun writes a NUL of a name as the four characters
``\\x00`` (every reader takes the file); the text views write every character a terminal would
act on as Python escapes it, so ``\\x1b[2J`` (clear the screen) or an OSC title sequence in a
name reaches the terminal as text, never as the sequence.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pyhpctk.cli.main import main as pyhpctk
from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.cli.pyrun import main as pyrun
from pyhpctk.formats import logical

FUNCTION = "bad\x00name\x1b[2J"  # NUL, then the sequence that clears the screen
THREAD = "main\x1b]0;pwned\x07\n"  # an OSC sequence that sets the terminal's title, a newline
PROGRAM = f"""\
import threading, time

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

burn.__code__ = burn.__code__.replace(co_name={FUNCTION!r}, co_qualname={FUNCTION!r})
threading.current_thread().name = {THREAD!r}
burn(0.3)
"""
# What the views show: the same names, each control character written as Python escapes it.
SHOWN_FUNCTION = rb"bad\x00name\x1b[2J"
SHOWN_THREAD = rb"main\x1b]0;pwned\x07\n"


def pyview(*args: str) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "pyhpctk.cli.pyview", "--no-color", *args]
    return subprocess.run(argv, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def measurement(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    script = root / "hostile.py"
    script.write_text(PROGRAM)
    assert pyrun(["-o", str(root / "m"), "-t", sys.executable, str(script)]) == 0
    return root / "m"


@pytest.fixture(scope="module")
def database(measurement: Path) -> Path:
    assert pyprof(["-o", str(measurement.parent / "d"), str(measurement)]) == 0
    return measurement.parent / "d"


def test_pyrun_writes_a_name_holding_nul_that_every_reader_takes(
    measurement: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (file,) = (measurement / "logical").iterdir()
    names = {s.funcname for s in logical.read(file).stanzas}
    assert "bad\\x00name\x1b[2J" in names  # the NUL as \x00, the rest as it was
    assert pyhpctk(["verify", str(measurement)]) == 0
    capsys.readouterr()
    assert pyprof(["-o", str(tmp_path / "d"), str(measurement)]) == 0
    err = capsys.readouterr().err
    assert "unreadable" not in err and "stay raw" not in err, err


@pytest.mark.parametrize(
    "view", [[], ["--bottom-up"], ["--flat"], ["--trace-summary"], ["--csv", "-"]]
)
def test_the_text_views_escape_control_characters_of_names(database: Path, view: list[str]) -> None:
    done = pyview(*view, "--full", str(database))
    assert done.returncode == 0, done.stderr
    assert SHOWN_FUNCTION in done.stdout, done.stdout
    if view == ["--trace-summary"]:
        assert SHOWN_THREAD in done.stdout, done.stdout
    for control in (b"\x1b", b"\x00", b"\x07"):
        assert control not in done.stdout + done.stderr

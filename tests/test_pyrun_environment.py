"""Python processes that a launcher starts with a cleared environment (issue #21, item 6).

pyrun reaches a process only through its environment. A child started with ``env -i``, or by a
runner that passes a list of variables (pyperf), was unmeasured without a word: now pyrun names
every Python process it saw start and could not measure, and why; a child that kept
``PYTHONPATH`` finds the rest from the pyrun above it; and ``pyrun --install-pth VENV`` lets
the interpreters of a venv find it even with an empty environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpctk.cli.pyrun import main
from pyhpctk.measure.census import why_unreached
from pyhpctk.measure.launch import rendezvous
from pyhpctk.measure.launch.bootstrap import rescue
from pyhpctk.measure.launch.launcher import RunOptions, run
from test_pyrun import read_measurements

PROGRAM = Path(__file__).resolve().parent / "programs" / "cleared.py"
CLEARED = "its environment lost pyrun's variables and PYTHONPATH"


def _pids(directory: Path) -> set[int]:
    return {m.pid for m in read_measurements(directory)}


def test_a_child_started_with_env_i_is_named_as_unmeasured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, pidfile = tmp_path / "m", tmp_path / "child.pid"
    result = run(RunOptions((sys.executable, str(PROGRAM), "env-i", str(pidfile)), str(out)))
    child = int(pidfile.read_text())
    err = capsys.readouterr().err
    # Before: exit 0, the parent's profile, and not a word about the child.
    assert result.returncode == 0 and child not in _pids(out) and len(_pids(out)) == 1
    assert (result.python_started, result.python_measured) == (2, 1)
    assert [p.pid for p in result.unmeasured] == [child]
    assert "started 2 Python processes; 1 of them was not measured" in err
    (line,) = [line for line in err.splitlines() if line.startswith(f"  pid {child} (")]
    assert line.startswith(f"  pid {child} ({Path(sys.executable).name} {PROGRAM} child")
    assert f"): {CLEARED} (cleared with env -i, or passed through a list" in line
    assert "pyrun --install-pth VENV" in err


def test_a_runner_passing_a_list_of_variables_loses_the_child_unless_pythonpath_is_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pyperf passes PATH and HOME (and --inherit-environ NAMES): without PYTHONPATH the child
    is named as unmeasured; with it, the bootstrap takes the rest from the pyrun above it."""
    pidfile = tmp_path / "child.pid"
    args = [sys.executable, str(PROGRAM), "list", str(pidfile)]
    assert main(["-o", str(tmp_path / "bare"), *args]) == 0
    child = int(pidfile.read_text())
    err = capsys.readouterr().err
    assert child not in _pids(tmp_path / "bare")
    assert f"  pid {child} (" in err and CLEARED in err
    assert main(["-o", str(tmp_path / "kept"), *args, "PYTHONPATH"]) == 0
    child = int(pidfile.read_text())
    # Before: only PYHPCTK_PYRUN_OUT was kept and the rest were lost, and the child ran unmeasured.
    measured = {m.pid: m for m in read_measurements(tmp_path / "kept")}
    assert child in measured and measured[child].nodes_named("child_work")
    assert "not measured" not in capsys.readouterr().err


def test_install_pth_reaches_a_child_in_a_cleared_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    assert main(["--install-pth", str(venv)]) == 0
    (pth,) = venv.glob(f"lib/python*/site-packages/{rendezvous.PTH_NAME}")
    assert f"wrote {pth}" in capsys.readouterr().err
    pidfile = tmp_path / "child.pid"
    assert main(["-o", str(tmp_path / "m"), str(python), str(PROGRAM), "env-i", str(pidfile)]) == 0
    child = int(pidfile.read_text())
    measured = {m.pid: m for m in read_measurements(tmp_path / "m")}
    assert child in measured and measured[child].nodes_named("child_work")
    assert "not measured" not in capsys.readouterr().err
    # Outside pyrun the line changes nothing: no module, no variable, no path of pyrun's.
    probe = (
        "import os, sys; print(sorted(m for m in sys.modules if 'pyhpctk' in m or 'rescue' in m),"
        " sorted(k for k in os.environ if k.startswith('PYHPCTK')), "
        "[p for p in sys.path if 'bootstrap' in p])"
    )
    done = subprocess.run(
        ["env", "-i", str(python), "-c", probe], capture_output=True, text=True, check=True
    )
    assert (done.stdout, done.stderr) == ("[] [] []\n", "")
    assert main(["--uninstall-pth", str(venv)]) == 0
    assert not pth.exists() and f"removed {pth}" in capsys.readouterr().err
    assert main(["--uninstall-pth", str(venv)]) == 0  # twice: nothing left to remove, said so
    assert "nothing to remove" in capsys.readouterr().err


def test_uninstall_pth_removes_only_its_own_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / rendezvous.PTH_NAME).write_text("import something_else\n")
    assert main(["--uninstall-pth", str(venv)]) == 2
    assert "not written by pyrun --install-pth; not removing it" in capsys.readouterr().err
    assert (site / rendezvous.PTH_NAME).read_text() == "import something_else\n"
    assert main(["--install-pth", str(tmp_path / "nothing")]) == 2
    assert "neither a venv (no pyvenv.cfg) nor a Python interpreter" in capsys.readouterr().err


def test_settings_are_left_only_in_a_directory_no_one_else_can_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(rescue, "RUN_DIRECTORY", str(shared))
    assert rendezvous.publish({"PYHPCTK_PYRUN_OPTIONS": "/x"}) is None
    assert list(shared.iterdir()) == []
    assert not rescue.restore_settings()
    private = tmp_path / "private"
    monkeypatch.setattr(rescue, "RUN_DIRECTORY", str(private))
    path = rendezvous.publish({"PYHPCTK_PYRUN_OPTIONS": "/x", "HOME": "/home/u"})
    assert path is not None and Path(path).read_bytes() == b"PYHPCTK_PYRUN_OPTIONS=/x"
    assert oct(private.stat().st_mode & 0o777) == oct(0o700)
    rendezvous.withdraw(path)
    assert list(private.iterdir()) == []


@pytest.mark.parametrize(
    ("environ", "argv", "why"),
    [
        (b"", [b"python3", b"-I", b"app.py"], "run with -I, which ignores PYTHONPATH"),
        (b"", [b"python3", b"-W", b"ignore", b"-E", b"x"], "run with -E, which ignores"),
        (b"", [b"python3", b"-c", b"-I"], CLEARED),  # -I after -c is the program's
        (
            b"PYTHONPATH=/boot",
            [b"python3", b"a.py"],
            "its environment lost pyrun's PYHPCTK_PYRUN_*",
        ),
        (b"PYHPCTK_PYRUN_OPTIONS=/m\0PYTHONPATH=/x", [b"python3"], "its PYTHONPATH lost pyrun's"),
        (b"PYHPCTK_PYRUN_OPTIONS=/m\0PYTHONPATH=/x" + os.pathsep.encode() + b"/boot", [b"p"], ""),
    ],
)
def test_why_a_process_was_not_reached(environ: bytes, argv: list[bytes], why: str) -> None:
    found = why_unreached(environ, argv, "/boot")
    assert found.startswith(why) if why else found == ""

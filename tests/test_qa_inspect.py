"""QA findings in ``pyhpctk verify``: a measurement missing its Python function table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyhpctk.cli.main import main
from pyhpctk.cli.pyrun import main as pyrun


def test_missing_logical_file_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "ok" for a directory whose profiles name logical/python.* files that are gone
    # (pyprof then shows every Python frame as a raw address).
    meas = tmp_path / "m"
    assert pyrun(["-o", str(meas), sys.executable, "-c", "sum(range(300000))"]) == 0
    assert main(["verify", str(meas)]) == 0
    assert " ok " in capsys.readouterr().out
    (logical,) = (meas / "logical").iterdir()
    logical.unlink()
    assert main(["verify", str(meas)]) == 1  # problems found (2 is for unreadable files)
    out = capsys.readouterr().out
    assert f"load module logical/{logical.name} is missing" in out

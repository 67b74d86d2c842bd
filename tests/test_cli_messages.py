"""What every tool says about itself and about input meant for another tool (issue #21, item 9).

``--version`` prints the one version (:data:`pyhpctk.__version__`) from every command; a tool
handed another tool's input (a measurement directory to pyview, a database file to pystruct)
says what it was given and which tool reads it, in one line with exit status 2.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import pyhpctk
from pyhpctk.cli.main import main as pyhpctk_main
from pyhpctk.cli.pymodel import main as pymodel_main
from pyhpctk.cli.pyprof import main as pyprof_main
from pyhpctk.cli.pyprof_mpi import main as pyprof_mpi_main
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pystruct import main as pystruct_main
from pyhpctk.cli.pyview import main as pyview_main

TOOLS: dict[str, Callable[[list[str] | None], int]] = {
    "pyrun": pyrun_main,
    "pystruct": pystruct_main,
    "pyprof": pyprof_main,
    "pyprof-mpi": pyprof_mpi_main,
    "pyview": pyview_main,
    "pymodel": pymodel_main,
    "pyhpctk": pyhpctk_main,
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_prints_the_package_version(
    tool: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "No such option: --version" (exit 2) from all but pyhpctk.
    assert TOOLS[tool](["--version"]) == 0
    assert capsys.readouterr().out == f"{tool}, version {pyhpctk.__version__}\n"


def test_the_installed_pyrun_prints_its_version_and_passes_the_commands_own_on() -> None:
    scripts = Path(sys.executable).parent
    done = subprocess.run(
        [str(scripts / "pyrun"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, f"pyrun, version {pyhpctk.__version__}\n")
    # After the command, --version is the command's own option: pyrun passes it on untouched.
    done = subprocess.run(
        [str(scripts / "pyrun"), sys.executable, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == f"Python {sys.version.split()[0]}\n"


@pytest.fixture
def inputs(reference: Path, tmp_path: Path) -> dict[str, Path]:
    """A measurement directory, a database and a Python source, each given to the wrong tool."""
    measurements = tmp_path / "small.m"
    shutil.copytree(reference / "meas" / "small.m", measurements)
    database = tmp_path / "small.d"
    shutil.copytree(reference / "dbase" / "small.d", database)
    source = tmp_path / "app.py"
    source.write_text("print('hello')\n")
    return {"measurements": measurements, "database": database, "source": source}


def _error(capsys: pytest.CaptureFixture[str], status: int) -> str:
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.rstrip("\n")


def test_pyview_on_measurements_says_to_run_pyprof(
    inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    meas = inputs["measurements"]
    assert _error(capsys, pyview_main([str(meas)])) == (
        f"pyview: error: {meas}: this is a measurement directory; run pyprof on it "
        f"(pyprof {meas}), then pyview on the database pyprof writes"
    )
    profile = next(meas.glob("*.hpcrun"))
    assert _error(capsys, pyview_main([str(profile)])) == (
        f"pyview: error: {profile}: not a database: this is a measurement file of {meas}; the "
        f"tools read the whole directory (pystruct {meas}, pyprof {meas})"
    )
    source = inputs["source"]
    assert _error(capsys, pyview_main([str(source)])) == (
        f"pyview: error: {source}: not a database: this is a Python source; measure it with "
        f"pyrun (pyrun python {source})"
    )


def test_pyprof_and_pystruct_on_a_database_file_say_pyview_shows_it(
    inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    database = inputs["database"]
    meta = database / "meta.db"
    advice = f"this is the meta.db of the database {database}; pyview shows it (pyview {database})"
    # Before: "not a directory (pyprof reads measurement directories)".
    assert _error(capsys, pyprof_main([str(meta)])) == (
        f"pyprof: error: {meta}: not a directory: {advice}"
    )
    # Before: "not an ELF binary, cubin, Python source or measurement directory" alone.
    assert _error(capsys, pystruct_main([str(meta)])) == (
        f"pystruct: error: {meta}: file: not an ELF binary, cubin, Python source or measurement "
        f"directory: {advice}"
    )
    # The database directory itself was already named as such; it stays so.
    assert "a database, not measurements" in _error(capsys, pyprof_main([str(database)]))
    assert "a database, not measurements" in _error(capsys, pystruct_main([str(database)]))


def test_pymodel_on_measurements_says_to_run_pyprof(
    inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    meas = inputs["measurements"]
    args = [str(meas), str(meas), str(meas), "--param", "p=1,2,3"]
    assert _error(capsys, pymodel_main(args)) == (
        f"pymodel: error: {meas}: not a database: this is a measurement directory; run pyprof "
        f"on it (pyprof {meas}), then pyview on the database pyprof writes"
    )

"""pyprof and pyprof-mpi write only inside their database, keep names' bytes, survive a full disk.

Issue #15: source names with ``..`` made pyprof copy sources outside the database (item 1); a
script in a Latin-1-named directory crashed pyprof and aborted pyprof-mpi (item 3); a full disk
gave tracebacks (item 4). Measurements are built with the format writers: Python logical frames
(formats.md §1.10) whose stanzas name the source files under test.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from output_helpers import files_under, python_measurement
from pyhpctk.analysis import slices
from pyhpctk.analysis.comm import SerialComm
from pyhpctk.analysis.distributed import run_distributed
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.analysis.sources import NO_PLACE, Warrants, copy_sources
from pyhpctk.analysis.state import RunReport
from pyhpctk.cli.main import main as pyhpctk_main
from pyhpctk.cli.pyprof import main as pyprof_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.formats import metadb
from test_pyprof_mpi import pyprof_mpi

Analyze = Callable[[Path, Path], RunReport]


def _serial(measurement: Path, output: Path) -> RunReport:
    return run(ProfOptions.build([measurement], output=output))


def _distributed(measurement: Path, output: Path) -> RunReport:
    return run_distributed(ProfOptions.build([measurement], output=output), SerialComm())


# --------------------------------------------------------------------------------------------
# Item 1: every copy lands inside DB/src


@pytest.mark.parametrize("analyze", [_serial, _distributed], ids=["pyprof", "pyprof-mpi"])
def test_source_names_never_place_a_copy_outside_the_database(
    tmp_path: Path, analyze: Analyze
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    app = project / "app.py"
    app.write_text("print('app')\n")
    (project / "other.py").write_text("print('project')\n")
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "elsewhere" / "other.py").write_text("print('elsewhere')\n")
    (project / "link").symlink_to(tmp_path / "elsewhere" / "deep")
    # The database is tmp_path/out/db, assembled in tmp_path/out/.db.PID.RANDOM: three levels
    # above its src/ is tmp_path. Before the fix the copy of /../../../X went to tmp_path/X.
    relative = str(app).lstrip("/")
    victim = tmp_path / relative
    victim.parent.mkdir(parents=True)
    victim.write_text("precious\n")
    names = [
        "/" + "../" * 3 + relative,  # '..' above the root stays at the root: this is app.py
        str(app),  # the same file by its plain name
        f"{project}/link/../other.py",  # through a symbolic link: really elsewhere/other.py
        str(project / "other.py"),  # the same place in src/ as the name above, another file
    ]
    measurement = python_measurement(tmp_path / "m", names)
    (tmp_path / "out").mkdir()
    before = files_under(tmp_path)
    report = analyze(measurement, tmp_path / "out" / "db")
    assert victim.read_text() == "precious\n"
    after = {k: v for k, v in files_under(tmp_path).items() if not k.startswith("out/db")}
    assert after == before  # nothing written or changed outside the database
    assert report.summary().splitlines()[1] == (
        f"sources: 3 copied, 1 not copied (1 no place in src/: {project / 'other.py'})"
    )
    src = tmp_path / "out" / "db" / "src"
    assert (src / relative).read_text() == "print('app')\n"
    assert (src / str(project / "other.py").lstrip("/")).read_text() == "print('elsewhere')\n"
    files = metadb.read(tmp_path / "out" / "db" / "meta.db").files
    assert [(f.path, f.copied) for f in files] == list(
        zip(names, [True, True, True, False], strict=True)
    )


def test_the_program_name_never_places_the_default_database_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default output of several inputs, hpctoolkit-PROGRAM-database, takes PROGRAM from
    the measurement files."""
    work = tmp_path / "work"
    (work / "hpctoolkit-python3-database").mkdir(parents=True)  # an earlier run's database
    monkeypatch.chdir(work)
    program = "python3-database/../../escape"
    first = python_measurement(tmp_path / "m1", ["/nowhere/app.py"], program)
    second = python_measurement(tmp_path / "m2", ["/nowhere/app.py"], program)
    assert pyprof_main([str(first), str(second)]) == 0
    # Before: the database went to work/hpctoolkit-python3-database/../../escape-database.
    assert not (tmp_path / "escape-database").exists()
    assert sorted(p.name for p in work.iterdir()) == [
        "hpctoolkit-escape-database",
        "hpctoolkit-python3-database",
    ]
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (["hpctoolkit-train-measurements"], "hpctoolkit-train-database"),
        (["hpctoolkit-train-measurements-2"], "hpctoolkit-train-database-2"),  # pyrun's 2nd run
        (["hpctoolkit-train-measurements-4242.0"], "hpctoolkit-train-database-4242.0"),  # srun
        (["runs/app.m"], "app.m-database"),  # hpcprof's DIR-database, here, not in runs/
        (["hpctoolkit-a-measurements", "hpctoolkit-a-measurements-2"], "hpctoolkit-a-database"),
        (["hpctoolkit-a-measurements", "hpctoolkit-b-measurements"], "hpctoolkit-database"),
    ],
)
def test_the_default_database_is_named_after_the_measured_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: list[str], expected: str
) -> None:
    # Before: hpctoolkit-python3-database for every Python program (the interpreter's name).
    monkeypatch.chdir(tmp_path)
    for name in inputs:
        python_measurement(tmp_path / name, ["/nowhere/app.py"], "python3")
    assert pyprof_main(inputs) == 0
    assert (tmp_path / expected / "meta.db").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if "database" in p.name) == [expected]


def test_pyrun_then_pyprof_name_the_database_after_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from pyhpctk.cli.pyrun import main as pyrun_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("sum(i * i for i in range(200_000))\n")
    assert pyrun_main([sys.executable, "train.py"]) == 0
    assert pyprof_main(["hpctoolkit-train-measurements/"]) == 0
    assert f"wrote {tmp_path / 'hpctoolkit-train-database'}:" in capsys.readouterr().err
    # From inside the measurement directory, its own name still gives the database's.
    monkeypatch.chdir(tmp_path / "hpctoolkit-train-measurements")
    assert pyprof_main(["."]) == 0
    assert (tmp_path / "hpctoolkit-train-measurements" / "hpctoolkit-train-database").is_dir()


def test_a_symbolic_link_inside_src_is_never_followed(tmp_path: Path) -> None:
    """Defence in depth: copies create plain directories and open with O_NOFOLLOW, so even a
    link planted inside src/ (pyprof's fresh staging directory never has one) leads nowhere."""
    app = tmp_path / "project" / "app.py"
    app.parent.mkdir()
    app.write_text("print('app')\n")
    directory = tmp_path / "db"
    (directory / "src").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    top = str(app).lstrip("/").split("/")[0]
    (directory / "src" / top).symlink_to(outside)
    copied, report = copy_sources([str(app)], directory, Warrants(structured=frozenset([str(app)])))
    assert copied == set() and report.refused == {NO_PLACE: [str(app)]}
    assert list(outside.iterdir()) == []


def test_an_output_that_is_a_symbolic_link_is_refused(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "real.d"
    run(ProfOptions.build([reference / "meas" / "small.m"], output=real))
    link = tmp_path / "link.d"
    link.symlink_to(real)
    before = files_under(real)
    # Before: OSError "Cannot call rmtree on a symbolic link", a traceback.
    assert pyprof_main(["-o", str(link), "--force", str(reference / "meas" / "small.m")]) == 2
    err = capsys.readouterr().err
    assert f"{link}: is a symbolic link; not replacing it" in err and "Traceback" not in err
    assert link.is_symlink() and files_under(real) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.d", "real.d"]


# --------------------------------------------------------------------------------------------
# Item 3: names that are not UTF-8 keep their bytes

LATIN1 = os.fsdecode(b"caf\xe9")  # a directory name in Latin-1: 'caf\udce9' once decoded


def _latin1_measurement(tmp_path: Path) -> tuple[Path, bytes]:
    script = tmp_path / LATIN1 / "app.py"
    script.parent.mkdir()
    script.write_bytes(b"print('caf\\xe9')\n")
    raw = os.fsencode(script)
    assert raw.endswith(b"/caf\xe9/app.py")
    return python_measurement(tmp_path / "m", [str(script)]), raw


def _check_latin1_database(database: Path, raw: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    meta = (database / "meta.db").read_bytes()
    assert b"\0" + raw + b"\0" in meta  # the name's bytes in the string pool, as hpcprof writes
    files = metadb.read(database / "meta.db").files
    assert [(os.fsencode(f.path), f.copied) for f in files] == [(raw, True)]
    copy = os.fsencode(database / "src") + raw
    with open(copy, "rb") as stream:
        assert stream.read() == b"print('caf\\xe9')\n"
    capsys.readouterr()
    assert pyhpctk_main(["verify", str(database)]) == 0
    csv = database.parent / "view.csv"
    assert pyview_main([str(database), "--flat", "--csv", str(csv)]) == 0
    assert b"," + raw + b"," in csv.read_bytes()
    assert "Traceback" not in capsys.readouterr().err


def test_a_latin1_source_path_keeps_its_bytes_in_pyprof(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement, raw = _latin1_measurement(tmp_path)
    # Before: UnicodeEncodeError (surrogates not allowed) writing meta.db, a traceback.
    assert pyprof_main(["-o", str(tmp_path / "db"), str(measurement)]) == 0
    _check_latin1_database(tmp_path / "db", raw, capsys)


@pytest.mark.mpi
def test_a_latin1_source_path_keeps_its_bytes_in_pyprof_mpi(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement, raw = _latin1_measurement(tmp_path)
    # Before: "internal error" and MPI_Abort (exit 70) from rank 0's meta.db thread.
    done = pyprof_mpi(2, "-o", str(tmp_path / "db"), str(measurement))
    assert done.returncode == 0, done.stderr
    assert "(2 ranks)" in done.stderr
    _check_latin1_database(tmp_path / "db", raw, capsys)


# --------------------------------------------------------------------------------------------
# Item 4: a full disk is one line, and no half-written database


def test_a_full_disk_leaves_no_database_and_no_staging_directory(
    reference: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = small_disk / "db"  # the database is about 86 KB: it cannot fit in 64 KiB
    # Before: OSError [Errno 28] escaped as a traceback.
    assert pyprof_main(["-o", str(output), str(reference / "meas" / "loops-cputime-t.m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"pyprof: error: {output}: cannot write: No space left on device "
        "(nothing was left under that name)"
    )
    assert "Traceback" not in err and err.count("\n") == 1
    assert list(small_disk.iterdir()) == []


def test_a_full_disk_keeps_the_database_being_replaced(
    reference: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = small_disk / "db"
    assert pyprof_main(["-o", str(output), str(reference / "meas" / "small.m")]) == 0
    before = files_under(output)
    bigger = str(reference / "meas" / "loops-cputime-t.m")
    assert pyprof_main(["-o", str(output), "--force", bigger]) == 2
    err = capsys.readouterr().err
    assert "cannot write: No space left on device (the existing database is unchanged)" in err
    assert files_under(output) == before
    assert list(small_disk.iterdir()) == [output]


@pytest.mark.parametrize("failing", ["profile.db", "cct.db"])
def test_a_full_disk_in_a_background_write_is_one_line_and_no_database(
    reference: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    failing: str,
) -> None:
    """profile.db, trace.db and each cct.db window are written on threads (write_stages): a
    write that fails there must end the run as a failing write on the main thread does."""
    original = slices.FileSlice.write_back_to_back

    def fails(self: slices.FileSlice, offset: int, pieces: object) -> None:
        if threading.current_thread().name == f"pyprof-{failing}":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self, offset, pieces)  # type: ignore[arg-type]

    monkeypatch.setattr(slices.FileSlice, "write_back_to_back", fails)
    output = tmp_path / "db"
    assert pyprof_main(["-o", str(output), str(reference / "meas" / "loops-cputime-t.m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyprof: error: {output}: cannot write: No space left on device")
    assert "Traceback" not in err and err.count("\n") == 1
    assert not output.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.mpi
def test_a_full_disk_stops_every_rank_of_pyprof_mpi_with_one_message(
    reference: Path, small_disk: Path
) -> None:
    output = small_disk / "db"
    done = pyprof_mpi(2, "-o", str(output), str(reference / "meas" / "loops-cputime-t.m"))
    # Before: an OSError on a rank is an internal error: MPI_Abort, exit 70, a traceback.
    assert done.returncode == 2, done.stderr
    assert f"pyprof-mpi: error: {output}: cannot write: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert list(small_disk.iterdir()) == []

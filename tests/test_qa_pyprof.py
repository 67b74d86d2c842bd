"""QA findings in ``pyprof``: the database directory is as readable as any the user makes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pyhpctk.analysis import write
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import aggregate
from pyhpctk.cli.pyprof import main


def test_database_directory_follows_the_umask(reference: Path, tmp_path: Path) -> None:
    # Before: assembled in tempfile.mkdtemp (mode 0700) and renamed, so nobody else in a
    # project group could open the database.
    old = os.umask(0o022)
    try:
        assert main(["-o", str(tmp_path / "db"), str(reference / "meas" / "small.m")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "db").stat().st_mode) == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["db"]  # no staging directory left behind


def test_failed_write_leaves_no_staging_directory(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = aggregate(ProfOptions.build([str(reference / "meas" / "small.m")]))

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(write.metadb, "write", fail)
    with pytest.raises(write.OutputError, match="cannot write: No space left on device"):
        write.write_database(db, tmp_path / "db")
    assert list(tmp_path.iterdir()) == []


def test_output_under_a_file_is_a_usage_error(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: NotADirectoryError traceback from the staging directory's mkdir.
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    assert main(["-o", str(blocker / "db"), str(reference / "meas" / "small.m")]) == 2
    err = capsys.readouterr().err
    assert f"{blocker} is not a directory" in err and "Traceback" not in err


def test_staging_that_cannot_be_made_is_an_output_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A parent directory without write permission (not testable as root, so simulated).
    def denied(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(write.OutputError, match="cannot create the database here: Permission"):
        write.make_staging(tmp_path / "db")


def test_a_database_given_as_measurements_is_named_as_such(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "no .hpcrun profiles in this measurement directory", for pyprof's own output.
    database = reference / "dbase" / "small.d"
    assert main(["-o", str(tmp_path / "db"), str(database)]) == 2
    assert "a database, not measurements (pyview shows it" in capsys.readouterr().err

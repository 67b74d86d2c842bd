"""QA findings in ``pystruct``: ``-o`` never destroys an input, a bad ``-o`` is a one-line error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyhpctk.cli.pystruct import main
from pyhpctk.formats import hpcstruct

SOURCE = (
    "def work(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total\n"
)


def test_output_equal_to_the_target_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: `pystruct app.py -o app.py` replaced the program with its structure file.
    app = tmp_path / "app.py"
    app.write_text(SOURCE)
    assert main([str(app), "-o", str(app)]) == 2
    assert "is TARGET itself" in capsys.readouterr().err
    assert app.read_text() == SOURCE
    link = tmp_path / "link.py"
    link.symlink_to(app)
    assert main([str(app), "-o", str(link)]) == 2
    assert app.read_text() == SOURCE


def test_output_that_is_some_other_file_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = tmp_path / "app.py"
    app.write_text(SOURCE)
    other = tmp_path / "notes.txt"
    other.write_text("my notes\n")
    assert main([str(app), "-o", str(other)]) == 2
    assert "not an hpcstruct file" in capsys.readouterr().err
    assert other.read_text() == "my notes\n"


def test_an_existing_structure_file_or_empty_file_is_replaced_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # hpcstruct replaces its output silently; pystruct only with --force (issue #15 item 9).
    app = tmp_path / "app.py"
    app.write_text(SOURCE)
    out = tmp_path / "app.hpcstruct"
    out.touch()
    assert main([str(app), "-o", str(out), "-q"]) == 2
    assert f"{out}: already exists; choose another -o or pass --force" in capsys.readouterr().err
    assert out.read_bytes() == b""
    assert main([str(app), "-o", str(out), "-q", "--force"]) == 0
    first = hpcstruct.read(out)
    app.write_text("\n" + SOURCE)  # every line moves down by one
    assert main([str(app), "-o", str(out), "-q", "--force"]) == 0
    assert hpcstruct.to_bytes(hpcstruct.read(out)) != hpcstruct.to_bytes(first)


def test_measurement_output_that_is_a_file_is_a_usage_error(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: FileExistsError traceback from mkdir.
    meas = tmp_path / "small.m"
    shutil.copytree(reference / "meas" / "small.m", meas, ignore=shutil.ignore_patterns("structs"))
    blocker = tmp_path / "structs.txt"
    blocker.write_text("x")
    assert main([str(meas), "-o", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pystruct: error: ") and "cannot make the structure directory" in err
    assert "Traceback" not in err
    assert blocker.read_text() == "x"


def test_measurement_with_nothing_to_analyze_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: exit 0 and not a word, so a user could not tell whether anything happened.
    import sys

    from pyhpctk.cli.pyrun import main as pyrun

    meas = tmp_path / "m"
    assert pyrun(["-o", str(meas), sys.executable, "-c", "sum(range(1000))"]) == 0
    capsys.readouterr()
    assert main([str(meas)]) == 0
    assert "nothing to analyze" in capsys.readouterr().err
    assert main([str(meas), "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_jobs_beyond_the_targets_start_no_idle_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: `pystruct -j 1000 MEAS` forked 1000 workers (fork starts them all up front) for
    # a handful of targets: seconds of overhead, or EAGAIN on a login node's process limit.
    import sys
    from concurrent.futures import ProcessPoolExecutor

    from pyhpctk.cli.pyrun import main as pyrun
    from pyhpctk.structure import driver

    (tmp_path / "helper.py").write_text(SOURCE)
    app = tmp_path / "app.py"
    app.write_text("import helper\nfor _ in range(30):\n    helper.work(200_000)\n")
    meas = tmp_path / "m"
    # Python frames only: native frames would make libc (whose analysis takes long) a target.
    command = ["--no-native", "-o", str(meas), "-e", "CPUTIME@1000", sys.executable, str(app)]
    assert pyrun(command) == 0
    asked: list[int] = []

    class Recording(ProcessPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: object) -> None:
            asked.append(max_workers)
            super().__init__(max_workers=max_workers, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(driver, "ProcessPoolExecutor", Recording)
    assert main([str(meas), "-j", "1000", "-q"]) == 0
    written = sorted(p.name for p in (meas / "structs").glob("*.hpcstruct"))
    # The program's two files; a sample can also land in threading.py while the interpreter
    # shuts down (threading._shutdown), and then that file is a target too.
    assert {"app.py.hpcstruct", "helper.py.hpcstruct"} <= set(written)
    assert set(written) <= {"app.py.hpcstruct", "helper.py.hpcstruct", "threading.py.hpcstruct"}
    assert asked == [len(written)]  # one worker per target, not 1000


def test_output_under_a_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: FileExistsError traceback from mkdir of the output's parent.
    app = tmp_path / "app.py"
    app.write_text(SOURCE)
    assert main([str(app), "-o", str(app / "x.hpcstruct")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pystruct: error: ") and f"({app})" in err
    assert "Traceback" not in err
    assert app.read_text() == SOURCE


def test_a_database_given_as_target_is_named_as_such(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "no .hpcrun profiles and no gpubins/", for a pyprof / hpcprof database.
    assert main([str(reference / "dbase" / "small.d")]) == 2
    assert "a database, not measurements" in capsys.readouterr().err

"""Outputs are never silently replaced, and a full disk leaves no truncated file (issue #15).

Item 9: pyview's ``--csv/--json/--html/--trace-export``, pymodel's ``--json/--extrap`` and
pystruct's output refuse an existing file unless ``--force``. Item 4: on a full disk (a 64 KiB
tmpfs, see the ``small_disk`` fixture) each says so in one line, exits 2 and leaves nothing under
the output's name (or the old file as it was). Both rest on :mod:`pyhpctk.formats.output`,
tested first.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from output_helpers import fill_disk, python_measurement
from pyhpctk.cli.pymodel import main as pymodel_main
from pyhpctk.cli.pystruct import main as pystruct_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.formats import hpcstruct, output
from pyhpctk.formats.output import OutputError

SOURCES = Path(__file__).resolve().parent.parent / "src" / "pyhpctk" / "formats"

# --------------------------------------------------------------------------------------------
# The shared helper


def test_an_existing_file_is_refused_and_force_replaces_it_keeping_its_mode(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "out.txt"
    dest.write_text("old\n")
    dest.chmod(0o640)
    refusal = r"out\.txt: already exists; choose another --x or pass --force"
    with pytest.raises(OutputError, match=refusal), output.open_text(dest, option="--x") as stream:
        stream.write("new\n")
    assert dest.read_text() == "old\n"
    with output.open_text(dest, force=True) as stream:
        stream.write("new\n")
    assert dest.read_text() == "new\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), output.open_binary(dest, force=True) as stream:
        stream.write(b"half of the new")
        raise RuntimeError("the writer failed")
    assert dest.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_a_name_taken_while_writing_is_not_replaced(tmp_path: Path) -> None:
    dest = tmp_path / "out.txt"
    with pytest.raises(OutputError, match="already exists"), output.open_text(dest) as stream:
        stream.write("ours\n")
        dest.write_text("someone else's\n")  # another run finished first
    assert dest.read_text() == "someone else's\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_symbolic_link_at_the_output_is_replaced_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("not ours\n")
    dest = tmp_path / "out.txt"
    dest.symlink_to(target)
    with pytest.raises(OutputError, match="already exists"):
        output.write_bytes(dest, b"data\n")
    output.write_bytes(dest, b"data\n", force=True)
    assert not dest.is_symlink() and dest.read_bytes() == b"data\n"
    assert target.read_text() == "not ours\n"


def test_streams_are_written_in_place_unless_the_output_lies_in_an_input(tmp_path: Path) -> None:
    output.write_bytes("/dev/null", b"discarded")  # exists, but a device: never refused
    fifo = tmp_path / "planted"
    os.mkfifo(fifo)
    # Inside an input directory a FIFO is just an existing name (opening it would hang).
    with pytest.raises(OutputError, match="already exists"):
        output.write_bytes(fifo, b"x", streams=False)
    output.write_bytes(fifo, b"x", force=True, streams=False)
    assert fifo.read_bytes() == b"x"


# --------------------------------------------------------------------------------------------
# pyview

EXPORTS = {"--csv": "id,", "--json": "{", "--html": "<!DOCTYPE html>", "--trace-export": "{"}


@pytest.fixture
def database(reference: Path) -> str:
    return str(reference / "dbase" / "loops-cputime-t.d")  # with traces, for --trace-export


@pytest.mark.parametrize("option", list(EXPORTS))
def test_pyview_refuses_to_overwrite_an_export_without_force(
    database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    dest = tmp_path / "existing"
    dest.write_text("keep me\n")
    # Before: the file was replaced without a word.
    assert pyview_main([database, option, str(dest)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"pyview: error: {dest}: already exists; choose another {option} or pass --force\n"
    )
    assert dest.read_text() == "keep me\n"
    assert pyview_main([database, option, str(dest), "--force"]) == 0
    assert dest.read_text(encoding="utf-8").startswith(EXPORTS[option])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]


def test_pyview_refuses_before_writing_any_export(
    database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "view.json").write_text("keep me\n")
    code = pyview_main(
        [database, "--csv", str(tmp_path / "view.csv"), "--json", str(tmp_path / "view.json")]
    )
    assert code == 2 and "view.json: already exists" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.json"]  # no view.csv either


@pytest.mark.parametrize("option", list(EXPORTS))
def test_pyview_on_a_full_disk_says_so_and_leaves_no_partial_export(
    database: str, small_disk: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    kept = small_disk / "kept"
    kept.write_text("old export\n")
    fill_disk(small_disk, leave=8192)  # every export is larger than 8 KiB
    new = small_disk / "new"
    # Before: OSError [Errno 28] as a traceback, and a truncated file under the name.
    assert pyview_main([database, option, str(new)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"pyview: error: {new}: cannot write: No space left on device "
        "(nothing was left under that name)\n"
    )
    assert pyview_main([database, option, str(kept), "--force"]) == 2
    assert f"{kept}: cannot write: No space left on device ({kept} is unchanged)" in (
        capsys.readouterr().err
    )
    assert kept.read_text() == "old export\n"
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "kept"]


# --------------------------------------------------------------------------------------------
# pymodel

PARAM = ["--param", "p=1,2,4,8,16"]


@pytest.fixture
def series(reference: Path) -> list[str]:
    return [str(reference / "dbase" / "small.d")] * 5


@pytest.mark.parametrize("option", ["--json", "--extrap"])
def test_pymodel_refuses_to_overwrite_its_outputs_without_force(
    series: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    dest = tmp_path / "existing"
    dest.write_text("keep me\n")
    # Before: the file was replaced without a word.
    assert pymodel_main([*series, *PARAM, option, str(dest)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"pymodel: error: {dest}: already exists; choose another {option} or pass --force\n"
    )
    assert captured.out == ""  # refused before the analysis, not after it
    assert dest.read_text() == "keep me\n"
    assert pymodel_main([*series, *PARAM, option, str(dest), "--force"]) == 0
    assert dest.read_text().startswith("{")


def test_pymodel_on_a_full_disk_says_so_and_leaves_no_partial_json(
    series: list[str], small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill_disk(small_disk, leave=4096)  # the models' JSON is about 11 KB
    dest = small_disk / "models.json"
    # Before: OSError [Errno 28] as a traceback, and a truncated models.json.
    assert pymodel_main([*series, *PARAM, "--json", str(dest)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"pymodel: error: {dest}: cannot write: No space left on device "
        "(nothing was left under that name)\n"
    )
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


# --------------------------------------------------------------------------------------------
# pystruct (an existing .hpcstruct without --force: tests/test_qa_pystruct.py)


def big_source(where: Path) -> Path:
    """A Python source whose structure file (about 150 KB) is more than the 64 KiB disk holds
    (no module of src/ is that big any more: issue #19 split them)."""
    path = where / "big.py"
    path.write_text(
        "".join(
            f"def f{i}(n):\n    total = 0\n    for k in range(n):\n"
            f"        total += k * {i}\n    return total\n\n"
            for i in range(400)
        )
    )
    return path


def test_pystruct_on_a_full_disk_says_so_and_leaves_no_partial_file(
    tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = big_source(tmp_path)  # its structure file is about 150 KB: more than the disk
    dest = small_disk / "big.hpcstruct"
    # Before: the message, but a truncated big.hpcstruct.tmp was left on the disk.
    assert pystruct_main([str(source), "-o", str(dest), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"pystruct: error: {dest}: cannot write: No space left on device "
        "(nothing was left under that name)\n"
    )
    assert list(small_disk.iterdir()) == []


def test_pystruct_stops_a_measurement_directory_at_a_full_disk(
    tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first target the disk refuses stops the run: one line, not one per target."""
    sources = [str(SOURCES / name) for name in ("cctdb.py", "hpcrun.py")]
    sources.append(str(big_source(tmp_path)))
    measurement = python_measurement(tmp_path / "app.m", sources)
    fill_disk(small_disk, leave=16384)
    out = small_disk / "structs"
    # Before: one error per target, and a truncated NAME.hpcstruct.tmp left for each.
    assert pystruct_main([str(measurement), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pystruct: error: {out}/") and err.count("\n") == 1
    assert "cannot write: No space left on device (nothing was left under that name)" in err
    names = [p.name for p in out.iterdir()]
    assert all(n.endswith(".hpcstruct") or n == ".pystruct-manifest.json" for n in names)
    for written in out.glob("*.hpcstruct"):  # a target that fit is complete
        hpcstruct.read(written)


def test_pystruct_writes_only_inside_the_measurements_own_structs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Links planted in a measurement directory never lead pystruct's writes elsewhere."""
    script = tmp_path / "app.py"
    script.write_text("for i in range(3):\n    print(i)\n")
    measurement = python_measurement(tmp_path / "app.m", [str(script)])
    outside = tmp_path / "outside"
    outside.mkdir()
    (measurement / "structs").mkdir()
    # Before: the structure was written to the fixed name app.py.hpcstruct.tmp, through the link.
    (measurement / "structs" / "app.py.hpcstruct.tmp").symlink_to(outside / "planted")
    assert pystruct_main([str(measurement), "-q"]) == 0
    assert list(outside.iterdir()) == []
    hpcstruct.read(measurement / "structs" / "app.py.hpcstruct")
    # A structs/ that is itself a link is refused (before: written through).
    shutil.rmtree(measurement / "structs")
    (measurement / "structs").symlink_to(outside)
    assert pystruct_main([str(measurement), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{measurement / 'structs'}: is a symbolic link (to {outside})" in err
    assert list(outside.iterdir()) == []

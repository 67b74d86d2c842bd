"""``pyhpctk dump`` / ``verify`` and the format-detecting ``formats.read`` / ``formats.write``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyhpctk import formats
from pyhpctk.cli.main import main
from pyhpctk.errors import FormatError
from pyhpctk.formats import cctdb


def reference_files(reference: Path) -> list[Path]:
    """Every file of a format we read under the reference data (binaries and licences aside)."""
    out = []
    for path in sorted(reference.rglob("*")):
        if not path.is_file() or path.suffix in {".license", ".yaml", ".txt", ".md", ".gpubin"}:
            continue
        if path.parent.name in {"bin", "vdso"} or path.name == "original-path":
            continue
        out.append(path)
    return out


def test_every_reference_file_is_detected_read_and_written_back_identically(
    reference: Path, tmp_path: Path
) -> None:
    files = reference_files(reference)
    kinds = {formats.detect_file(f) for f in files}
    assert kinds == {"hpcrun", "hpctrace", "metadb", "profiledb", "cctdb", "tracedb", "hpcstruct"}
    for file in files:
        obj = formats.read(file)
        copy = tmp_path / "copy"
        formats.write(obj, copy)
        original, written = file.read_bytes(), copy.read_bytes()
        if formats.format_of(obj) == "cctdb":
            # formats.md §3.4: hpcprof leaves header bytes 0x20-0x2f uninitialised.
            original, written = cctdb.normalise(original), cctdb.normalise(written)
        assert written == original, file


def test_unknown_content_is_refused_with_the_file_named(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x7fELF not ours")
    with pytest.raises(FormatError, match=r"junk\.db: header: not a file format"):
        formats.read(junk)
    with pytest.raises(TypeError):
        formats.write(object(), tmp_path / "x")


def test_dump_prints_every_reference_file_and_directory(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    targets = reference_files(reference)[::7] + sorted((reference / "dbase").glob("*.d"))
    targets += sorted((reference / "meas").glob("*.m"))
    for target in targets:
        assert main(["dump", str(target)]) == 0, target
        out = capsys.readouterr()
        assert out.out.strip(), target
        assert out.err == ""


def test_dump_of_a_database_names_its_contexts(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dump", str(reference / "dbase" / "small.d")]) == 0
    text = capsys.readouterr().out
    for name in ("=== meta.db", "=== profile.db", "=== cct.db", "=== trace.db", "spinsleep"):
        assert name in text


@pytest.mark.parametrize("kind", ["dbase", "meas"])
def test_verify_passes_every_reference_directory(
    reference: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for directory in sorted((reference / kind).iterdir()):
        if directory.is_dir():
            assert main(["verify", str(directory)]) == 0, directory
            assert ": ok (" in capsys.readouterr().out


def test_verify_finds_a_cct_db_that_is_not_the_transpose_of_profile_db(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "mixed.d"
    shutil.copytree(reference / "dbase" / "small.d", db)
    shutil.copy(reference / "dbase" / "small.nostruct.d" / "cct.db", db / "cct.db")
    assert main(["verify", str(db)]) == 1
    assert "problem:" in capsys.readouterr().out


def test_verify_finds_a_trace_naming_nodes_its_profile_lacks(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = reference / "meas" / "small.m"
    loops = reference / "meas" / "loops-cputime-t.m"
    meas = tmp_path / "m"
    meas.mkdir()
    profile = next(small.glob("*.hpcrun"))
    shutil.copy(profile, meas / profile.name)
    shutil.copy(next(loops.glob("*.hpctrace")), meas / profile.with_suffix(".hpctrace").name)
    assert main(["verify", str(meas)]) == 1
    assert "problem:" in capsys.readouterr().out


def test_verify_reports_a_truncated_file_as_unreadable(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "cut.d"
    shutil.copytree(reference / "dbase" / "small.d", db)
    data = (db / "profile.db").read_bytes()
    (db / "profile.db").write_bytes(data[: len(data) // 2])
    assert main(["verify", str(db)]) == 2
    err = capsys.readouterr().err
    assert "profile.db" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["dump", "verify"])
def test_missing_and_unknown_paths_exit_2_with_one_line(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert main([command, str(tmp_path / "empty")]) == 2
    assert "neither a database" in capsys.readouterr().err


def test_dump_of_a_corrupt_file_is_one_clear_line(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "meta.db"
    data = bytearray((reference / "dbase" / "small.d" / "meta.db").read_bytes())
    data[0x0E] = 9  # major version 9
    bad.write_bytes(bytes(data))
    assert main(["dump", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "meta.db" in err[0] and "version" in err[0]

"""pyprof on bad input: clear one-line errors, damaged profiles skipped (or fatal with --strict)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyhpctk.analysis.compare import compare_dirs
from pyhpctk.cli.pyprof import main
from pyhpctk.formats import hpcrun


def _copy_profiles(source: Path, dest: Path) -> Path:
    """A measurement directory with only the profiles and traces of ``source`` (no structs)."""
    dest.mkdir()
    for path in source.iterdir():
        if path.suffix in (".hpcrun", ".hpctrace"):
            shutil.copyfile(path, dest / path.name)
    return dest


def test_missing_directory_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-o", str(tmp_path / "db"), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere: no such measurement directory" in err
    assert "Traceback" not in err


def test_empty_directory_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.m").mkdir()
    assert main(["-o", str(tmp_path / "db"), str(tmp_path / "empty.m")]) == 2
    assert "no .hpcrun profiles" in capsys.readouterr().err
    assert not (tmp_path / "db").exists()


def test_truncated_profile_is_skipped_and_reported(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement = _copy_profiles(reference / "meas" / "loops-cputime-t.m", tmp_path / "m")
    victim = sorted(measurement.glob("*.hpcrun"))[1]
    victim.write_bytes(victim.read_bytes()[:3000])
    assert main(["--ignore-structs", "-o", str(tmp_path / "db"), str(measurement)]) == 0
    err = capsys.readouterr().err
    assert "3 profiles" in err
    assert "skipped" in err and victim.name in err
    assert (tmp_path / "db" / "meta.db").exists()


def test_strict_makes_a_damaged_profile_fatal(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement = _copy_profiles(reference / "meas" / "loops-cputime-t.m", tmp_path / "m")
    victim = sorted(measurement.glob("*.hpcrun"))[0]
    victim.write_bytes(b"HPCRUN-profile____04.00b" + bytes(100))
    status = main(["--strict", "--ignore-structs", "-o", str(tmp_path / "db"), str(measurement)])
    assert status == 2
    err = capsys.readouterr().err
    assert victim.name in err and "--strict" in err and "Traceback" not in err
    assert not (tmp_path / "db").exists()


def test_disagreeing_metric_tables_are_reported(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement = _copy_profiles(reference / "meas" / "small.m", tmp_path / "m")
    original = next(measurement.glob("*.hpcrun"))
    profile = hpcrun.read(original)
    profile.metrics[0].period = 1000
    hpcrun.write(profile, measurement / original.name.replace("-000-", "-001-"))
    assert main(["-o", str(tmp_path / "db"), str(measurement)]) == 0
    err = capsys.readouterr().err
    assert "metric table disagrees" in err and "period" in err
    assert "1 profiles" in err


def test_existing_output_is_refused_unless_forced(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "db"
    measurement = str(reference / "meas" / "small.m")
    assert main(["-o", str(output), measurement]) == 0
    (output / "marker").write_text("old")
    assert main(["-o", str(output), measurement]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (output / "marker").exists()
    assert main(["--force", "-o", str(output), measurement]) == 0
    assert not (output / "marker").exists()
    assert compare_dirs(reference / "dbase" / "small.d", output) == []


def test_force_never_replaces_something_that_is_not_a_database(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("keep me")
    assert main(["--force", "-o", str(precious), str(reference / "meas" / "small.m")]) == 2
    assert "does not look like a database" in capsys.readouterr().err
    assert (precious / "thesis.tex").read_text() == "keep me"


def test_structure_file_for_another_binary_is_reported(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = reference / "struct" / "inlines+loops-x86_64-gcc8-0.hpcstruct"
    assert other.exists()
    status = main(
        ["-S", str(other), "-o", str(tmp_path / "db"), str(reference / "meas" / "small.m")]
    )
    assert status == 0
    err = capsys.readouterr().err
    assert "was not used" in err and "another binary" in err
    assert compare_dirs(reference / "dbase" / "small.d", tmp_path / "db") == []


def test_missing_structure_file_is_an_error(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "-S",
            str(tmp_path / "no.hpcstruct"),
            "-o",
            str(tmp_path / "db"),
            str(reference / "meas" / "small.m"),
        ]
    )
    assert status == 2
    assert "no such structure file" in capsys.readouterr().err


def test_progress_bars_only_when_asked(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement = str(reference / "meas" / "small.m")
    assert main(["--no-progress", "-o", str(tmp_path / "a"), measurement]) == 0
    assert "reading profiles" not in capsys.readouterr().err
    assert main(["--progress", "-o", str(tmp_path / "b"), measurement]) == 0
    err = capsys.readouterr().err
    for stage in (
        "reading profiles",
        "unifying call paths",
        "expanding contexts",
        "computing statistics",
        "rewriting traces",
        "writing database",
    ):
        assert stage in err


def test_bad_option_values_are_usage_errors(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement = str(reference / "meas" / "small.m")
    assert main(["-j", "0", "-o", str(tmp_path / "db"), measurement]) == 2
    assert "-j must be at least 1" in capsys.readouterr().err
    assert main(["-M", "median", measurement]) == 2


def test_out_of_order_trace_is_sorted(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyhpctk.formats import hpctrace

    measurement = _copy_profiles(reference / "meas" / "small.m", tmp_path / "m")
    shutil.copytree(reference / "meas" / "small.m" / "structs", measurement / "structs")
    trace_path = next(measurement.glob("*.hpctrace"))
    trace = hpctrace.read(trace_path)
    records = trace.records.copy()
    records[[3, 7]] = records[[7, 3]]
    trace.records = records
    hpctrace.write(trace, trace_path)
    assert main(["-o", str(tmp_path / "db"), str(measurement)]) == 0
    assert compare_dirs(reference / "dbase" / "small.d", tmp_path / "db") == []


def test_damaged_trace_costs_only_the_trace(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement = _copy_profiles(reference / "meas" / "small.m", tmp_path / "m")
    next(measurement.glob("*.hpctrace")).write_bytes(b"HPCRUN-trace______01.01b" + bytes(13))
    assert main(["-o", str(tmp_path / "db"), str(measurement)]) == 0
    err = capsys.readouterr().err
    assert "trace dropped" in err and "1 profiles" in err and "0 traces" in err
    assert not (tmp_path / "db" / "trace.db").exists()
    status = main(["--strict", "-o", str(tmp_path / "db2"), str(measurement)])
    assert status == 2

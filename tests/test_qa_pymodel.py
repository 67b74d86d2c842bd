"""QA findings in ``pymodel``: contradictory or impossible options are one-line usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyhpctk.cli.pymodel import main

P = "p=1,2,4,8,16"


@pytest.fixture
def series(reference: Path) -> list[str]:
    return [str(reference / "dbase" / "small.d")] * 5


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_unwritable_json_is_a_usage_error(
    series: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: FileNotFoundError traceback, exit 1.
    target = tmp_path / "missing" / "models.json"
    err = _error(capsys, [*series, "--param", P, "--json", str(target)])
    assert f"{target}: cannot write: directory {target.parent} does not exist" in err
    target = tmp_path / "missing" / "data.jsonl"
    assert f"{target}: cannot write" in _error(
        capsys, [*series, "--param", P, "--extrap", str(target)]
    )


def test_a_parameter_given_twice_is_refused(
    series: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the second --param p silently replaced the first.
    err = _error(capsys, [*series, "--param", P, "--param", "p=1,2,3,4,5"])
    assert "--param p given more than once" in err


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--param-from-title", "p"], "--param and --param-from-title"),
        (["--csv", "runs.csv"], "--csv and --param"),
    ],
)
def test_two_sources_of_parameter_values_are_refused(
    series: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    # Before: --param won and --param-from-title / --csv were silently ignored.
    argv = [*series, "--param", P, *extra] if extra[0] != "--csv" else ["--param", P, *extra]
    assert named in _error(capsys, argv)


@pytest.mark.parametrize("value", ["5", "-0.1"])
def test_threshold_outside_zero_to_one_is_refused(
    series: list[str], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # Before: --threshold 5 (meant as 5 %) skipped every context and printed an empty table.
    assert "--threshold" in _error(capsys, [*series, "--param", P, "--threshold", value])


def test_plot_without_matplotlib_fails_before_the_work(
    series: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the whole analysis ran and its table was printed, then --plot failed.
    import importlib.util

    real = importlib.util.find_spec

    def no_matplotlib(name: str, package: str | None = None) -> object:
        return None if name == "matplotlib" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_matplotlib)
    assert main([*series, "--param", P, "--plot", str(tmp_path / "plots")]) == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib" in captured.err
    assert captured.out == ""


def test_csv_saved_with_a_byte_order_mark_is_read(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the BOM glued to the header made it "needs a header with a 'database' column".
    small = reference / "dbase" / "small.d"
    rows = "".join(f"{small},{p}\n" for p in (1, 2, 4, 8, 16))
    runs = tmp_path / "runs.csv"
    runs.write_bytes(b"\xef\xbb\xbf" + f"database,p\n{rows}".encode())
    assert main(["--csv", str(runs)]) == 0
    assert "5 configurations" in capsys.readouterr().out


def test_binary_file_given_as_csv_is_a_usage_error(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: UnicodeDecodeError traceback.
    meta = reference / "dbase" / "small.d" / "meta.db"
    assert "not a CSV text file" in _error(capsys, ["--csv", str(meta)])


@pytest.mark.parametrize("values", ["inf,1,2,3,4", "nan,1,2,3,4", "1e400,1,2,3,4"])
def test_infinite_or_nan_parameter_values_are_refused(
    series: list[str], capsys: pytest.CaptureFixture[str], values: str
) -> None:
    # Before: accepted, and every model was fitted to an infinite or undefined scale.
    err = _error(capsys, [*series, "--param", f"p={values}"])
    assert "positive and finite" in err


def test_bad_target_names_the_target_option(
    series: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "--param 'p=-5': ..." for a value given to --target.
    err = _error(capsys, [*series, "--param", P, "--target", "p=-5"])
    assert "--target 'p=-5'" in err


def test_csv_parameter_values_must_be_positive(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = reference / "dbase" / "small.d"
    runs = tmp_path / "runs.csv"
    runs.write_text("database,p\n" + "".join(f"{small},{p}\n" for p in (0, 2, 4, 8, 16)))
    assert "positive and finite" in _error(capsys, ["--csv", str(runs)])

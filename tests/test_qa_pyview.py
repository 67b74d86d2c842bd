"""QA findings in ``pyview``: option values that name nothing are usage errors, not empty output."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyhpctk.cli.pyview import main


@pytest.mark.parametrize("ctx", ["1000000", "-1"])
def test_context_that_does_not_exist_is_an_error(
    reference: Path, capsys: pytest.CaptureFixture[str], ctx: str
) -> None:
    # Before: "<hidden context 1000000>" with all-zero values, exit 0 (and -1 showed the last
    # context's values through numpy's negative indexing).
    code = main([str(reference / "dbase" / "small.d"), "--context", ctx])
    captured = capsys.readouterr()
    assert code == 2
    assert f"--context {ctx}: no such context" in captured.err
    assert captured.out == ""


def test_existing_and_hidden_contexts_still_answer(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = str(reference / "dbase" / "small.d")
    assert main([small, "--context", "1"]) == 0
    assert "at context 1: main thread" in capsys.readouterr().out
    # A ctxId below cct.db's nCtxs that the tree does not hold is still a real context.
    assert main([small, "--context", "22"]) == 0
    assert "at context 22" in capsys.readouterr().out


def test_derived_name_clashing_with_a_measured_metric_says_so(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "derived metric 'CPUTIME (sec)' already exists", though CPUTIME was measured.
    code = main([str(reference / "dbase" / "small.d"), "--derive", "CPUTIME (sec) = 1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "a metric named 'CPUTIME (sec)' already exists" in err
    assert "derived metric" not in err


@pytest.mark.parametrize(
    "flags", [["--top-down", "--bottom-up"], ["--flat", "--bottom-up"], ["--top-down", "--flat"]]
)
def test_two_views_at_once_are_refused(
    reference: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    # Before: the last flag silently won.
    assert main([str(reference / "dbase" / "small.d"), *flags]) == 2
    captured = capsys.readouterr()
    assert "contradict each other: choose one view" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(("flag", "view"), [("--flat", "flat"), ("--bottom-up", "bottom-up")])
def test_one_view_flag_still_picks_that_view(
    reference: Path, capsys: pytest.CaptureFixture[str], flag: str, view: str
) -> None:
    assert main([str(reference / "dbase" / "small.d"), flag]) == 0
    assert f" - {view} view," in capsys.readouterr().out.splitlines()[0]


def test_metric_number_out_of_range_says_numbers_start_at_zero(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # small.d has one metric: #1 is out of range, and the message says where numbering starts.
    small = str(reference / "dbase" / "small.d")
    assert main([small, "--derive", "y = #1 * 2"]) == 2
    assert "numbered from #0" in capsys.readouterr().err
    assert main([small, "--derive", "y = $0 * 2", "-m", "y", "-d", "0"]) == 0
    assert "y (I)" in capsys.readouterr().out


@pytest.mark.parametrize("what", [["--context", "1"], ["--imbalance", "3"]])
def test_gpu_profiles_of_a_cpu_database_is_an_error(
    reference: Path, capsys: pytest.CaptureFixture[str], what: list[str]
) -> None:
    # Before: "0 profiles: min nan  mean nan ..." with exit status 0.
    assert main([str(reference / "dbase" / "small.d"), *what, "--profiles", "gpu"]) == 2
    captured = capsys.readouterr()
    assert "--profiles gpu:" in captured.err and "has no such profiles" in captured.err
    assert "nan" not in captured.out

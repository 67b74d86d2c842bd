"""QA findings in ``pyrun``: absurd option values are refused before anything is created or run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyhpctk.cli.pyrun import main


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrun: error: ") and "Traceback" not in err
    return err


def test_period_above_one_hour_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the sampler thread died of OverflowError inside the program and pyrun exited 0
    # with a profile holding no samples.
    out = tmp_path / "m"
    argv = ["-o", str(out), "-e", "CPUTIME@99999999999999999999", sys.executable, "-c", "1"]
    assert "above the maximum" in _refused(capsys, argv)
    assert not out.exists()


def test_nan_checkpoint_is_refused_and_leaves_no_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: nan passed the "cannot be negative" check (and a rejected value left an empty
    # measurement directory behind, because the directory was made before the check).
    out = tmp_path / "m"
    err = _refused(capsys, ["-o", str(out), "--checkpoint", "nan", sys.executable, "-c", "1"])
    assert "not nan" in err
    assert not out.exists()


def test_empty_output_name_is_named_in_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: "cannot write measurements to the measurement directory: No such file or directory".
    err = _refused(capsys, ["-o", "", sys.executable, "-c", "1"])
    assert "-o: the measurement directory name is empty" in err


@pytest.mark.parametrize(
    ("name", "value", "known"),
    [
        ("PYHPCTK_PYRUN_CPU_TIMER", "sigtrp", "signal, sigtrap, posix"),
        ("PYHPCTK_PYRUN_SAMPLER", "python", "thread, engine"),
    ],
)
def test_a_mistyped_setting_is_refused_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: str,
    known: str,
) -> None:
    # Before: every measured process read the value and silently took the default.
    monkeypatch.setenv(name, value)
    out = tmp_path / "m"
    err = _refused(capsys, ["-o", str(out), sys.executable, "-c", "1"])
    assert f"{name}={value!r} is none of {known} (unset: the default)" in err
    assert not out.exists()


def test_command_killed_by_a_signal_is_not_called_unmeasurable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "started no Python process pyrun could measure ... interpreters run with -I or -E"
    # for a Python program that was measured but died of SIGHUP before writing its profile.
    # (A SIGHUP is caught and written since issue #15; SIGKILL still leaves nothing.)
    out = tmp_path / "m"
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert main(["-o", str(out), sys.executable, "-c", kill]) == 128 + 9
    err = capsys.readouterr().err
    assert "was killed by SIGKILL before any measured process wrote its profile" in err
    assert "-I or -E" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ("gpu=simulated,bogus=1", "gpu=simulated: unknown option 'bogus'"),
        ("gpu=nvidia,recording=x.json", "gpu=nvidia: unknown option 'recording'"),
        ("gpu=simulated,recording=/nonexistent/run.json", "recording=/nonexistent/run.json: no"),
        ("gpu=simulated,pc=/nonexistent/pc.json", "pc=/nonexistent/pc.json: no such file"),
    ],
)
def test_gpu_event_mistakes_are_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], event: str, message: str
) -> None:
    # Before: a typo was ignored, and a missing recording only made each measured process print
    # "not measuring this process" while pyrun exited 0.
    out = tmp_path / "m"
    assert message in _refused(capsys, ["-o", str(out), "-e", event, sys.executable, "-c", "1"])
    assert not out.exists()

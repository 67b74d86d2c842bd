"""Standard output and odd inputs for every command (issue #15 item 10).

A reader that goes away (``| head -1``) ends a command quietly with status 141, as SIGPIPE ends
other Unix tools; a full disk is one message and status 1; text the output encoding cannot hold
is escaped instead of raising UnicodeEncodeError; FIFOs and devices given as input files are
refused instead of read forever.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import click
import pytest

from limits import within
from pyhpctk.cli._common import EXIT_BROKEN_PIPE, run_command
from pyhpctk.cli.main import main as pyhpctk
from pyhpctk.cli.pystruct import main as pystruct
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import hpcrun, hpcstruct, metadb
from pyhpctk.present.synthetic import Spec, build, write_database

CPU = "CPUTIME (sec)"


def command(name: str, *args: str) -> list[str]:
    module = {"pyhpctk": "main", "pyview": "pyview", "pystruct": "pystruct"}[name]
    return [sys.executable, "-m", f"pyhpctk.cli.{module}", *args]


def big_dump(reference: Path) -> list[str]:
    return command("pyhpctk", "dump", str(reference / "dbase" / "loops-cputime-t.d"))


@pytest.mark.parametrize("which", ["dump", "pyview", "help"])
def test_a_closed_stdout_ends_the_command_quietly(reference: Path, which: str) -> None:
    argv = {
        "dump": big_dump(reference),
        "pyview": command("pyview", str(reference / "dbase" / "loops-cputime-t.d")),
        "help": command("pystruct", "--help"),
    }[which]
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write meets EPIPE
    try:
        done = subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert done.stderr == b""
    assert done.returncode == EXIT_BROKEN_PIPE == 141


def test_a_reader_that_stops_early_ends_the_command_quietly(reference: Path) -> None:
    """``pyhpctk dump DB | head -1``."""
    child = subprocess.Popen(big_dump(reference), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline().startswith(b"=== ")
    child.stdout.close()
    assert child.wait(timeout=60) == EXIT_BROKEN_PIPE
    assert child.stderr.read() == b""


def test_a_full_disk_is_one_message(reference: Path) -> None:
    with open("/dev/full", "wb") as full:
        done = subprocess.run(big_dump(reference), stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 1
    assert done.stderr == b"pyhpctk: error: cannot write the output: No space left on device\n"


@pytest.fixture(scope="module")
def accented(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exp = build(
        [
            Spec(
                "entry",
                name="main thread",
                children=(Spec("function", name="café", values={CPU: (1.0,)}),),
            )
        ],
        [CPU],
        [(("THREAD", 0),)],
    )
    return write_database(exp, tmp_path_factory.mktemp("enc") / "db")


@pytest.mark.parametrize(
    "env",
    [
        {"PYTHONIOENCODING": "ascii:strict"},
        {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
    ],
    ids=["ascii-strict", "C-locale"],
)
@pytest.mark.parametrize("which", ["pyview", "dump"])
def test_names_the_output_encoding_cannot_hold_are_escaped(
    accented: Path, env: dict[str, str], which: str
) -> None:
    argv = (
        command("pyview", str(accented))
        if which == "pyview"
        else command("pyhpctk", "dump", str(accented / "meta.db"))
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LC_ALL")}
    done = subprocess.run(argv, capture_output=True, env={**clean, **env}, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stderr == b""
    assert b"caf\\xe9" in done.stdout


@pytest.mark.parametrize(
    ("encoding", "errors", "expected"),
    [
        ("utf-8", "strict", b"caf\\udce9 \xc3\xa9\n"),  # stays valid UTF-8
        ("ascii", "surrogateescape", b"caf\xe9 \\xe9\n"),  # the name's own byte goes through
    ],
)
def test_run_command_writes_what_the_encoding_cannot_hold(
    monkeypatch: pytest.MonkeyPatch, encoding: str, errors: str, expected: bytes
) -> None:
    """A name that was not UTF-8 (surrogate escape U+DCE9) and a non-ASCII one (é)."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)
    monkeypatch.setattr(sys, "stdout", stream)

    @click.command()
    def show() -> None:
        sys.stdout.write("caf\udce9 \u00e9\n")

    assert run_command(show, [], "show") == 0
    assert raw.getvalue() == expected
    assert stream.errors == errors  # given back as it was


def test_a_warning_said_twice_is_printed_once_per_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A second pass over the same input (a structure file read again when rank 0's early
    expansion is not used) must not repeat its warnings; the next command says them again."""

    @click.command()
    def warn() -> None:
        for message in ("a.hpcstruct: version 4.10 is newer", "b.hpcrun: left out") * 2:
            warnings.warn(message, FormatWarning, stacklevel=1)

    for _ in range(2):
        assert run_command(warn, [], "warn") == 0
        assert capsys.readouterr().err.splitlines() == [
            "warning: a.hpcstruct: version 4.10 is newer",
            "warning: b.hpcrun: left out",
        ]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.py"  # a .py name: pystruct takes those as Python sources
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_pystruct_refuses_what_is_not_a_regular_file(
    fifo: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(fifo) if target == "fifo" else target
    with within(20):
        assert pystruct([path]) == 2
    kind = "a FIFO" if target == "fifo" else "a character device"
    assert (
        capsys.readouterr().err == f"pystruct: error: {path}: file: is {kind}, not a regular file\n"
    )


def test_readers_refuse_a_fifo_inside_a_measurement(
    fifo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO named like a profile: dump and verify say so instead of waiting for a writer."""
    profile = tmp_path / "app-000000-000-0-1-0.hpcrun"
    os.mkfifo(profile)
    with within(20):
        for verb in ("dump", "verify"):
            assert pyhpctk([verb, str(profile)]) == 2
    assert "Traceback" not in capsys.readouterr().err
    for reader in (hpcrun.read, metadb.read, hpcstruct.read):
        with within(20), pytest.raises(FormatError, match="is a FIFO, not a regular file"):
            reader(profile)


# --------------------------------------------------------------------------------------------
# Issue #32, item 8: standard output closed (``cmd >&-``): Python starts with sys.stdout None


def _with_stdout_closed(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` as the shell runs ``argv >&-``: file descriptor 1 closed."""
    return subprocess.run(
        ["sh", "-c", '"$@" >&-', "sh", *argv],
        stderr=subprocess.PIPE,
        cwd=cwd,
        timeout=120,
    )


CLOSED_STDOUT = "error: cannot write the output: standard output is closed\n"


@pytest.mark.parametrize("which", ["verify", "dump", "pyview", "pymodel"])
def test_a_command_whose_stdout_is_closed_says_so_in_one_line(
    reference: Path, tmp_path: Path, which: str
) -> None:
    from test_pymodel_cli import BEHAVIOUR, make_database

    database = str(reference / "dbase" / "small.d")
    series = []
    for p in (2, 4, 8, 16, 32):
        values = {name: f(float(p)) for name, f in BEHAVIOUR.items()}
        make_database(tmp_path / f"app-p{p}.d", "app", values)
        series.append(str(tmp_path / f"app-p{p}.d"))
    argv, prog = {
        "verify": (command("pyhpctk", "verify", database), "pyhpctk"),
        "dump": (command("pyhpctk", "dump", database), "pyhpctk"),
        "pyview": (command("pyview", database), "pyview"),
        "pymodel": (
            [sys.executable, "-m", "pyhpctk.cli.pymodel", *series, "--param", "p=2,4,8,16,32"],
            "pymodel",
        ),
    }[which]
    # Before: AttributeError: 'NoneType' object has no attribute 'flush' (or 'write',
    # 'isatty'), a traceback.
    done = _with_stdout_closed(argv, tmp_path)
    assert done.stderr.decode() == f"{prog}: {CLOSED_STDOUT}"
    assert done.returncode == 1


def test_pyprof_with_stdout_closed_writes_its_database_and_succeeds(
    reference: Path, tmp_path: Path
) -> None:
    """pyprof prints its summary on stderr: a closed stdout takes nothing from it."""
    argv = [sys.executable, "-m", "pyhpctk.cli.pyprof", "-o", "db"]
    # Before: the database was written, then a traceback and exit status 1.
    done = _with_stdout_closed([*argv, str(reference / "meas" / "small.m")], tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.startswith(f"wrote {Path('db')}: ") and "Traceback" not in err
    assert pyhpctk(["verify", "-q", str(tmp_path / "db")]) == 0


def test_pystruct_and_pyrun_with_stdout_closed_do_their_work(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text("import os\nos.write(2, b'child ran\\n')\n")
    pyrun = [sys.executable, "-m", "pyhpctk.cli.pyrun", "-o", "m", sys.executable, str(script)]
    done = _with_stdout_closed(pyrun, tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 0 and "child ran" in err and "Traceback" not in err, err
    assert list((tmp_path / "m").glob("*.hpcrun"))
    done = _with_stdout_closed(command("pystruct", str(script)), tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr.decode(), done.stderr
    assert hpcstruct.read(tmp_path / "app.py.hpcstruct").modules

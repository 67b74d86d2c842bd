"""pyprof copies into DB/src only the sources something vouches for (issue #32, item 1).

A measurement names any file its program likes (``compile(code, "/etc/shadow", "exec")``) and
anyone can edit one: before, pyprof copied every absolute name that was a file, world-readable.
Now a Python source is copied when pyrun's loaded-sources table lists it with the hash it still
has, a native one when a structure file names it; never from /proc, /sys or /dev, never a FIFO
or a device, never with a permission bit the original lacks; the summary says what was not
copied and why.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from limits import within
from output_helpers import python_measurement, record_loaded
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.analysis.sources import LINK, Warrants, copy_sources
from pyhpctk.cli.pyprof import main as pyprof_main
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import metadb, sources

SPIN = (
    "import time\n"
    "def spin(seconds):\n"
    "    end = time.thread_time() + seconds\n"
    "    while time.thread_time() < end:\n"
    "        pass\n"
)
PROGRAM = (
    "import sys\n"
    "import helper\n"
    "namespace = {}\n"
    "exec(compile(open(sys.argv[2]).read(), sys.argv[1], 'exec'), namespace)\n"
    "namespace['spin'](0.3)\n"
    "helper.spin(0.3)\n"
)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_file_the_program_only_named_is_not_copied_and_the_summary_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the password is swordfish\n")
    secret.chmod(0o600)
    (tmp_path / "spin.py").write_text(SPIN)
    helper = tmp_path / "helper.py"
    helper.write_text(SPIN)
    helper.chmod(0o600)  # loaded by the program: copied, and no more readable than it is
    app = tmp_path / "app.py"
    app.write_text(PROGRAM)
    measurement = tmp_path / "m"
    argv = [
        "-o",
        str(measurement),
        sys.executable,
        str(app),
        str(secret),
        str(tmp_path / "spin.py"),
    ]
    assert pyrun_main(argv) == 0
    (table,) = (measurement / "sources").iterdir()
    listed = {entry.path for entry in sources.read(table).entries}
    assert {str(app), str(helper)} <= listed and str(secret) not in listed
    database = tmp_path / "db"
    capsys.readouterr()
    assert pyprof_main(["-o", str(database), str(measurement)]) == 0
    # Before: src/.../secret.txt, mode 0644 (world-readable), and helper.py 0644 too.
    src = database / "src"
    assert {str(app).lstrip("/"), str(helper).lstrip("/")} <= _files(src)
    assert str(secret).lstrip("/") not in _files(src)
    copy = src / str(helper).lstrip("/")
    assert copy.read_text() == SPIN and stat.S_IMODE(copy.stat().st_mode) == 0o600
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("sources: ")]
    assert line.endswith(f" 1 not copied (1 not loaded by the program: {secret})"), line
    copied = {f.path: f.copied for f in metadb.read(database / "meta.db").files}
    assert copied[str(secret)] is False and copied[str(helper)] is True


def _listed(measurement: Path, names: dict[str, bytes]) -> None:
    """Add to the measurement's table these names with the hash of these bytes."""
    table = sources.read(measurement / "sources" / "1.0000abcd.txt")
    for name, data in names.items():
        table.entries.append(sources.LoadedSource(hashlib.sha256(data).hexdigest(), name))
    sources.write(table, measurement / "sources" / "1.0000abcd.txt")


def test_a_hand_edited_table_cannot_publish_proc_a_link_a_fifo_or_a_changed_file(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.py"
    good.write_text("print('good')\n")
    changed = tmp_path / "changed.py"
    changed.write_text("print('as run')\n")
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    link = tmp_path / "link.py"
    link.symlink_to("/proc/self/environ")
    environ = "/proc/self/environ"
    names = [str(good), str(changed), str(fifo), str(link), environ]
    measurement = python_measurement(tmp_path / "m", names, loaded=False)
    record_loaded(measurement, [str(good), str(changed)])
    environ_bytes = Path(environ).read_bytes()  # the hash of what pyprof would read
    _listed(measurement, {str(fifo): b"", str(link): environ_bytes, environ: environ_bytes})
    changed.write_text("print('edited since')\n")
    database = tmp_path / "db"
    with within(60):  # the FIFO is never opened for a blocking read
        report = run(ProfOptions.build([measurement], output=database))
    assert report.sources is not None
    assert report.sources.line() == (
        f"sources: 1 copied, 4 not copied (1 changed since the run: {changed}; "
        f"1 not a regular file: {fifo}; 2 in /proc, /sys or /dev: {link}, {environ})"
    )
    assert _files(database / "src") == {str(good).lstrip("/")}


def test_without_a_table_only_what_a_structure_file_names_is_copied(tmp_path: Path) -> None:
    """hpcrun's measurements have no loaded-sources table: a source is copied when a structure
    file names it, and then never through a symbolic link."""
    native = tmp_path / "kernel.c"
    native.write_text("int main(void) { return 0; }\n")
    native.chmod(0o640)
    link = tmp_path / "link.c"
    link.symlink_to(native)
    named = tmp_path / "named.py"
    named.write_text("print('named')\n")
    database = tmp_path / "db"
    database.mkdir()
    warrants = Warrants(structured=frozenset([str(native), str(link)]))
    copied, report = copy_sources([str(native), str(link), str(named)], database, warrants)
    assert copied == {str(native)}
    assert report.refused == {
        LINK: [str(link)],
        "named by no structure file (the measurement records no loaded sources)": [str(named)],
    }
    copy = database / "src" / str(native).lstrip("/")
    assert stat.S_IMODE(copy.stat().st_mode) == 0o640 & ~_umask()


def _umask() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise AssertionError("no Umask line")


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another group: needs root")
def test_a_copy_owned_by_another_group_keeps_no_group_right_others_lacked(tmp_path: Path) -> None:
    source = tmp_path / "team.py"
    source.write_text("print('team only')\n")
    os.chown(source, -1, 54321)  # a group the copy (pyprof's group) will not have
    source.chmod(0o640)
    measurement = python_measurement(tmp_path / "m", [str(source)])
    run(ProfOptions.build([measurement], output=tmp_path / "db"))
    copy = tmp_path / "db" / "src" / str(source).lstrip("/")
    assert copy.stat().st_gid != 54321
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600


def test_no_sources_copies_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "app.py"
    script.write_text("print('app')\n")
    measurement = python_measurement(tmp_path / "m", [str(script)])
    assert pyprof_main(["--no-sources", "-o", str(tmp_path / "db"), str(measurement)]) == 0
    assert "sources: not copied (--no-sources)" in capsys.readouterr().err.splitlines()
    assert not (tmp_path / "db" / "src").exists()


def test_the_loaded_sources_file_round_trips_and_pyrun_writes_the_same_bytes() -> None:
    from pyhpctk.measure.source_files import encode_sources

    odd = "/tmp/a\tb\\c\nd" + os.fsdecode(b"\xe9.py")  # escapes, and a byte that is not UTF-8
    table = sources.LoadedSources(
        [sources.LoadedSource("0" * 64, "/x/app.py"), sources.LoadedSource("f" * 64, odd)]
    )
    data = sources.to_bytes(table)
    assert data == encode_sources((e.sha256, e.path) for e in table.entries)
    assert data.splitlines()[2] == b"f" * 64 + b"\t/tmp/a\\tb\\\\c\\nd\xe9.py"
    assert sources.read(data) == table and sources.verify(table) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"pyhpctk-threads 1 by-file\n", "bad magic"),
        (b"pyhpctk-sources 1\n" + b"0" * 64 + b"\t/a.py", "truncated"),
        (b"pyhpctk-sources 1\n" + b"0" * 63 + b"\t/a.py\n", "not SHA256<TAB>PATH"),
        (b"pyhpctk-sources 1\n" + b"0" * 64 + b" /a.py\n", "not SHA256<TAB>PATH"),
        (b"pyhpctk-sources 1\n" + b"0" * 64 + b"\t/a\\q.py\n", "unknown escape"),
    ],
)
def test_a_damaged_loaded_sources_file_is_one_format_error(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=re.escape(message)):
        sources.read(data)


def test_an_unreadable_table_is_a_warning_and_vouches_for_nothing(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text("print('app')\n")
    measurement = python_measurement(tmp_path / "m", [str(script)])
    (table,) = (measurement / "sources").iterdir()
    table.write_bytes(table.read_bytes()[:-1])  # no newline at the end: truncated
    with pytest.warns(FormatWarning, match="truncated: no newline at the end: these sources"):
        report = run(ProfOptions.build([measurement], output=tmp_path / "db"))
    assert report.sources is not None
    assert report.sources.line() == (
        f"sources: 0 copied, 1 not copied (1 not loaded by the program: {script})"
    )


def test_pyrun_lists_a_file_once_a_module_has_loaded_it_and_hashes_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    from pyhpctk.measure.cct import FunctionStanza
    from pyhpctk.measure.source_files import SourceRecorder

    late = tmp_path / "late.py"
    late.write_text("x = 1\n")
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    table = SourceRecorder("0000abcd", 1)
    stanzas = [FunctionStanza(1, "", str(late), 0), FunctionStanza(2, "", str(fifo), 0)]
    assert table.record(stanzas) is None  # named, but no module has loaded it yet
    for name, path in (("late_module", late), ("fifo_module", fifo)):
        module = types.ModuleType(name)
        module.__file__ = str(path)
        monkeypatch.setitem(sys.modules, name, module)
    with within(20):  # the FIFO is never read
        data = table.record(stanzas)
    digest = hashlib.sha256(b"x = 1\n").hexdigest()
    assert data == f"pyhpctk-sources 1\n{digest}\t{late}\n".encode()
    table.written(data)
    late.write_text("x = 2\n")
    assert table.record([*stanzas, FunctionStanza(3, "f", str(late), 1)]) is None

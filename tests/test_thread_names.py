"""Thread names from pyrun to pyview (issue #21 item 7): the ``threads/`` side file of the
measurements, ``threads.txt`` of the database, the Perfetto export, the trace summary.

``tests/programs/named_threads.py``: a ThreadPoolExecutor's two workers and a thread started as
``loader`` (it renames itself ``loader-done`` before it ends) spend S of CPU time each, the main
thread S / 4. Measured with the sampling engine and with the Python sampler thread.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import SAMPLERS
from pyhpctk import formats
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import threads
from pyhpctk.formats.inspect import dump_path, verify_path
from pyhpctk.measure.encode import encode_threads
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.sampling import engine
from pyhpctk.measure.session import Session
from pyhpctk.measure.thread_names import ThreadNames, comm_name, program_name, thread_name
from pyhpctk.present import open_database
from pyhpctk.present.traces import render_summary, summarize, to_perfetto

PROGRAM = Path(__file__).resolve().parent / "programs" / "named_threads.py"
CPU = "CPUTIME (sec)"
S = 0.3
NAMES = {"MainThread", "ThreadPoolExecutor-0_0", "ThreadPoolExecutor-0_1", "loader-done"}


def measure(where: Path, sampler: str, *extra: str) -> tuple[Path, int]:
    """pyrun -t of the program with the given sampler; (measurement directory, exit status)."""
    measurement = where / "m"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(engine.ENV_SAMPLER, sampler)
        status = pyrun_main(
            ["-t", "-o", str(measurement), sys.executable, str(PROGRAM), str(S), *extra]
        )
    return measurement, status


def names_problems(measurement: Path) -> list[str]:
    """What verify finds unreadable, or wrong with the names (the traces are other tests')."""
    report = verify_path(measurement)
    return report.unreadable + [p for p in report.problems if "/threads/" in p]


@pytest.fixture(scope="module", params=SAMPLERS)
def measured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp(f"names-{request.param}")
    measurement, status = measure(where, request.param)
    assert status == 0
    run(ProfOptions.build([measurement], output=where / "db"))
    return where


def test_pyrun_records_every_threads_last_name(measured: Path) -> None:
    (path,) = (measured / "m" / "threads").iterdir()
    names = threads.read(path)
    assert names.keyed_by == threads.BY_FILE
    assert {e.name for e in names.entries} == NAMES  # "loader" renamed itself before it ended
    assert {e.program for e in names.entries} == {"named_threads.py"}
    for entry in names.entries:
        assert (measured / "m" / f"{entry.key}.hpcrun").is_file()
        assert f"-{entry.pid}-" in entry.key
    assert names_problems(measured / "m") == []


def test_the_database_names_its_profiles_and_verify_and_dump_read_it(measured: Path) -> None:
    names = threads.read(measured / "db" / "threads.txt")
    assert names.keyed_by == threads.BY_PROFILE
    assert sorted(names.by_profile()) == [1, 2, 3, 4]
    assert {e.name for e in names.entries} == NAMES
    report = verify_path(measured / "db")
    assert report.exit_code == 0 and report.checked == 5, report.problems
    text = io.StringIO()
    dump_path(measured / "db", text)
    assert "=== threads.txt (threads)" in text.getvalue()
    assert ": ThreadPoolExecutor-0_1 (pid " in text.getvalue()


def test_perfetto_tracks_are_named_after_the_threads_and_no_gpu_process(measured: Path) -> None:
    exp = open_database(measured / "db").experiment
    doc = to_perfetto(exp)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    tracks = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert tracks == NAMES
    processes = [e["args"]["name"] for e in meta if e["name"] == "process_name"]
    (pid,) = {n.pid for n in exp.thread_names.values()}
    assert processes == [f"named_threads.py (pid {pid})"]  # a CPU-only run: no GPU process
    json.dumps(doc, allow_nan=False)


def test_the_trace_summary_names_threads_and_tells_cpu_from_wall_time(measured: Path) -> None:
    exp = open_database(measured / "db").experiment
    summaries = {s.thread: s for s in summarize(exp)}
    assert set(summaries) == NAMES
    for name in NAMES - {"MainThread"}:
        line = summaries[name]
        assert line.cpu_ns is not None
        assert line.cpu_ns == pytest.approx(S * 1e9, rel=0.35)  # its CPU time, not its span
        assert line.cpu_ns <= line.span_ns * 1.05
    out = io.StringIO()
    render_summary(summarize(exp), out)
    worker = next(x for x in out.getvalue().splitlines() if "ThreadPoolExecutor-0_1 (" in x)
    assert "of wall time, in a calling context" in worker and "; CPU time " in worker


def test_the_per_profile_table_has_the_names(measured: Path) -> None:
    _, metadata = open_database(measured / "db").profile_tables([CPU])
    assert set(metadata["thread_name"]) == NAMES
    assert set(metadata["program"]) == {"named_threads.py"}
    by_thread = dict(zip(metadata["thread"], metadata["thread_name"], strict=True))
    assert by_thread[0] == "MainThread"


def test_per_thread_views_of_the_cli_name_the_threads(
    measured: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = measured / "db"
    exp = open_database(db).experiment
    work = next(
        int(exp.tree.ctx_id[node])
        for node in range(exp.tree.size)
        if exp.tree.function_name(node) == "work"
    )
    assert pyview_main([str(db), "--context", str(work)]) == 0
    out = capsys.readouterr().out
    assert "ThreadPoolExecutor-0_1 (NODE 0 / THREAD " in out, out
    report = measured / "report.html"
    assert pyview_main([str(db), "--html", str(report), "--force"]) == 0
    data = report.read_text().split('id="report-data">', 1)[1].split("</script>", 1)[0]
    assert "loader-done (NODE 0 / THREAD " in json.dumps(json.loads(data)["timeline"])


def test_a_database_without_names_keeps_todays_track_names(measured: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(measured / "db", old)
    (old / "threads.txt").unlink()
    exp = open_database(old).experiment
    assert exp.thread_names == {}
    doc = to_perfetto(exp)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    tracks = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert "main thread (THREAD 0)" in tracks and tracks.isdisjoint(NAMES)
    processes = [e["args"]["name"] for e in meta if e["name"] == "process_name"]
    assert processes == ["CPU threads (NODE 0)"]
    assert verify_path(old).exit_code == 0


def test_damaged_names_are_a_warning_and_the_views_go_on(measured: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(measured / "db", bad)
    (bad / "threads.txt").write_bytes(threads.MAGIC + b"by-profile\n1\tnot-a-pid\tx\ty\n")
    with pytest.warns(FormatWarning, match="process id 'not-a-pid' is not a number"):
        exp = open_database(bad).experiment
    assert exp.thread_names == {}
    assert len(summarize(exp)) == 4
    assert verify_path(bad).exit_code == 2


def test_names_of_profiles_that_do_not_exist_are_problems(measured: Path, tmp_path: Path) -> None:
    db = tmp_path / "db"
    shutil.copytree(measured / "db", db)
    entry = threads.ThreadEntry("9", 1, "x.py", "ghost")
    threads.write(threads.ThreadNamesFile(threads.BY_PROFILE, [entry]), db / "threads.txt")
    assert any("profile 9: not a thread profile" in p for p in verify_path(db).problems)
    meas = tmp_path / "m"
    shutil.copytree(measured / "m", meas)
    (path,) = (meas / "threads").iterdir()
    names = threads.read(path)
    names.entries.append(threads.ThreadEntry("python-gone-0", 1, "x.py", "ghost"))
    names.entries[0] = threads.ThreadEntry(names.entries[0].key, 1, "x.py", "MainThread")
    threads.write(names, path)
    problems = verify_path(meas).problems
    assert any("no readable profile python-gone-0.hpcrun" in p for p in problems), problems
    assert any("process id 1, the profile's is" in p for p in problems), problems


def test_sigterm_leaves_the_names_readable(tmp_path: Path, sampler: str) -> None:
    measurement, status = measure(tmp_path, sampler, "term")
    assert status != 0  # the program died of SIGTERM, as without pyrun
    (path,) = (measurement / "threads").iterdir()
    assert {e.name for e in threads.read(path).entries} == NAMES
    assert names_problems(measurement) == []


# -- the format alone ---------------------------------------------------------------------------


def test_names_round_trip_with_any_character_and_pyruns_encoder_writes_the_same_bytes() -> None:
    odd = "tab\there\nnewline \\ back\rslash \udcff é"
    entries = [("python-000000-000-1-7-0", 7, "a b.py", "MainThread"), ("k", 9, odd, odd)]
    names = threads.ThreadNamesFile(threads.BY_FILE, [threads.ThreadEntry(*e) for e in entries])
    data = threads.to_bytes(names)
    assert encode_threads(threads.BY_FILE, entries) == data
    assert threads.read(data) == names
    assert threads.to_bytes(threads.read(data)) == data
    assert data.count(b"\n") == 3  # the header and one line per thread
    assert formats.detect(data[:64]) == "threads"
    assert threads.verify(names) == []
    assert "k: 'tab\\there" in threads.dumps(names)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"pyhpctk-thread 1 by-file\n", "bad magic"),
        (threads.MAGIC + b"by-rank\n", "unknown key kind"),
        (threads.MAGIC + b"by-file\nk\t1\tp\tn", "truncated"),
        (threads.MAGIC + b"by-file\nk\t1\tp\n", "3 tab-separated fields, not 4"),
        (threads.MAGIC + b"by-file\nk\t-1\tp\tn\n", "process id '-1' is not a number"),
        (threads.MAGIC + b"by-file\nk\t1\tp\tbad\\x\n", "unknown escape"),
    ],
)
def test_bad_names_files_are_refused_in_one_line(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        threads.read(data)


def test_verify_names_what_pyrun_never_writes() -> None:
    entries = [
        threads.ThreadEntry("1", 5, "p", "a"),
        threads.ThreadEntry("1", 5, "p", ""),
        threads.ThreadEntry("x", 0, "p", "b"),
    ]
    problems = threads.verify(threads.ThreadNamesFile(threads.BY_PROFILE, entries))
    assert any("key listed more than once" in p for p in problems)
    assert any("empty thread name" in p for p in problems)
    assert any("'x'): not a profile.db index" in p for p in problems)
    assert any("process id 0" in p for p in problems)


# -- pyrun's side -------------------------------------------------------------------------------


class _State:
    """What thread_name reads of a session's ThreadState."""

    def __init__(self, thread: threading.Thread | None, native_id: int | None) -> None:
        self.thread = thread
        self.native_id = native_id
        self.comm = ""


def test_a_thread_python_never_started_is_named_by_the_kernel() -> None:
    ready, release = threading.Event(), threading.Event()
    native: list[int] = []

    def body() -> None:
        native.append(threading.get_native_id())
        # What a C library does with pthread_setname_np: only the kernel knows the name.
        Path(f"/proc/self/task/{native[0]}/comm").write_text("openblas_t3")
        ready.set()
        release.wait()

    thread = threading.Thread(target=body, name="python-name")
    thread.start()
    ready.wait()
    try:
        state = _State(None, native[0])
        assert comm_name(native[0]) == "openblas_t3"
        assert thread_name(state) == "openblas_t3"  # type: ignore[arg-type]
        assert thread_name(_State(thread, native[0])) == "python-name"  # type: ignore[arg-type]
    finally:
        release.set()
        thread.join()
    # join() returns when Python is done with the thread; the kernel task ends a moment later
    deadline = time.monotonic() + 5.0
    while Path(f"/proc/self/task/{native[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert comm_name(native[0]) == ""  # gone: the name read while it lived is kept
    assert thread_name(state) == "openblas_t3"  # type: ignore[arg-type]


def test_the_names_file_changes_only_when_a_name_does() -> None:
    names = ThreadNames("0badf00d", os.getpid())
    assert names.path == os.path.join("threads", f"{os.getpid()}.0badf00d.txt")
    first = names.record("s-000-0", "MainThread")
    assert first is not None
    names.written(first)
    assert names.record("s-000-0", "MainThread") is None  # a checkpoint: nothing to rewrite
    renamed = names.record("s-000-0", "Main")
    assert renamed is not None and b"\tMain\n" in renamed
    moved = names.record("t-000-0", "Main", old_stem="s-000-0")  # the stem changed (a rank)
    assert moved is not None
    assert [e.key for e in threads.read(moved).entries] == ["t-000-0"]


@pytest.mark.parametrize(
    ("argv0", "expected"),
    [
        ("/srv/app/train.py", "train.py"),
        ("/srv/site-packages/mypkg/__main__.py", "mypkg"),  # python -m mypkg
        ("-c", "-c"),
    ],
)
def test_the_program_is_named_as_the_user_ran_it(
    monkeypatch: pytest.MonkeyPatch, argv0: str, expected: str
) -> None:
    monkeypatch.setattr(sys, "argv", [argv0])
    assert program_name() == expected


def test_a_checkpoint_written_late_does_not_undo_the_threads_last_write(tmp_path: Path) -> None:
    """A checkpoint encodes every thread under the session's lock and writes after it; a thread
    that ends in between encodes and writes its final files first. The checkpoint's older
    encoding, written last, replaced them: the thread kept the name it had before it renamed
    itself (seen on CI: ``loader`` instead of ``loader-done``) and lost its last samples."""
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    loader = threading.Thread(name="loader")  # registered, never started: its name is read
    # This thread's ids stand in for the loader's: a made-up pthread id would be dereferenced.
    ident, native = threading.get_ident(), threading.get_native_id()
    state = session.register_thread(loader, ident=ident, native_id=native)
    with session.lock:
        checkpoint = session.writer.encode(state)
    loader.name = "loader-done"
    with session.lock:
        final = session.writer.encode(state)
    session.writer.write(state, final)
    session.writer.write(state, checkpoint)
    (path,) = (tmp_path / "threads").iterdir()
    assert [e.name for e in threads.read(path).entries] == ["loader-done"]
    assert (tmp_path / f"{state.stem}.hpcrun").read_bytes() == final[1]

"""Windows of long jobs (issue #37, item 3): ``pyrun --start-paused`` and ``pyrun ctl``.

``tests/programs/windows.py`` runs three phases in each of its processes (the program, a
``subprocess`` child, a forked child, and short children started inside the window) and writes
what each phase cost; the test opens a window with ``pyrun ctl PYRUN_PID start`` between phases
A and B and closes it with ``stop`` between B and C. The profiles must hold phase B and nothing
of A or C, with the sampling engine and with the Python sampler, and a ``-t`` trace must have
samples only inside the window. Errors of ``pyrun ctl`` are one line.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main as pyview
from pyhpctk.formats import hpctrace
from pyhpctk.measure.control import (
    ControlChannel,
    control_directory,
    decode_command,
    encode_command,
)
from pyhpctk.measure.launch import attach as attaching
from pyhpctk.measure.launch.attach import attach_script, remote_exec_missing
from pyhpctk.measure.launch.config import MeasureOptions
from test_pyrun_engine import CPU, Profile, read_profiles

PROGRAM = Path(__file__).resolve().parent / "programs" / "windows.py"
PYRUN = str(Path(sys.executable).parent / "pyrun")
PYTHON = sys.executable
MARK = "after phase b"


def _wait_for(pattern: str, directory: Path, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while len(list(directory.glob(pattern))) < count:
        if process.poll() is not None:
            raise AssertionError(f"the program ended early: {process.communicate()}")
        assert time.monotonic() < deadline, f"{pattern} x{count} never came in {directory}"
        time.sleep(0.02)


def _ctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = pyrun_main(["ctl", *args])
    return status, capsys.readouterr().err


def _pid_of(path: Path) -> int:
    return int(path.name.removesuffix(".hpcrun").rsplit("-", 2)[1])


def _window_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sampler: str
) -> tuple[dict[int, Profile], dict[int, dict[str, object]], Path, tuple[int, int]]:
    """Run the job paused, open a window over phase B, mark, close it; the profiles by pid,
    the truths by pid, the measurement, and the window (ns) as the test saw it."""
    out = tmp_path / "m"
    env = dict(os.environ, PYHPCTK_PYRUN_SAMPLER=sampler)
    pyrun = subprocess.Popen(
        [PYRUN, "--start-paused", "-t", "-e", "CPUTIME@1000", "-o", str(out), PYTHON,
         str(PROGRAM), str(tmp_path), "--children"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for("ready-b-*", tmp_path, 3, pyrun)
        opened = time.time_ns()
        status, said = _ctl(capsys, str(pyrun.pid), "start")
        assert status == 0, said
        assert said.startswith("pyrun ctl: 3 processes measuring: "), said
        (tmp_path / "go-b").touch()
        _wait_for("done-b-*", tmp_path, 3, pyrun)
        status, said = _ctl(capsys, str(pyrun.pid), "mark", MARK)
        assert status == 0 and f"3 processes marked '{MARK}'" in said, said
        status, said = _ctl(capsys, str(pyrun.pid), "stop")
        closed = time.time_ns()
        assert status == 0 and said.startswith("pyrun ctl: 3 processes paused: "), said
        (tmp_path / "go-c").touch()
        _, stderr = pyrun.communicate(timeout=120)
    finally:
        pyrun.kill()
    assert pyrun.returncode == 0, stderr
    return _profiles_by_pid(out), _truths(tmp_path), out, (opened, closed)


def _profiles_by_pid(out: Path) -> dict[int, Profile]:
    pids = [_pid_of(p) for p in sorted(out.glob("*.hpcrun"))]  # one thread per process
    return dict(zip(pids, read_profiles(out), strict=True))  # read in the same order


def _truths(directory: Path) -> dict[int, dict[str, object]]:
    return {
        int(p.stem.removeprefix("truth-")): json.loads(p.read_text())
        for p in directory.glob("truth-*.json")
    }


def _only_phase_b(profile: Profile, truth: dict[str, object]) -> None:
    times: dict[str, float] = truth["times"]  # type: ignore[assignment]
    assert profile.inclusive(CPU, "phase_a") == 0.0
    assert profile.inclusive(CPU, "phase_c") == 0.0
    assert profile.inclusive(CPU, "phase_b") == pytest.approx(times["b"], rel=0.15)


@pytest.mark.parametrize("sampler", ["engine", "thread"])
def test_a_window_opened_by_ctl_holds_phase_b_only_in_every_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sampler: str
) -> None:
    profiles, truths, out, (opened, closed) = _window_run(tmp_path, capsys, sampler)
    assert set(truths) <= set(profiles), (truths, profiles)
    for pid, truth in truths.items():  # the program, its subprocess child, its forked child
        profile = profiles[pid]
        _only_phase_b(profile, truth)
        # The mark came after phase B: its node is right under the fence, and holds what
        # followed (linger, until go-c), not phase B.
        (marked,) = [n for n, (_, label, _) in profile.nodes.items() if label == f"<mark {MARK}>"]
        assert profile.path(marked)[-2][0] == "| Main  "
        assert profile.inclusive(CPU, f"<mark {MARK}>") > 0
        labels_under_mark = {
            label
            for node in profile.values
            if (f"<mark {MARK}>", 0) in profile.path(node)
            for label, _ in profile.path(node)
        }
        assert "linger" in labels_under_mark and "phase_b" not in labels_under_mark
    # In pyview's tree (what a user reads) the mark is a row right under the thread.
    database, view = tmp_path / "db", tmp_path / "view.json"
    assert pyprof(["-o", str(database), str(out)]) == 0
    assert pyview(["--full", "--json", str(view), str(database)]) == 0
    threads = json.loads(view.read_text())["root"]["children"]
    marks = [row for thread in threads for row in thread.get("children", [])]
    assert f"<mark {MARK}>" in {row["scope"] for row in marks}, [r["scope"] for r in marks]
    exported = tmp_path / "trace.json"  # and in the timeline, as a frame of the stacks after it
    assert pyview(["--trace-export", str(exported), str(database)]) == 0
    assert f'"<mark {MARK}>"' in exported.read_text()
    # Children started inside the window (by the program and by its subprocess child) began
    # measuring, as their parents were: their whole life is in the window.
    inside = [p for pid, p in profiles.items() if pid not in truths]
    assert len(inside) == 2
    for profile in inside:
        assert profile.inclusive(CPU, "inside_window") == pytest.approx(0.3, rel=0.2)
    # Every sample of every trace lies inside the window; before and after, the threads idle.
    for path in out.glob("*.hpctrace"):
        profile = profiles[_pid_of(path)]
        records = hpctrace.read(path).records
        samples = [
            int(r["time"]) for r in records if profile.nodes[int(r["node_id"])][1] != "NoActvty"
        ]
        assert samples, path
        assert opened <= min(samples) and max(samples) <= closed, (path, sampler)


def test_ctl_says_in_one_line_why_it_cannot_reach_a_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    status, said = _ctl(capsys, str(pid_max + 1), "start")
    assert (status, said) == (1, f"pyrun ctl: error: no process {pid_max + 1}\n")

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        status, said = _ctl(capsys, str(sleeper.pid), "stop")
    finally:
        sleeper.kill()
    assert status == 1 and said.count("\n") == 1, said
    assert f"process {sleeper.pid} (sleep 30) is not measured by pyrun" in said

    # Another user's process: root makes one; anyone else has init's.
    other = subprocess.Popen(["sleep", "30"], user=65534) if os.getuid() == 0 else None
    try:
        target = other.pid if other is not None else 1
        status, said = _ctl(capsys, str(target), "start")
    finally:
        if other is not None:
            other.kill()
    assert status == 1 and said.count("\n") == 1, said
    assert "is another user's" in said and "reaches only your own processes" in said

    # A job measured without --control has no socket to reach.
    out, flag = tmp_path / "m", tmp_path / "flag"
    code = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)"
    job = subprocess.Popen([PYRUN, "-o", str(out), PYTHON, "-c", code], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not list(out.glob("*.hpcrun")) and time.monotonic() < deadline:
            time.sleep(0.05)  # its first checkpoint: it measures
        program = _children_of(job.pid)[0]
        status, said = _ctl(capsys, str(program), "start")
    finally:
        flag.touch()
        job.communicate(timeout=60)
    assert status == 1 and said.count("\n") == 1, said
    assert "is measured by pyrun without control" in said and "--start-paused" in said

    status, said = _ctl(capsys, str(os.getpid()), "mark", "")
    assert (status, said) == (2, "pyrun ctl: error: a mark needs a name\n")
    status, said = _ctl(capsys, str(os.getpid()), "start", "now")
    assert (status, said) == (2, "pyrun ctl: error: start takes no name\n")


def _children_of(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def test_a_command_that_is_not_one_is_answered_with_why() -> None:
    assert decode_command(encode_command("mark", "epoch 3")) == ("mark", "epoch 3")
    for data, why in (
        (b"hello", "not a pyrun ctl command"),
        (b"pyrun-ctl 1 jump", "unknown command 'jump'"),
        (b"pyrun-ctl 1 mark \x01", "a mark's name must be printable"),
        (b"pyrun-ctl 1 stop now", "stop takes no name"),
    ):
        with pytest.raises(ValueError, match=why):
            decode_command(data)


def test_the_control_directory_is_this_users_alone() -> None:
    directory = control_directory()
    info = os.stat(directory)  # made by the runs above, or by this one's sessions
    assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14 has sys.remote_exec")
def test_attach_on_an_older_interpreter_says_what_it_needs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = pyrun_main(["attach", str(os.getpid())])
    said = capsys.readouterr().err
    assert status == 2 and said.count("\n") == 1, said
    assert said.startswith("pyrun attach: error: pyrun attach needs CPython 3.14 or newer")
    assert "PEP 768" in said and "pyrun --start-paused" in said
    assert remote_exec_missing((3, 13)) != ""


ATTACHED = """
import os, sys, time
script, burned, done = sys.argv[1:]
while not os.path.exists(script):
    time.sleep(0.01)
exec(compile(open(script).read(), script, "exec"), {})  # as sys.remote_exec runs it

def attached_work():
    end = time.thread_time() + 0.5
    while time.thread_time() < end:
        sum(i * i for i in range(2000))

attached_work()
open(burned, "w").close()
while not os.path.exists(done):
    time.sleep(0.01)
"""


def test_the_attach_script_measures_a_running_process_that_ctl_then_controls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``pyrun attach`` has the process run (sys.remote_exec needs CPython 3.14, not
    installed here): a plain process, not started by pyrun, runs the script in its main thread,
    measures from then on, and ``pyrun ctl PID stop`` writes its files."""
    out, script, burned, done = (tmp_path / name for name in ("m", "attach.py", "burned", "done"))
    out.mkdir()
    program = subprocess.Popen(
        [PYTHON, "-c", ATTACHED, str(script), str(burned), str(done)], stderr=subprocess.PIPE
    )
    try:
        options = MeasureOptions(str(out), control=True)
        staged = tmp_path / "staged.py"
        staged.write_text(attach_script(options, str(script)))
        staged.rename(script)
        deadline = time.monotonic() + 60
        while not burned.exists():
            assert program.poll() is None, program.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status, said = _ctl(capsys, str(program.pid), "stop")
        assert status == 0, said
        assert said.startswith(f"pyrun ctl: 1 process paused: {program.pid} (python -c"), said
        (profile,) = read_profiles(out)  # written at the stop
        assert profile.inclusive(CPU, "attached_work") == pytest.approx(0.5, rel=0.15)
        assert not script.exists()  # the script removed itself
    finally:
        done.touch()
        if not burned.exists():
            program.kill()  # it never got as far
        _, stderr = program.communicate(timeout=60)
    assert program.returncode == 0, stderr


@pytest.mark.skipif(
    os.getuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
    reason="sending as another user needs root, and a Python that user can run",
)
def test_a_command_from_another_user_is_ignored() -> None:
    """The directory keeps other users out; the credentials the kernel attaches are checked as
    well (a socket reached some other way, a directory whose mode was changed)."""
    directory = tempfile.mkdtemp(prefix="pyhpctk-open-")  # /tmp: reachable by every user
    os.chmod(directory, 0o777)
    path = os.path.join(directory, "open.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    receiver.bind(path)
    os.chmod(path, 0o777)
    receiver.setblocking(False)
    channel = ControlChannel(path, receiver)
    send = (
        "import socket, sys\n"
        "socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto({!r}, sys.argv[1])"
    )
    try:
        for user, data in ((65534, b"pyrun-ctl 1 stop"), (0, b"pyrun-ctl 1 start")):
            command = ["/usr/bin/python3", "-c", send.format(data), path]
            subprocess.run(command, user=user, check=True)
        assert [data for data, _ in channel.receive()] == [b"pyrun-ctl 1 start"]
    finally:
        channel.close()
        shutil.rmtree(directory)


def test_a_failed_attach_says_why_in_one_line_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on CPython 3.14 when the target refuses (ptrace not allowed, remote debugging off):
    ``sys.remote_exec`` raises. One line, and neither the directory nor the script remains."""

    def refuse(pid: int, path: str) -> None:
        raise RuntimeError("Operation not permitted")

    monkeypatch.setattr(attaching, "remote_exec_missing", lambda: "")
    monkeypatch.setattr(sys, "remote_exec", refuse, raising=False)
    scripts = set(Path(control_directory()).glob("attach-*.py"))
    code = "import time; print('ready', flush=True); time.sleep(60)"
    target = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    out = tmp_path / "m"
    try:
        assert target.stdout is not None and target.stdout.readline() == "ready\n"
        status = pyrun_main(["attach", "-o", str(out), str(target.pid)])
    finally:
        target.kill()
        target.wait()
    said = capsys.readouterr().err
    assert status == 1 and said.count("\n") == 1, said
    assert said.startswith(
        f"pyrun attach: error: cannot attach to process {target.pid}: Operation not permitted"
    )
    assert not out.exists()
    assert set(Path(control_directory()).glob("attach-*.py")) == scripts

"""pyrun when things go wrong: fatal signals, a full disk, an output directory already in use.

The signal tests run the real ``pyrun`` console script in a child process, as a shell would, so
that its exit status (death by a signal) is what the test reads. Everything written is read back
with the format readers and ``verify`` (issue #15, items 4, 5 and 9).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyhpctk.cli.pyrun import main
from pyhpctk.formats.inspect import verify_path
from pyhpctk.measure.launch.launcher import MEASUREMENT_LOST, same_launch
from pyhpctk.measure.losses import LOST, WRITTEN, LossReport, tell_pyrun
from test_pyrun import LAUNCHER_VARIABLES, PROGRAMS, PYTHON, chain_under, read_measurements

PYRUN = str(Path(sys.executable).parent / "pyrun")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside any batch system or MPI launcher; some then simulate one."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _child_defaults() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT's default dumps core
    # the signals' defaults, even in a suite started with nohup or as a background job
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


def _start(out: Path, how: str) -> tuple[subprocess.Popen[str], int]:
    """pyrun the signals program (no checkpoint ever); return pyrun and the program's pid."""
    command = [PYRUN, "--checkpoint", "0", "-o", str(out), PYTHON, str(PROGRAMS / "signals.py")]
    pyrun = subprocess.Popen(
        [*command, how], stdout=subprocess.PIPE, text=True, preexec_fn=_child_defaults
    )
    assert pyrun.stdout is not None
    ready = pyrun.stdout.readline().split()
    assert ready[:1] == ["ready"], ready
    return pyrun, int(ready[1])


def _finish(pyrun: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = pyrun.communicate(timeout=60)
    return pyrun.returncode, output


SIGNALS = [signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR2]


@pytest.mark.parametrize("target", ["pyrun", "program"])
@pytest.mark.parametrize("signum", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_fatal_signal_leaves_the_measurement_and_pyrun_dies_of_it(
    tmp_path: Path, signum: signal.Signals, target: str
) -> None:
    # Before: HUP, USR1, QUIT and USR2 killed the program without writing anything (only
    # SIGTERM was caught), so a run shorter than the checkpoint interval lost everything.
    out = tmp_path / "m"
    pyrun, program = _start(out, "wait")
    os.kill(pyrun.pid if target == "pyrun" else program, signum)
    status, _ = _finish(pyrun)
    assert status == -signum  # pyrun died of the program's signal, as the program did
    assert verify_path(out).exit_code == 0
    (measured,) = read_measurements(out)
    assert measured.pid == program
    assert chain_under(measured, "| Main  ")[-3:] == ["func_hi", "func_mid", "func_lo"]
    assert measured.inclusive("func_lo", "CPUTIME (sec)") > 0.1


def test_the_programs_own_sigusr1_handler_runs_and_the_program_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "m"
    pyrun, _ = _start(out, "own_usr1")
    pyrun.send_signal(signal.SIGUSR1)  # passed on to the program by pyrun
    status, output = _finish(pyrun)
    assert (status, output) == (0, f"handled [{int(signal.SIGUSR1)}]\n")
    (measured,) = read_measurements(out)
    assert measured.inclusive("func_lo", "CPUTIME (sec)") > 0.15


def test_a_program_that_restores_the_default_dies_of_it_with_its_profile(
    tmp_path: Path,
) -> None:
    out = tmp_path / "m"
    pyrun, program = _start(out, "restored_usr1")
    os.kill(program, signal.SIGUSR1)
    status, _ = _finish(pyrun)
    assert status == -signal.SIGUSR1
    (measured,) = read_measurements(out)
    assert measured.inclusive("func_lo", "CPUTIME (sec)") > 0.1


def test_sigkill_of_the_program_makes_pyrun_die_of_sigkill(tmp_path: Path) -> None:
    # Before: pyrun exited with status 137 (it could not restore SIGKILL's default action).
    out = tmp_path / "m"
    pyrun, program = _start(out, "wait")
    os.kill(program, signal.SIGKILL)
    status, _ = _finish(pyrun)
    assert status == -signal.SIGKILL
    assert not out.exists()  # nothing was measured (no checkpoint): nothing is left behind


_SIGNAL_DURING_THE_EXIT_WRITE = """
import os, signal, threading, time
from pyhpctk.measure import hooks

session = hooks.current_session()
write_thread = session.writer.write
def write_and_be_signalled(state, data):  # the first write at exit gets SIGUSR2 halfway
    if threading.current_thread() is threading.main_thread() and not session.written:
        session.written = True
        os.kill(os.getpid(), signal.SIGUSR2)
        sum(range(1000))  # bytecodes: the handler runs here, inside pyrun's own writing
    write_thread(state, data)
session.written = False
session.writer.write = write_and_be_signalled
stop = threading.Event()
def spin():
    while not stop.is_set():
        sum(range(100))
for _ in range(2):
    threading.Thread(target=spin, daemon=True).start()
start = time.thread_time()
while time.thread_time() - start < 0.2:
    pass
"""


def test_a_signal_during_the_exit_write_waits_for_every_profile(tmp_path: Path) -> None:
    out = tmp_path / "m"
    command = [PYRUN, "-o", str(out), PYTHON, "-c", _SIGNAL_DURING_THE_EXIT_WRITE]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == -signal.SIGUSR2, done.stderr
    assert sorted(m.thread for m in read_measurements(out)) == [0, 1, 2]
    assert verify_path(out).exit_code == 0


# -- a full disk -------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a file system that fills up (mounting needs root, as CI has)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill_disk_then(free: int, status: int, threads: bool) -> str:
    """A program that fills the disk (leaving ``free`` bytes), runs call_chain, exits ``status``."""
    argv = ["call_chain.py", "0.1", *(["threads"] if threads else [])]
    return (
        "import os, runpy, sys\n"
        "from pyhpctk.measure.launch.config import MeasureOptions\n"
        "out = MeasureOptions.from_env(os.environ).output_dir\n"
        "filler = os.path.join(out, '..', 'filler')\n"
        "with open(filler, 'wb', buffering=0) as stream:\n"
        "    try:\n"
        "        while True: stream.write(b'x' * 1024)\n"
        "    except OSError: pass\n"
        f"os.truncate(filler, max(0, os.path.getsize(filler) - {free}))\n"
        f"sys.argv = {argv!r}\n"
        f"runpy.run_path({str(PROGRAMS / 'call_chain.py')!r}, run_name='__main__')\n"
        f"sys.exit({status})\n"
    )


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if ".tmp" in p.name)


def test_a_full_disk_names_the_lost_profiles_and_pyrun_fails(
    small_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Before: pyrun exited 0 and left empty temporary files in logical/ that verify refused.
    out = small_disk / "m"
    program = _fill_disk_then(free=16 * 1024, status=0, threads=True)
    assert main(["-o", str(out), PYTHON, "-c", program]) == MEASUREMENT_LOST
    err = capfd.readouterr().err
    assert "No space left on device" in err
    assert "pyrun: measurement lost: " in err and "exiting with status 74" in err
    lines = [line for line in err.splitlines() if line.startswith("  ")]
    lost = {line.split(":")[0].strip() for line in lines}
    written = {p.name for p in out.glob("*.hpcrun")}
    assert lost and written, (lost, written)  # room for some of the four threads, not all
    # four threads, four profiles: a thread whose final write takes long (the error path) is
    # not taken for a new thread by the engine's monitor while it ends (it was, 2 runs in 20)
    assert len(lost | written) == 4, (sorted(lost), sorted(written))
    # a profile written whole earlier (its thread's end) whose last rewrite failed is both:
    # its line says that the copy there ends early
    for line in lines:
        name = line.split(":")[0].strip()
        assert (name in written) == ("an earlier copy is there" in line), (line, written)
    assert all(name.endswith(".hpcrun") and name.startswith("python") for name in lost)
    assert _leftovers(small_disk) == []  # no temporary file, nothing partial
    assert verify_path(out).exit_code == 0  # what is there is whole


def test_the_programs_own_failure_comes_first_when_measurement_was_lost(
    small_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = small_disk / "m"
    program = _fill_disk_then(free=0, status=3, threads=False)
    assert main(["-o", str(out), PYTHON, "-c", program]) == 3
    err = capfd.readouterr().err
    assert "pyrun: measurement lost: 1 profile(s)" in err and "its exit status is passed on" in err
    assert not list(out.glob("*.hpcrun"))
    assert _leftovers(small_disk) == []


# -- an output directory already in use ----------------------------------------------------------


def _chain(*extra: str) -> list[str]:
    return [*extra, PYTHON, str(PROGRAMS / "call_chain.py"), "0.02"]


def test_an_existing_measurement_directory_is_refused_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the second run added its profile next to the first, and pyprof merged the two.
    out = tmp_path / "m"
    assert main(["-o", str(out), *_chain()]) == 0
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'w').close()"
    assert main(["-o", str(out), PYTHON, "-c", code]) == 2
    err = capsys.readouterr().err
    assert f"pyrun: error: {out} holds the measurements of another run" in err
    assert "--append" in err and "Traceback" not in err
    assert not ran.exists()  # refused before the command ran
    after = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    assert after == before


def test_a_directory_holding_other_files_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert main(["-o", str(out), *_chain()]) == 2
    assert "already holds files (notes.txt)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_an_empty_existing_directory_is_used_and_append_adds_a_run(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    assert main(["-o", str(out), *_chain()]) == 0
    assert len(read_measurements(out)) == 1
    assert main(["-o", str(out), *_chain("--append")]) == 0
    assert len({m.pid for m in read_measurements(out)}) == 2
    assert verify_path(out).exit_code == 0


@pytest.mark.parametrize(
    "launch",
    [
        {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"},  # srun: a launch id, rank SLURM_PROCID
        {"PMIX_NAMESPACE": "prterun-host-123@1"},  # Open MPI 5 / PMIx
        {},  # MPICH's hydra: only PMI_RANK; the ranks share their parent (the proxy)
    ],
    ids=["slurm", "pmix", "hydra"],
)
def test_the_ranks_of_one_launch_share_the_directory_and_the_next_launch_is_refused(
    tmp_path: Path, launch: dict[str, str]
) -> None:
    out = tmp_path / "m"
    rank_variable = "SLURM_PROCID" if "SLURM_JOB_ID" in launch else "PMI_RANK"
    if "PMIX_NAMESPACE" in launch:
        rank_variable = "PMIX_RANK"
    ranks = []
    for rank in range(3):  # started together, as a launcher starts them
        env = {**os.environ, **launch, rank_variable: str(rank)}
        ranks.append(
            subprocess.Popen([PYRUN, "-o", str(out), *_chain()], env=env, stderr=subprocess.PIPE)
        )
    for process in ranks:
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
    measured = read_measurements(out)
    assert sorted(int(m.profile.header("mpi-rank")) for m in measured) == [0, 1, 2]
    assert verify_path(out).exit_code == 0
    # The next launch (another job step, namespace or launcher process) is another run.
    if launch:
        key = next(iter(launch))
        launch = {**launch, key: launch[key] + "9"}
    else:
        launch = {"PMI_KVSNAME": "kvs_99"}  # hydra's name for the next launch, seen by pyrun
    env = {**os.environ, **launch, rank_variable: "0"}
    again = subprocess.run(
        [PYRUN, "-o", str(out), *_chain()], env=env, capture_output=True, text=True, check=False
    )
    assert again.returncode == 2
    assert "holds the measurements of another run" in again.stderr
    assert len(read_measurements(out)) == 3


@pytest.mark.parametrize(
    ("claim", "owner", "same"),
    [
        ("launch 77.0", "launch 77.0", True),
        ("launch 77.1", "launch 77.0", False),  # two srun steps of one job are two runs
        ("node 4242.pbs.100", "node 4242.pbs.200", True),  # hydra's nodes within one job
        ("node launch100", "node launch200", False),  # hydra outside a batch job: one node
        ("node 4242.pbs.100", "launch 4242.pbs.200", False),
        ("run 0bbfd16a-1-00", "run 0bbfd16a-2-00", False),
    ],
)
def test_which_claims_belong_to_one_launch(claim: str, owner: str, same: bool) -> None:
    assert same_launch(claim, owner) is same


def test_a_profile_written_after_a_failed_checkpoint_is_not_reported_lost() -> None:
    report = LossReport()
    address = report.listening  # what the measured processes find in their options
    try:
        tell_pyrun(address, LOST, "a.hpcrun", "No space left on device")
        tell_pyrun(address, LOST, "b.hpcrun", "Disk quota exceeded")
        tell_pyrun(address, WRITTEN, "a.hpcrun")  # the final write went through
    finally:
        lost = report.close()
    assert lost == {"b.hpcrun": "Disk quota exceeded"}

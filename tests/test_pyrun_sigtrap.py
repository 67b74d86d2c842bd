"""CPU samples through SIGTRAP (perf counters with ``sigtrap=1``), and the program's own SIGTRAP.

Asked for with ``PYHPCTK_PYRUN_CPU_TIMER=sigtrap`` (Linux 5.13 and later), the engine's
perf_events counters signal their thread with SIGTRAP (``si_code`` TRAP_PERF): the kernel runs
that as task work on the thread's way back to user space, with no interprocessor interrupt and
no ioctl per sample, which makes a sample cheaper on a virtual machine (benchmarks/RESULTS.md).
SIGTRAP is the program's too: a breakpoint, ``os.kill(pid, SIGTRAP)``, a handler of its own, or
one a C library installs behind Python's back (LLVM's crash recovery, which Triton's compiles
turn on: a sample reaching it fails the compile). By default the samples therefore come
through the engine's realtime signal and never touch SIGTRAP; that is tested first. Under the
``sigtrap`` route these tests hold the engine to leaving the program's SIGTRAP as it is without
pyrun:

- a SIGTRAP that is not one of the engine's reaches the disposition the program had (its
  default: the process dies of it; ignored by the parent: the process lives on);
- a handler the program sets with ``signal.signal`` gets its own SIGTRAPs, exactly, and none of
  the engine's: the engine's handler goes first again at once, passing on what is not a sample;
- a handler a C library sets behind Python's back gets at most a poll's worth of the engine's
  (the monitor notices within 100 ms and goes first again), and its own SIGTRAPs all along;
- a CPU sample (SIGTRAP) and a wall-clock sample (the realtime signal) of one thread never nest
  (each handler blocks the other signal): nested, they wrote one ring at once.

These tests run on CPython 3.11 (the suite) and on 3.12 and 3.13 (``make test-engine``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpctk.cli.pyrun import main as pyrun_main
from test_pyrun_engine import CPU, main_profile, read_profiles


def _kernel() -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or _kernel() < (5, 13), reason="SIGTRAP counters need Linux 5.13+"
)

WORK = """\
import json, os, signal, sys, time

def spin(seconds):
    stop = time.thread_time() + seconds
    while time.thread_time() < stop:
        sum(range(200))

def before(seconds):
    spin(seconds)

def after(seconds):
    spin(seconds)
"""

PYTHON_HANDLER = (
    WORK
    + """
got = []
before(0.4)
signal.signal(signal.SIGTRAP, lambda signum, frame: got.append(signum))
for _ in range(3):
    os.kill(os.getpid(), signal.SIGTRAP)
started = time.thread_time()
after(0.8)
json.dump({"calls": len(got), "after": time.thread_time() - started}, open(sys.argv[1], "w"))
"""
)

OWN_SIGTRAP = (
    WORK
    + """
before(0.3)
os.kill(os.getpid(), signal.SIGTRAP)
json.dump({"survived": True}, open(sys.argv[1], "w"))
"""
)

LIBRARY = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#ifndef TRAP_PERF
#define TRAP_PERF 6
#endif
static volatile long perf, other;
static void handler(int signo, siginfo_t *info, void *context) {
    (void)signo; (void)context;
    if (info->si_code == TRAP_PERF) perf++; else other++;
}
int take_sigtrap(void) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = handler;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    return sigaction(SIGTRAP, &action, 0);
}
long perf_signals(void) { return perf; }
long other_signals(void) { return other; }
"""

C_HANDLER = (
    WORK
    + """
import ctypes
lib = ctypes.CDLL(sys.argv[2])
lib.perf_signals.restype = lib.other_signals.restype = ctypes.c_long
before(0.4)
assert lib.take_sigtrap() == 0
for _ in range(2):
    os.kill(os.getpid(), signal.SIGTRAP)
started = time.thread_time()
after(1.0)
json.dump({"perf": lib.perf_signals(), "other": lib.other_signals(),
           "after": time.thread_time() - started}, open(sys.argv[1], "w"))
"""
)

SIGTRAP_ROUTE = {"PYHPCTK_PYRUN_CPU_TIMER": "sigtrap"}  # the route most tests here hold to account


def _measure(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    source: str,
    *args: str,
    env: dict[str, str] | None = None,
) -> tuple[int, dict[str, object], dict[str, int], Path]:
    """Run ``source`` under pyrun at 2 kHz of CPU time: its status, its truth, the engine's
    counts (``PYHPCTK_PYRUN_DEBUG``) and the measurement directory."""
    program, truth, out = tmp_path / "program.py", tmp_path / "truth.json", tmp_path / "m"
    program.write_text(source)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYHPCTK_PYRUN_DEBUG", "1")
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        status = pyrun_main(
            ["-e", "CPUTIME@500", "-o", str(out), sys.executable, str(program), str(truth), *args]
        )
    err = capfd.readouterr().err
    found = re.findall(r"pyrun: sampling engine in pid \d+: (.*)", err)
    assert found, (status, err)  # the process died before it could write its figures
    counts = {name: int(value) for name, value in re.findall(r"(\w+) (-?\d+)", found[0])}
    answer = json.loads(truth.read_text()) if truth.exists() else {}
    return status, answer, counts, out


@pytest.mark.parametrize("route", ["", "signal", "sigtrap"])
def test_samples_come_through_sigtrap_only_when_asked(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], route: str
) -> None:
    status, _, counts, out = _measure(
        tmp_path, capfd, WORK + "before(0.6)\n", env={"PYHPCTK_PYRUN_CPU_TIMER": route}
    )
    assert status == 0
    assert counts["sigtrap"] == (1 if route == "sigtrap" else 0), counts
    assert counts["misdelivered"] == 0 and counts["torn_records"] == 0, counts
    assert counts["bad_stacks"] <= counts["samples"] // 1000, counts  # engine.h: CPython's window
    main = main_profile(read_profiles(out))
    assert main.inclusive(CPU, "before") == pytest.approx(0.6, rel=0.1)


C_HANDLER_STRETCHES = (
    WORK
    + """
import ctypes
lib = ctypes.CDLL(sys.argv[2])
lib.perf_signals.restype = lib.other_signals.restype = ctypes.c_long

def stretch(seconds):
    spin(seconds)

before(0.3)
seen = []
for _ in range(10):
    assert lib.take_sigtrap() == 0  # behind Python's back, as LLVM's crash recovery does
    stretch(0.015)
    seen.append(lib.perf_signals() + lib.other_signals())
for _ in range(2):
    os.kill(os.getpid(), signal.SIGTRAP)
json.dump({"seen": seen, "perf": lib.perf_signals(), "other": lib.other_signals()},
          open(sys.argv[1], "w"))
"""
)


def _library(tmp_path: Path) -> Path:
    """LIBRARY built with cc into ``tmp_path``."""
    (tmp_path / "trap.c").write_text(LIBRARY)
    compiler = os.environ.get("CC", "cc")
    subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "trap.c", "-o", "libtrap.so"],
        cwd=tmp_path,
        check=True,
    )
    return tmp_path / "libtrap.so"


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="needs a C compiler")
def test_by_default_a_c_librarys_sigtrap_handler_gets_none_of_our_samples(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A C library takes SIGTRAP behind Python's back ten times, each followed by 15 ms of CPU
    (shorter than the monitor's poll, 20 to 100 ms, so the engine never gets first again in
    between): under the default route its handler, which counts every SIGTRAP, gets its own two
    and nothing else. Through SIGTRAP counters (the default before) it got the samples of each
    stretch until the monitor noticed: a Triton compile failed so (LLVM's crash recovery)."""
    library = _library(tmp_path)
    status, truth, counts, out = _measure(tmp_path, capfd, C_HANDLER_STRETCHES, str(library))
    assert status == 0
    assert truth["seen"] == [0] * 10 and truth["perf"] == 0, truth
    assert truth["other"] == 2, truth  # its own, exactly
    assert counts["sigtrap"] == 0, counts
    # ... while samples were taken all along: 150 ms at 2 kHz, about 300
    main = main_profile(read_profiles(out))
    assert main.inclusive(CPU, "stretch") == pytest.approx(0.15, rel=0.25)


@pytest.mark.parametrize("route", ["sigtrap", ""])
def test_a_handler_the_program_sets_gets_its_own_sigtraps_and_none_of_ours(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], route: str
) -> None:
    """Through SIGTRAP, and by default, where samples do not come through it (the handler must
    then be the program's own, not pyrun's stand-in waiting for SIGTRAPs the engine passes
    on)."""
    status, truth, counts, out = _measure(
        tmp_path, capfd, PYTHON_HANDLER, env={"PYHPCTK_PYRUN_CPU_TIMER": route}
    )
    assert status == 0
    assert truth["calls"] == 3  # 3 of its own; each sample of ours would be one more
    assert counts["sigtrap"] == (1 if route else 0), counts
    main = main_profile(read_profiles(out))
    assert main.inclusive(CPU, "before") == pytest.approx(0.4, rel=0.15)
    # ... and sampling went on after the move, as exactly
    after = float(truth["after"])  # type: ignore[arg-type]
    assert main.inclusive(CPU, "after") == pytest.approx(after, rel=0.1)


def test_a_sigtrap_of_the_program_kills_it_as_without_pyrun(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    program = tmp_path / "plain.py"
    program.write_text(OWN_SIGTRAP)
    plain = subprocess.run(
        [sys.executable, str(program), str(tmp_path / "plain.json")], capture_output=True
    )
    assert plain.returncode == -signal.SIGTRAP
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYHPCTK_PYRUN_CPU_TIMER", "sigtrap")
        status = pyrun_main(
            ["-e", "CPUTIME@500", "-o", str(tmp_path / "m"), sys.executable, str(program),
             str(tmp_path / "measured.json")]
        )  # fmt: skip
    assert status == 128 + signal.SIGTRAP
    assert not (tmp_path / "measured.json").exists()
    err = capfd.readouterr().err
    # pyrun names the signal, with what a checkpoint before it kept (from 0.25 s), or none
    assert "died of SIGTRAP (signal 5); kept 1 profile" in err or "killed by SIGTRAP" in err


def test_a_sigtrap_the_parent_ignores_stays_ignored(tmp_path: Path) -> None:
    """An ignored disposition is inherited across exec: the engine's handler must pass the
    program's own SIGTRAP on to it (ignored), not to the default action."""
    program = tmp_path / "program.py"
    program.write_text(OWN_SIGTRAP)
    done = subprocess.run(
        [sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", "CPUTIME@500", "-o",
         str(tmp_path / "m"), sys.executable, str(program), str(tmp_path / "truth.json")],
        capture_output=True,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGTRAP, signal.SIG_IGN),
        env={**os.environ, "PYHPCTK_PYRUN_DEBUG": "1", **SIGTRAP_ROUTE},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "truth.json").read_text()) == {"survived": True}
    assert "sigtrap 1" in done.stderr, done.stderr  # the route under test was taken


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="needs a C compiler")
def test_a_handler_a_c_library_sets_gets_at_most_a_polls_worth_of_ours(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    library = _library(tmp_path)
    status, truth, counts, out = _measure(
        tmp_path, capfd, C_HANDLER, str(library), env=SIGTRAP_ROUTE
    )
    assert status == 0
    assert truth["other"] == 2  # its own, exactly
    # the monitor looks every 20 to 100 ms of wall-clock time: at 2 kHz that is about 200
    # samples of ours, more where the monitor waits for a CPU (CI ran 258 with two tests on
    # its 2 CPUs); 1 s of CPU time after the library took SIGTRAP is 2,000 if nobody noticed
    assert int(truth["perf"]) <= 500, truth  # type: ignore[call-overload]
    assert counts["sigtrap"] == 1, counts
    main = main_profile(read_profiles(out))
    after = float(truth["after"])  # type: ignore[arg-type]
    assert main.inclusive(CPU, "after") >= 0.75 * after, (main.inclusive(CPU, "after"), after)


NESTING = """\
import json, sys, threading, time

def spin(seconds):
    stop = time.thread_time() + seconds
    while time.thread_time() < stop:
        sum(range(200))

workers = [threading.Thread(target=spin, args=(1.0,)) for _ in range(2)]
for worker in workers:
    worker.start()
spin(1.0)
for worker in workers:
    worker.join()
json.dump({}, open(sys.argv[1], "w"))
"""


def test_cpu_and_wall_samples_of_a_thread_never_nest(tmp_path: Path) -> None:
    """CPUTIME and REALTIME at 5 kHz on three busy threads: about 1 % of the CPU samples' handlers
    would be interrupted by a wall-clock sample, and two handlers writing one ring at once left
    a record of length 0 that the drain looped on for ever (the stress test hung so)."""
    program = tmp_path / "program.py"
    program.write_text(NESTING)
    done = subprocess.run(
        [sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", "CPUTIME@200", "-e", "REALTIME@200",
         "-o", str(tmp_path / "m"), sys.executable, str(program), str(tmp_path / "truth.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYHPCTK_PYRUN_DEBUG": "1", **SIGTRAP_ROUTE},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = re.findall(r"pyrun: sampling engine in pid \d+: (.*)", done.stderr)
    assert found, done.stderr
    counts = {name: int(value) for name, value in re.findall(r"(\w+) (-?\d+)", found[0])}
    # Nested handlers wrote records of length 0 (torn); a frame chain that fails its checks is
    # something else: 3.12 enters the eval loop with its cframe's current frame unset for a
    # few instructions, and a sample there is dropped (engine.h, bad_stacks).
    assert counts["sigtrap"] == 1 and counts["torn_records"] == 0, counts
    assert counts["bad_stacks"] <= counts["samples"] // 1000, counts
    profiles = read_profiles(tmp_path / "m")  # every record read back, every profile verified
    total = sum(profile.total(CPU) for profile in profiles)
    assert total == pytest.approx(3.0, rel=0.1), total


SWITCHING = """\
import json, os, signal, sys, threading, time

def spin(seconds):
    stop = time.thread_time() + seconds
    while time.thread_time() < stop:
        sum(range(200))

got = []
def handler(signum, frame):
    got.append(signum)

workers = [threading.Thread(target=spin, args=(1.0,)) for _ in range(3)]
for worker in workers:
    worker.start()
asked = []
for i in range(3000):
    signal.signal(signal.SIGTRAP, handler if i % 2 else signal.SIG_DFL)
    asked.append(signal.getsignal(signal.SIGTRAP) is (handler if i % 2 else signal.SIG_DFL))
signal.signal(signal.SIGTRAP, signal.SIG_IGN)
asked.append(signal.getsignal(signal.SIGTRAP) is signal.SIG_IGN)
try:
    signal.signal(signal.SIGTRAP, 5)
except TypeError:
    asked.append(True)  # what Python says to a handler that is none
else:
    asked.append(False)
os.kill(os.getpid(), signal.SIGTRAP)  # ignored, as asked
signal.signal(signal.SIGTRAP, handler)
for worker in workers:
    worker.join()
for _ in range(3):
    os.kill(os.getpid(), signal.SIGTRAP)
spin(0.05)  # the handler runs between two bytecodes
json.dump({"calls": len(got), "asked": all(asked)}, open(sys.argv[1], "w"))
"""


def test_switching_the_programs_sigtrap_disposition_under_sampling_loses_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """3,000 switches between a handler and SIG_DFL while three threads are sampled at 2 kHz:
    between CPython's sigaction and the engine's handler going first again, a sample's SIGTRAP
    reached the program's disposition (a handler called once too often, or SIG_DFL's core
    dump); pyrun now holds SIG_IGN or a handler that runs the program's only for SIGTRAPs the
    engine passed on."""
    status, truth, counts, _ = _measure(tmp_path, capfd, SWITCHING, env=SIGTRAP_ROUTE)
    assert status == 0
    assert truth["calls"] == 3 and truth["asked"] is True, truth
    assert counts["sigtrap"] == 1 and counts["samples"] > 1000, counts


TRITON_LOOP = """\
import json, sys
sys.path.insert(0, sys.argv[2])
import triton_counted

failures = []
for _ in range(40):
    try:
        triton_counted.compile_counted("trips")
    except Exception as error:
        failures.append(f"{type(error).__name__}: {str(error)[:300]}")
json.dump({"failures": failures}, open(sys.argv[1], "w"))
"""


def test_triton_compiles_under_pyrun_by_default(tmp_path: Path) -> None:
    """Triton sets a crash reproducer on every MLIR pass manager it runs, which turns on LLVM's
    crash recovery: LLVM installs its own SIGTRAP handler (with SIGSEGV's, SIGABRT's...) behind
    Python's back. A sample's SIGTRAP reaching it before the monitor put the engine's handler
    first again failed the compile ("A signal was caught while processing the MLIR module",
    ``PassManager::run failed``) or killed the process. Under the default route no sample is a
    SIGTRAP. 40 compiles of ``trips`` for sm_90 (no GPU needed) at 5 kHz of CPU time: with
    SIGTRAP counters the default, 3 of 3 runs of this loop died of SIGTRAP on the development VM,
    and 1 of 3 processes of 10 compiles at 1 kHz failed a compile (3 of 3 on an H100 machine)."""
    pytest.importorskip("triton")
    program, truth = tmp_path / "compile_loop.py", tmp_path / "truth.json"
    program.write_text(TRITON_LOOP)
    done = subprocess.run(
        [sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", "CPUTIME@200", "-o",
         str(tmp_path / "m"), sys.executable, str(program), str(truth),
         str(Path(__file__).parent / "data" / "ptx")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_ALWAYS_COMPILE": "1", "TRITON_DEFAULT_FP_FUSION": "1",
             "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")},
    )  # fmt: skip
    assert "signal was caught" not in done.stderr + done.stdout, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(truth.read_text()) == {"failures": []}
    profiles = read_profiles(tmp_path / "m")
    assert sum(profile.total(CPU) for profile in profiles) > 0.5  # sampled all along


OWN_THREADS_MASKS = """
import json, os, sys, time
from pyhpctk.measure.gpu import simulated_runtime

gpu = simulated_runtime()  # pyrun's GPU threads too
gpu.launch()
gpu.synchronize()
time.sleep(0.3)
masks = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as comm, open(f"/proc/self/task/{tid}/status") as st:
        blocked = next(line for line in st if line.startswith("SigBlk:")).split()[1]
        masks[f"{comm.read().strip()} {tid}"] = int(blocked, 16)
json.dump(masks, open(sys.argv[1], "w"))
"""


def test_pyruns_own_threads_leave_the_programs_signals_to_its_threads(tmp_path: Path) -> None:
    """A signal sent to the process goes to a thread that does not block it. One of pyrun's
    took the program's SIGTRAP now and then (its handler then ran later in the main thread, and
    a second SIGTRAP sent meanwhile merged with it: a program counted two of its three): each of
    pyrun's threads blocks every signal but a fault's."""
    program, truth, out = tmp_path / "masks.py", tmp_path / "masks.json", tmp_path / "m"
    program.write_text(OWN_THREADS_MASKS)
    command = ["-e", "gpu=simulated", "-o", str(out), sys.executable, str(program), str(truth)]
    assert pyrun_main(command) == 0
    masks = json.loads(truth.read_text())
    own = {name: mask for name, mask in masks.items() if name.startswith("pyrun-")}
    assert len(own) >= 3, masks  # the sampling thread, the GPU monitor and its tracer

    def bit(signum: int) -> int:
        return 1 << (signum - 1)

    for name, mask in own.items():
        for signum in (signal.SIGTRAP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            assert mask & bit(signum), (name, signum, hex(mask))
        if not name.startswith("pyrun-monitor"):  # (the engine's C thread blocks them all)
            assert not mask & bit(signal.SIGSEGV), (name, hex(mask))  # a crash is reported
    program_threads = [mask for name, mask in masks.items() if not name.startswith("pyrun-")]
    assert any(not mask & bit(signal.SIGTRAP) for mask in program_threads), masks

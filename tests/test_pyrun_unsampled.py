"""The process's CPU time that no profile holds is counted and told (issue #16, item 3).

Native threads Python never started are found by the engine's monitor, which looks every 20 to
100 ms: a thread that lives less than that may end unseen, and its CPU time is then in no
profile. A C library built here (gcc) starts threads one after the other, each burning a few ms
of CPU time, and returns the sum of their own CPU clocks read at their ends: what the profiles
of those threads miss is known, and pyrun must say about as much on stderr; threads of 100 ms
that replace each other (their number never moves) must all be found. A program whose
threads all live long (Python threads, an OpenBLAS pool) must hear nothing. The engine's figures
are read from the counts ``PYHPCTK_PYRUN_DEBUG=1`` prints at exit.

These tests run on CPython 3.11 (the suite) and on 3.12 and 3.13 (``make test-engine``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.formats import hpcrun
from pyhpctk.measure.sampling.engine import ENV_SAMPLER

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="the library needs gcc")

CPU = "CPUTIME (sec)"

LIBRARY = r"""
#include <pthread.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *burn(void *arg) {
    double until = now() + *(double *)arg;
    volatile double sink = 0;
    while (now() < until)
        for (int i = 0; i < 1000; i++) sink += i;
    *(double *)arg = now(); /* the thread's CPU time, at its end */
    return 0;
}

/* `count` threads one after the other, each burning `seconds` of CPU: their CPU time. */
double bursts(int count, double seconds) {
    double total = 0;
    for (int i = 0; i < count; i++) {
        pthread_t thread;
        double value = seconds;
        if (pthread_create(&thread, 0, burn, &value) != 0) return -1;
        pthread_join(thread, 0);
        total += value;
    }
    return total;
}
"""

BURSTS = """\
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.bursts.restype = ctypes.c_double
lib.bursts.argtypes = [ctypes.c_int, ctypes.c_double]
count, seconds = int(sys.argv[2]), float(sys.argv[3])
json.dump({"native_cpu": lib.bursts(count, seconds)}, open(sys.argv[4], "w"))
"""

LONG_LIVED = """\
import json, sys, threading, time
import numpy

def spin(seconds):
    stop = time.thread_time() + seconds
    while time.thread_time() < stop:
        sum(range(1000))

threads = [threading.Thread(target=spin, args=(0.4,)) for _ in range(2)]
for thread in threads:
    thread.start()
a = numpy.random.default_rng(1).random((300, 300))
stop = time.thread_time() + 0.4
while time.thread_time() < stop:
    a @ a
for thread in threads:
    thread.join()
json.dump({}, open(sys.argv[1], "w"))
"""

LINE = re.compile(
    r"pyrun: (\d+\.\d+) s of the (\d+\.\d+) s of CPU time this process used while measured"
    r" \((\d+) %\) is in no profile"
)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("bursts")
    (where / "bursts.c").write_text(LIBRARY)
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "bursts.c", "-o", "libbursts.so", "-lpthread"],
        cwd=where,
        check=True,
    )
    return where / "libbursts.so"


def _measure(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    source: str,
    event: str,
    *args: str,
    sampler: str = "",
) -> tuple[dict[int, float], dict[str, float], str, dict[str, int]]:
    """Run ``source`` under pyrun: CPU time per thread's profile, the program's truth, pyrun's
    stderr and the engine's counts (none with ``sampler="thread"``, the Python sampler)."""
    program, truth, out = tmp_path / "program.py", tmp_path / "truth.json", tmp_path / "m"
    program.write_text(source)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENBLAS_NUM_THREADS", "2")
        patch.setenv("PYHPCTK_PYRUN_DEBUG", "1")
        patch.setenv(ENV_SAMPLER, sampler)
        status = pyrun_main(
            ["-e", event, "-o", str(out), sys.executable, str(program), *args, str(truth)]
        )
    assert status == 0
    err = capfd.readouterr().err
    counts: dict[str, int] = {}
    if sampler != "thread":
        (debug,) = re.findall(r"pyrun: sampling engine in pid \d+: (.*)", err)
        counts = {name: int(value) for name, value in re.findall(r"(\w+) (-?\d+)", debug)}
    per_thread: dict[int, float] = {}
    for path in out.glob("*.hpcrun"):
        profile = hpcrun.read(path)
        names = [metric.name for metric in profile.metrics]
        _, metrics, values = profile.decoded_values()
        per_thread[int(profile.header("thread-id"))] = sum(
            float(value)
            for metric, value in zip(metrics, values, strict=True)
            if names[int(metric)] == CPU
        )
    return per_thread, json.loads(truth.read_text()), err, counts


def test_short_native_threads_cpu_time_is_told_about_as_much_as_the_profiles_miss(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], library: Path
) -> None:
    per_thread, truth, err, counts = _measure(
        tmp_path, capfd, BURSTS, "CPUTIME@1000", str(library), "200", "0.005"
    )
    native = truth["native_cpu"]
    assert native == pytest.approx(1.0, rel=0.05), native
    # what the profiles of the native threads miss (thread 0 is the main thread, which only
    # waits in pthread_join): the premise of the test is that the monitor misses some
    missed = native - sum(cpu for thread, cpu in per_thread.items() if thread != 0)
    assert missed > 0.2, (missed, per_thread)
    # the engine's split: what the records carry is exactly what the profiles hold
    assert counts["cpu_sampled_ns"] * 1e-9 == pytest.approx(sum(per_thread.values()), abs=1e-3)
    unsampled = counts["cpu_unsampled_ns"] * 1e-9
    assert unsampled == pytest.approx(missed, abs=0.03 + 0.05 * missed), (unsampled, missed)
    assert counts["cpu_pyrun_threads_ns"] > 0  # the monitor and the drain, never "lost"
    # ... and told once, with the figures
    (told,) = LINE.findall(err)
    assert float(told[0]) == pytest.approx(unsampled, abs=0.006)
    assert float(told[1]) == pytest.approx(counts["cpu_process_ns"] * 1e-9, abs=0.006)
    assert float(told[1]) >= native


def test_native_threads_replaced_one_by_one_are_found(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], library: Path
) -> None:
    """Ten threads of 100 ms, each started as the last one ends: the number of threads never
    moves, yet each is found within a poll (listing the threads only when their number changed
    missed half of their time)."""
    per_thread, truth, err, counts = _measure(
        tmp_path, capfd, BURSTS, "CPUTIME@1000", str(library), "10", "0.1"
    )
    native = truth["native_cpu"]
    assert native == pytest.approx(1.0, rel=0.05), native
    found = sum(cpu for thread, cpu in per_thread.items() if thread != 0)
    assert len(per_thread) >= 11, per_thread
    assert found > 0.85 * native, (found, native, per_thread)
    assert counts["cpu_unsampled_ns"] * 1e-9 < 0.15 * native, counts
    assert not LINE.findall(err), err


def test_with_wall_clock_events_only_no_cpu_time_is_said_to_be_missing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], library: Path
) -> None:
    """No thread's CPU time is sampled then, so none is missing from a CPU profile."""
    _, truth, err, counts = _measure(
        tmp_path, capfd, BURSTS, "REALTIME@1000", str(library), "50", "0.02"
    )
    assert truth["native_cpu"] > 0.5
    assert not LINE.findall(err), err
    assert "cpu_unsampled_ns" not in counts


SHORT_PYTHON_THREADS = """\
import json, sys, threading

def little():
    sum(range(2000))

for _ in range(300):
    thread = threading.Thread(target=little)
    thread.start()
    thread.join()
json.dump({}, open(sys.argv[1], "w"))
"""


def test_short_python_threads_files_are_pyruns_time_not_lost(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """300 Python threads of a moment each: every one is found (pyrun's thread hook), and what
    each spends after its last sample writing its own profile is pyrun's work, not the
    program's time in no profile (it was, and the line said so: 50-80 % of the process's CPU)."""
    per_thread, _, err, counts = _measure(tmp_path, capfd, SHORT_PYTHON_THREADS, "CPUTIME@1000")
    assert len(per_thread) >= 250, len(per_thread)
    assert not LINE.findall(err), err
    process = counts["cpu_process_ns"]
    assert counts["cpu_unsampled_ns"] < 0.2 * process, counts
    assert counts["cpu_pyrun_threads_ns"] > counts["cpu_unsampled_ns"], counts


SLOW_STARTS = """\
import json, sys, threading, time

def burn(seconds):
    stop = time.thread_time() + seconds
    while time.thread_time() < stop:
        sum(range(100))

class SlowStart(threading.Thread):
    # CPU time a thread spends before pyrun's hook (threading's _bootstrap): the program's
    def _bootstrap(self):
        burn(0.03)
        self.before = time.thread_time()
        super()._bootstrap()

    def run(self):
        burn(0.0005)

before = 0.0
for _ in range(8):
    thread = SlowStart()
    thread.start()
    thread.join()
    before += thread.before
json.dump({"before": before}, open(sys.argv[1], "w"))
"""


def test_a_threads_time_before_the_thread_hook_is_in_its_profile(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Eight threads that each spend 30 ms of CPU before pyrun's thread hook runs: that is the
    program's time, and each thread's profile holds it (its first record carries it); what the
    hook itself spends is pyrun's. It was in no profile, and the line said so."""
    per_thread, truth, err, counts = _measure(tmp_path, capfd, SLOW_STARTS, "CPUTIME@1000")
    assert truth["before"] > 0.24, truth
    threads = {number: cpu for number, cpu in per_thread.items() if number != 0}
    assert len(threads) == 8, per_thread
    # each profile holds the thread's 30 ms and its short run
    for cpu in threads.values():
        assert 0.029 < cpu < 0.045, threads
    assert not LINE.findall(err), err
    assert counts["cpu_unsampled_ns"] < 0.03 * counts["cpu_process_ns"], counts


def test_the_python_sampler_also_puts_a_threads_start_in_its_profile(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Where the engine is not built (an interpreter it does not know), the Python sampler
    thread measures: its first sample of a thread carries the thread's time before the hook
    too (it started counting at the hook: 30 ms of each of these threads were in no profile)."""
    per_thread, truth, _, _ = _measure(
        tmp_path, capfd, SLOW_STARTS, "CPUTIME@1000", sampler="thread"
    )
    assert truth["before"] > 0.24, truth
    threads = {number: cpu for number, cpu in per_thread.items() if number != 0}
    assert len(threads) == 8, per_thread
    for cpu in threads.values():
        assert 0.029 < cpu < 0.045, threads


def test_long_lived_python_and_blas_threads_leave_no_cpu_time_out(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    per_thread, _, err, counts = _measure(tmp_path, capfd, LONG_LIVED, "CPUTIME@1000")
    assert len(per_thread) >= 4, per_thread  # main, two Python threads, an OpenBLAS thread
    assert not LINE.findall(err), err
    process = counts["cpu_process_ns"]
    assert process * 1e-9 > 1.0, counts
    # all but pyrun's own threads is sampled: at most what thread starts and ends leave
    # (a thread's start before its hook, its end after its last sample), never a sizeable
    # negative (pyrun's own threads counted twice)
    unsampled = counts["cpu_unsampled_ns"]
    assert -0.01 * process < unsampled < 0.03 * process, counts

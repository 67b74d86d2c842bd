"""Stress pyrun's sampling engine: RUNS runs of tests/programs/engine_stress.py under pyrun.

Each run samples a program that starts THREADS short threads in waves while other threads
dlopen/dlclose a C library in a loop (and run its loop in between), import fresh extension
modules (each a new dlopen), throw and catch C++ exceptions through 20 native frames in a loop
(libgcc's unwinder at work while the engine unwinds the same stack from its handler), fork
children that are measured too, and signal the process (SIGUSR1, SIGALRM), with CPUTIME,
REALTIME and GILWAIT at 1 kHz and native frames on (pyrun's default: every sample unwinds the
native stack, issue #17). A run passes when the program exits 0 within TIMEOUT seconds,
prints ``stress ok``, every profile it wrote passes ``pyhpctk verify``, and no process's engine
found a torn record (``torn_records``, printed with ``PYHPCTK_PYRUN_DEBUG=1``). On a timeout the
stacks of the process tree are dumped with ``py-spy dump --pid PID --native`` (where py-spy is
on ``PATH`` or beside the interpreter: ``pip install py-spy``; it is no dependency), with each
thread's kernel state, before the tree is killed.

    nice -n 10 python benchmarks/engine_stress.py --runs 1000      # the full stress (minutes)
    python benchmarks/engine_stress.py --runs 1000 --jobs 16        # on 16 cores
    python benchmarks/engine_stress.py --runs 3                     # what the test suite runs

``--jobs N`` runs N at once, each in a directory of its own (its measurement and its working
directory; the C pieces are shared, read only); the progress line every 50 runs counts the
runs finished, and a failed run's line names its number. The last line sums up (runs, failed,
hung, seconds, jobs, the measured Python, CPUs). ``--out DIR`` (a new or empty directory)
keeps ``runs.tsv`` (each run: passed, failed or hung, and its seconds), ``runN.log`` for each
run that failed (with the stacks of one that hung) and ``summary.txt``. Standard library only
(and pyhpctk): it runs on machines without internet.

    python benchmarks/engine_stress.py --runs 1000 --jobs 16 --out stress-logs

The C pieces (``looper.so``, ``thrower.so``, ``fresh*/fresh.so``) are built with the C and C++
compilers (``cc``, ``c++``) and this interpreter's headers into a temporary directory. Without a
C++ compiler ``thrower.so`` is built from C with setjmp/longjmp (the nearest C-level non-local
exit through native frames), and the script says so.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HUNG = "hung"  # how a run that timed out is told
PROGRAM = REPO / "tests" / "programs" / "engine_stress.py"
LOOPER = (
    "long looper(long n) { volatile long x = 0; for (long i = 0; i < n; i++) x++; return x; }\n"
)
THROWER = """#include <stdexcept>
static int __attribute__((noinline)) deep(int n) {
    if (n == 0) throw std::runtime_error("deep");
    return deep(n - 1) + 1;
}
extern "C" long thrower(long times) {
    long caught = 0;
    for (long i = 0; i < times; i++) {
        try { deep(20); } catch (const std::exception &) { caught++; }
    }
    return caught;
}
"""
THROWER_C = """#include <setjmp.h>
static jmp_buf target;
static int __attribute__((noinline)) deep(int n) {
    if (n == 0) longjmp(target, 1);
    return deep(n - 1) + 1;
}
long thrower(long times) {
    volatile long caught = 0;
    for (long i = 0; i < times; i++) if (setjmp(target)) caught++; else deep(20);
    return caught;
}
"""
FRESH = """#include <Python.h>
static PyObject *answer(PyObject *m, PyObject *a) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {0}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "fresh", "", -1, methods};
PyMODINIT_FUNC PyInit_fresh(void) { return PyModule_Create(&def); }
"""


def build(directory: Path, fresh: int) -> None:
    """looper.so and `fresh` copies of an extension module, each in a directory of its own."""
    compiler = os.environ.get("CC", "cc")
    (directory / "looper.c").write_text(LOOPER)
    subprocess.run(
        [
            compiler,
            "-O1",
            "-shared",
            "-fPIC",
            "-o",
            str(directory / "looper.so"),
            str(directory / "looper.c"),
        ],
        check=True,
    )
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx):
        (directory / "thrower.cc").write_text(THROWER)
        source, builder = directory / "thrower.cc", cxx
    else:
        print(f"no C++ compiler ({cxx}): thrower.so uses setjmp/longjmp instead of exceptions")
        (directory / "thrower.c").write_text(THROWER_C)
        source, builder = directory / "thrower.c", compiler
    thrower = [builder, "-O2", "-shared", "-fPIC", "-o", str(directory / "thrower.so")]
    subprocess.run([*thrower, str(source)], check=True)
    (directory / "fresh.c").write_text(FRESH)
    include = sysconfig.get_paths()["include"]
    built = directory / "fresh.so"
    subprocess.run(
        [
            compiler,
            "-O1",
            "-shared",
            "-fPIC",
            f"-I{include}",
            "-o",
            str(built),
            str(directory / "fresh.c"),
        ],
        check=True,
    )
    for index in range(fresh):
        copy = directory / f"fresh{index:03d}"
        copy.mkdir()
        shutil.copy(built, copy / "fresh.so")


def descendants(pid: int) -> list[int]:
    found = [pid]
    for parent in found:
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    found += [int(child) for child in children.read().split()]
        except OSError:
            continue
    return found


def dump_and_kill(process: subprocess.Popen[bytes]) -> str:
    """The native and Python stacks of every process of the tree (py-spy), then SIGKILL."""
    pids = descendants(process.pid)
    dumps = []
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    for pid in pids:
        if os.path.exists(py_spy):
            done = subprocess.run(
                [py_spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True
            )
            dumps.append(f"--- pid {pid}\n{done.stdout}{done.stderr}")
        else:
            dumps.append(f"--- pid {pid}: py-spy not installed, no stack dump")
        dumps.append(kernel_side(pid))
    for pid in reversed(pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
    return "\n".join(dumps)


def kernel_side(pid: int) -> str:
    """Each thread's name, state and where it sleeps in the kernel (wchan, and its kernel stack
    where /proc allows): a hang inside a system call shows there, not in py-spy's stacks."""
    lines = [f"--- pid {pid}, threads in the kernel:"]
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            base = f"/proc/{pid}/task/{tid}"
            fields = []
            for name in ("comm", "wchan", "stack"):
                try:
                    with open(f"{base}/{name}") as stream:
                        text = stream.read().strip()
                except OSError:
                    continue
                fields.append(text.replace("\n", " <- ") if name == "stack" else text)
            with contextlib.suppress(OSError, IndexError), open(f"{base}/stat") as stream:
                fields.insert(1, stream.read().rsplit(")", 1)[1].split()[0])
            lines.append(f"  {tid}: " + " | ".join(fields))
    return "\n".join(lines)


def run_once(
    directory: Path, run: int, threads: int, timeout: float, python: str
) -> tuple[int, str, float]:
    """Run number ``run``: (``run``, '' when it passed or else what went wrong, seconds). It
    runs in a directory of its own under ``directory`` (its working directory, holding its
    measurement ``m``), removed after."""
    own = directory / f"run{run}"
    own.mkdir()
    began = time.monotonic()
    try:
        return run, _run_in(own, directory, threads, timeout, python), time.monotonic() - began
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _run_in(own: Path, directory: Path, threads: int, timeout: float, python: str) -> str:
    from pyhpctk.formats.inspect import verify_path

    out = own / "m"
    pyrun = [sys.executable, "-m", "pyhpctk.cli.pyrun"]
    events = ["-e", "CPUTIME@1000", "-e", "REALTIME@1000", "-e", "GILWAIT@1000"]
    command = [*pyrun, *events, "-o", str(out), python, str(PROGRAM), str(directory), str(threads)]
    env = dict(os.environ, PYHPCTK_PYRUN_DEBUG="1")  # every process's engine counts at exit
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=own
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{HUNG} after {timeout} s; stacks:\n{dump_and_kill(process)}"
    text = output.decode(errors="replace")
    if process.returncode != 0 or "stress ok" not in text:
        return f"exit status {process.returncode}:\n{text}"
    torn = [int(n) for n in re.findall(r"torn_records (\d+)", text)]
    if not torn or any(torn):  # records no handler wrote whole: two writers in one ring
        return f"torn records {torn}:\n{text}"
    verdict = verify_path(out)
    if verdict.exit_code != 0:
        return f"pyhpctk verify failed:\n{verdict}"
    return ""


class Logs:
    """What ``--out`` keeps: ``runs.tsv`` (a line a run: number, passed/failed/hung, seconds),
    ``runN.log`` (what went wrong in run N, its stacks if it hung) and ``summary.txt``."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        if directory is not None:
            (directory / "runs.tsv").write_text("run\tresult\tseconds\n")

    def run(self, run: int, problem: str, seconds: float) -> None:
        if self.directory is None:
            return
        result = "passed" if not problem else "hung" if problem.startswith(HUNG) else "failed"
        with open(self.directory / "runs.tsv", "a") as stream:
            stream.write(f"{run}\t{result}\t{seconds:.1f}\n")
        if problem:
            (self.directory / f"run{run}.log").write_text(problem + "\n")

    def summary(self, line: str) -> None:
        if self.directory is not None:
            (self.directory / "summary.txt").write_text(line + "\n")


def output_directory(parser: argparse.ArgumentParser, out: str | None) -> Path | None:
    """``--out``, created; one that holds files is refused (nothing is overwritten)."""
    if out is None:
        return None
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if any(path.iterdir()):
            parser.error(f"--out {out}: the directory holds files already; give a new one")
    except OSError as error:
        parser.error(f"--out {out}: {error.strerror or error}")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--python", default=sys.executable, help="the measured interpreter")
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once, each in its own directory (default 1)"
    )
    parser.add_argument(
        "--out", help="a new directory for the logs: runs.tsv, runN.log of each failed run"
    )
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if os.sep in args.python:  # each run starts in a directory of its own
        args.python = os.path.abspath(args.python)
    logs = Logs(output_directory(parser, args.out))
    failures = hung = done = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pyhpctk-stress-") as temporary:
        directory = Path(temporary)
        build(directory, fresh=10)
        # Processes, not threads: a run's verify is Python work that would wait for one GIL.
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            pending = [
                pool.submit(run_once, directory, run, args.threads, args.timeout, args.python)
                for run in range(1, args.runs + 1)
            ]
            for future in concurrent.futures.as_completed(pending):
                run, problem, seconds = future.result()
                done += 1
                logs.run(run, problem, seconds)
                if problem:
                    failures += 1
                    hung += problem.startswith(HUNG)
                    print(f"run {run}: {problem}", flush=True)
                if done % 50 == 0 or done == args.runs:
                    elapsed = time.monotonic() - started
                    print(f"{done} runs, {failures} failed, {elapsed:.0f} s", flush=True)
    elapsed = time.monotonic() - started
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    summary = (
        f"engine_stress: {args.runs} runs, {failures} failed ({hung} hung), {elapsed:.0f} s,"
        f" {args.jobs} at once, {args.threads} threads a run, Python {version or args.python},"
        f" {os.cpu_count()} CPUs"
    )
    print(summary, flush=True)
    logs.summary(summary)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

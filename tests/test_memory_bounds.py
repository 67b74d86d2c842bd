"""Memory that does not grow with the input: ``pyhpctk verify`` and ``pyprof`` (issue #32, item 2).

verify needed about 3x the database in memory, pyprof 3.3x the measurement (a whole transpose
of profile.db held at once; every page of the mapped files kept; each cct.db round keeping
every profile's whole context index alive). Here both run in a child process on a generated
measurement (benchmarks/pyprof.py's generator, 40 MB) and its database, and the child's peak
resident memory (``ru_maxrss`` from ``wait4``), less that of a child that only imports what
they import, must stay well under the input's size. verify runs with its budgets made small
(the pages a reader keeps mapped, the values transposed at a time), so that a small database
shows what a large one would with the default budgets. Short of memory for one unit of work,
pyprof says so in one line; a MemoryError anywhere is one line, never a traceback.
"""

from __future__ import annotations

import os
import resource
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from measurement_helpers import benchmark_module
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli import main as pyhpctk_main
from pyhpctk.cli import pyprof as pyprof_cli
from pyhpctk.formats import cctdb

#: Timing-sensitive (the samplers' accuracy, memory peaks): run alone, after the parallel tests
#: (Makefile: unit), so that the other worker's load does not decide them.
pytestmark = pytest.mark.timing

RUNS = 3  # runs of each capped pyprof: the least peak of them is compared
CAP = 3 << 30  # the children's address space: a runaway child fails instead of swapping

# Each child runs under the budgets given here, where the code has them (imported by name, so
# that the same child runs code without them), and writes its peak resident memory (VmHWM: its
# own, where ru_maxrss would count the forked test process's too) to stderr's last line.
CHILD = """\
import atexit, importlib, sys

def peak():
    with open("/proc/self/status") as status:
        hwm = next(line for line in status if line.startswith("VmHWM:"))
    sys.stderr.write(f"\\npeak {{int(hwm.split()[1]) * 1024}}\\n")

atexit.register(peak)
for module, name, value in {budgets!r}:
    try:
        setattr(importlib.import_module(module), name, value)
    except ImportError:
        pass
{run}
"""
RUN = "from {command} import main\nsys.exit(main(sys.argv[1:]))"
SMALL_BUDGETS = [
    ("pyhpctk.formats._window", "WINDOW", 2 << 20),
    ("pyhpctk.formats.cctdb_check", "WINDOW_VALUES", 1 << 16),
]


def _generator() -> ModuleType:
    return benchmark_module("pyprof")


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def peak_of(arguments: list[str]) -> tuple[int, int, str]:
    """Run ``python ARGUMENTS`` (a :data:`CHILD`): its exit status, peak resident bytes and
    stderr."""
    done = subprocess.run(
        [sys.executable, *arguments],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_cap,
        env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"),
        timeout=300,
    )
    *err, last = done.stderr.rstrip("\n").split("\n")
    assert last.startswith("peak "), done.stderr
    return done.returncode, int(last.split()[1]), "\n".join(err)


def child_command(command: str, budgets: list[tuple[str, str, int]]) -> list[str]:
    return ["-c", CHILD.format(budgets=budgets, run=RUN.format(command=command))]


Inputs = dict[int, tuple[Path, int, Path, int]]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    """Per number of profiles (of ~20,000 nodes each; 16 and 64): a measurement directory, its
    size, its database and the database's size."""
    root = tmp_path_factory.mktemp("memory")
    generator = _generator()
    out = {}
    for profiles in (16, 64):
        measurement = root / f"bench-{profiles}.m"
        size = generator.generate(measurement, profiles, 20_000)
        database = root / f"bench-{profiles}.d"
        run(ProfOptions.build([measurement], output=database))
        db_size = sum(p.stat().st_size for p in database.glob("*.db"))
        out[profiles] = (measurement, size, database, db_size)
    return out


def test_verify_memory_does_not_grow_with_the_database(inputs: Inputs) -> None:
    peaks = {}
    for profiles, (_, _, database, _) in inputs.items():
        status, peaks[profiles], err = peak_of(
            [*child_command("pyhpctk.cli.main", SMALL_BUDGETS), "verify", str(database)]
        )
        assert status == 0, err
    grown = inputs[64][3] - inputs[16][3]
    more = peaks[64] - peaks[16]
    # Budgets of 2 MiB of pages per file and 65,536 values transposed at a time: the peak is
    # theirs and the contexts' (the same in both), whatever the database's size. (The whole
    # transpose took 2x the database, the pages touched 1x.)
    assert more < grown / 10, f"verify: +{more >> 20} MiB for +{grown >> 20} MiB of database"


# A child that caps its own address space at what it holds once verify's modules are imported,
# plus ROOM: what verify may map and allocate, less than the database's largest file.
ROOM = 96 << 20
CAP_HERE = """\
import resource
import pyhpctk.cli.main, pyhpctk.formats.crosscheck
with open("/proc/self/status") as status:
    held = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (held + {room}, held + {room}))
"""


@pytest.fixture(scope="module")
def long_traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A database whose trace.db (28 lines of 500,000 elements: 160 MiB) is larger than ROOM;
    its measurement is removed once it is written, the database after the tests."""
    root = tmp_path_factory.mktemp("long-traces")
    _generator().generate(root / "m", 28, 2_000, trace_length=500_000)
    run(ProfOptions.build([root / "m"], output=root / "d"))
    shutil.rmtree(root / "m")
    yield root / "d"
    shutil.rmtree(root)


def test_verify_reads_a_database_larger_than_its_address_space(long_traces: Path) -> None:
    """Under an address-space limit (``ulimit -v``) smaller than a database file, verify still
    checks it: it maps windows of a file, not the whole file (mapped whole, it was refused:
    ``trace.db: file: cannot open: Cannot allocate memory``)."""
    assert (long_traces / "trace.db").stat().st_size > 1.5 * ROOM
    body = CHILD.format(
        budgets=SMALL_BUDGETS,
        run=CAP_HERE.format(room=ROOM) + RUN.format(command="pyhpctk.cli.main"),
    )
    done = subprocess.run(
        [sys.executable, "-c", body, "verify", str(long_traces)],
        capture_output=True,
        text=True,
        preexec_fn=_cap,
        env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"),
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (0, f"{long_traces}: ok (4 file(s) checked)\n"), (
        done.stderr
    )


def test_pyprof_memory_does_not_grow_with_the_input_under_its_limit(
    inputs: Inputs, tmp_path: Path
) -> None:
    peaks = {}
    for profiles, (measurement, _, database, _) in inputs.items():
        runs = []
        for attempt in range(RUNS):
            output = tmp_path / f"capped-{profiles}-{attempt}.d"
            command = child_command("pyhpctk.cli.pyprof", [])
            status, peak, err = peak_of(
                [*command, "--memory-limit", "8M", "-o", str(output), str(measurement)]
            )
            assert status == 0, err
            for name in ("meta.db", "profile.db", "cct.db", "trace.db"):
                assert (output / name).read_bytes() == (database / name).read_bytes(), name
            runs.append(peak)
        peaks[profiles] = min(runs)
    grown = inputs[64][1] - inputs[16][1]
    more = peaks[64] - peaks[16]
    # 8 MiB of values, plus the call-path tree and contexts (the same in both), plus what one
    # profile takes to read. Uncapped, pyprof held about 3x the input (+84 MiB here). One run's
    # peak scatters by a few MiB (the allocator's arenas, the moment a collection runs): +0.5 to
    # +3.2 MiB in six runs on one machine, +2.9 MiB on CI's, over +5.6 MiB once in about twenty
    # runs; the least of three runs of each size is what the input costs.
    assert more < grown / 5, f"pyprof: +{more >> 20} MiB for +{grown >> 20} MiB of input"


def test_verify_still_finds_a_value_cct_db_lost(inputs: Inputs, tmp_path: Path) -> None:
    """The windowed comparison checks every value: one changed in the last window is found."""
    _, _, database, _ = inputs[16]
    copy = tmp_path / "db"
    copy.mkdir()
    for file in database.glob("*.db"):
        (copy / file.name).write_bytes(file.read_bytes())
    contexts = cctdb.read(copy / "cct.db")
    nv, _ = contexts.value_counts()
    last = int(nv.nonzero()[0][-1])
    pointer = int(contexts.values.pointers()[0][last])  # type: ignore[attr-defined]
    del contexts
    image = bytearray((copy / "cct.db").read_bytes())
    value_at = pointer + 4  # the first value's f64, after its u32 profile index
    image[value_at : value_at + 8] = struct.pack("<d", 12345.5)
    (copy / "cct.db").write_bytes(bytes(image))
    done = subprocess.run(
        [sys.executable, *child_command("pyhpctk.cli.main", SMALL_BUDGETS), "verify", str(copy)],
        capture_output=True,
        text=True,
        preexec_fn=_cap,
    )
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert f"cct.db: context {last}: values differ from profile.db's" in out


def test_pyprof_takes_a_share_of_the_available_memory_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[int | None] = []
    monkeypatch.setattr(pyprof_cli, "default_limit", lambda: 3 << 30)

    def spy(options: ProfOptions, progress: object = None) -> None:
        seen.append(options.memory_limit)
        raise SystemExit(0)

    monkeypatch.setattr(pyprof_cli, "run", spy)
    with pytest.raises(SystemExit):
        pyprof_cli.main([str(tmp_path)])
    with pytest.raises(SystemExit):
        pyprof_cli.main(["--memory-limit", "none", str(tmp_path)])
    with pytest.raises(SystemExit):
        pyprof_cli.main(["--memory-limit", "1.5G", str(tmp_path)])
    assert seen == [3 << 30, None, 3 << 29]


def test_available_memory_is_the_least_of_the_machine_and_its_cgroup(tmp_path: Path) -> None:
    from pyhpctk.analysis import memory

    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(
        "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n"
    )
    (proc / "self" / "status").write_text("VmSize:\t  100000 kB\n")
    (proc / "self" / "cgroup").write_text("0::/job\n")
    assert memory.available_memory(proc, cgroup) == 8_000_000 * 1024  # no cgroup files
    (cgroup / "job").mkdir(parents=True)
    (cgroup / "job" / "memory.max").write_text("max\n")
    (cgroup / "job" / "memory.current").write_text("1000\n")
    assert memory.available_memory(proc, cgroup) == 8_000_000 * 1024  # no limit
    (cgroup / "job" / "memory.max").write_text(f"{4 << 30}\n")
    (cgroup / "job" / "memory.current").write_text(f"{1 << 30}\n")
    assert memory.available_memory(proc, cgroup) == 3 << 30
    assert memory.default_limit(proc, cgroup) == 3 << 29  # half
    (proc / "self" / "cgroup").write_text("4:memory:/job1\n0::/\n")  # cgroup v1
    (cgroup / "memory").mkdir()
    (cgroup / "memory" / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    (cgroup / "memory" / "memory.usage_in_bytes").write_text(f"{1 << 30}\n")
    assert memory.available_memory(proc, cgroup) == 1 << 30


def test_a_profile_larger_than_the_limit_is_one_line(
    inputs: Inputs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pyhpctk.analysis import memory

    measurement, _, _, _ = inputs[16]
    largest = max(measurement.glob("*.hpcrun"), key=lambda p: p.stat().st_size)
    need = 3 * (largest.stat().st_size + largest.with_suffix(".hpctrace").stat().st_size)
    monkeypatch.setattr(memory, "ALWAYS_FITS", 1 << 16)  # units this small always proceed
    output = tmp_path / "db"
    status = pyprof_cli.main(["--memory-limit", "256k", "-o", str(output), str(measurement)])
    err = capsys.readouterr().err
    assert status == 2
    assert err == (
        f"pyprof: error: --memory-limit 0.2 MiB cannot be kept: reading the profile {largest} "
        f"({memory.size_text(need // 3)} with its trace) takes (about {memory.size_text(need)}); "
        f"give --memory-limit {-(-need // (1 << 20))}M or more\n"
    )
    assert not output.exists()


@pytest.mark.parametrize("tool", ["pyprof", "pyhpctk"])
def test_out_of_memory_is_one_line_naming_what_to_do(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    if tool == "pyprof":
        monkeypatch.setattr(pyprof_cli, "run", exhausted)
        status = pyprof_cli.main(["--memory-limit", "1G", str(tmp_path)])
        advice = "give a smaller --memory-limit"
    else:
        monkeypatch.setattr(pyhpctk_main, "verify_path", exhausted)
        status = pyhpctk_main.main(["verify", str(tmp_path)])
        advice = "free memory"
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith(f"{tool}: error: out of memory: ") and advice in err
    assert err.count("\n") == 1 and "Traceback" not in err

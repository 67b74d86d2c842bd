"""pyprof-mpi under ``mpiexec -n 1, 2, 3`` writes the database pyprof writes, byte for byte.

Each test launches ``.venv/bin/mpiexec`` (the MPICH installed with the ``dev`` extra) on
HPCToolkit's reference measurements and compares every file with a serial ``pyprof`` run of the
same options, and with hpcprof's reference database by meaning. Rank counts exceed the number of
profiles on purpose (idle ranks must still take part in every collective).
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpctk.analysis.compare import compare_dirs
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.formats import threads
from worker_helpers import write_process

MPIEXEC = Path(sys.executable).parent / "mpiexec"  # the dev extra's mpich, beside python
if not MPIEXEC.exists() and shutil.which("mpiexec"):
    MPIEXEC = Path(str(shutil.which("mpiexec")))
FILES = ("meta.db", "profile.db", "cct.db", "trace.db", "metrics/default.yaml", "threads.txt")
NAMED_THREADS = Path(__file__).resolve().parent / "programs" / "named_threads.py"


def pyprof_mpi(
    ranks: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n RANKS python -m pyhpctk.cli.pyprof_mpi ARGS`` (the console script's code),
    with ``env`` added to the environment."""
    if not MPIEXEC.exists():
        raise FileNotFoundError(f"{MPIEXEC}: no mpiexec (the dev extra installs mpich)")
    command = [str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "pyhpctk.cli.pyprof_mpi"]
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, env=env)


def assert_same_files(expected: Path, actual: Path) -> None:
    for name in FILES:
        if (expected / name).exists() or (actual / name).exists():
            assert filecmp.cmp(expected / name, actual / name, shallow=False), name


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("ranks", "extra", "serial_extra"),
    [
        (1, [], {}),
        (2, ["-M", "stats"], {"metrics": "stats"}),
        (3, ["--memory-limit", "3k"], {}),
        (4, ["--memory-limit", "3k"], {}),
    ],
    ids=["n1", "n2-stats", "n3-rounds", "n4-rounds"],
)
def test_ranks_write_pyprofs_database(
    reference: Path,
    tmp_path: Path,
    ranks: int,
    extra: list[str],
    serial_extra: dict[str, str],
) -> None:
    measurement = reference / "meas" / "loops-cputime-t.m"  # 4 threads, loops, traces
    serial = tmp_path / "serial"
    run(ProfOptions.build([measurement], output=serial, **serial_extra))  # type: ignore[arg-type]
    output = tmp_path / "mpi"
    done = pyprof_mpi(ranks, "-o", str(output), *extra, str(measurement))
    assert done.returncode == 0, done.stderr
    assert f"({ranks} ranks)" in done.stderr and "4 profiles" in done.stderr
    assert_same_files(serial, output)
    if not extra or extra[0] != "-M":
        assert compare_dirs(reference / "dbase" / "loops-cputime-t.d", output) == []


@pytest.mark.mpi
@pytest.mark.parametrize("speeds", ["4,0.5,1,3", "0.5,0.5,8,0.5", "even"])
def test_ranks_of_unequal_speeds_write_pyprofs_database(
    reference: Path, tmp_path: Path, speeds: str
) -> None:
    """Shares in proportion to the ranks' speeds (analysis/balance.py) move the splits of the
    input and of cct.db's contexts, never a byte of the database."""
    measurement = reference / "meas" / "loops-cputime-t.m"
    serial = tmp_path / "serial"
    run(ProfOptions.build([measurement], output=serial))
    output = tmp_path / "mpi"
    extra = ["--memory-limit", "3k"]  # several cct.db rounds, each split by the speeds
    done = pyprof_mpi(
        4, "-o", str(output), *extra, str(measurement), env={"PYHPCTK_PYPROF_SPEEDS": speeds}
    )
    assert done.returncode == 0, done.stderr
    assert_same_files(serial, output)


SPLITS = """\
import json, sys
from pathlib import Path
from pyhpctk.analysis import pipeline, write_stages
from pyhpctk.analysis.comm import world
from pyhpctk.analysis.options import ProfOptions

seen = []

def spy(split):
    def recorded(weights, parts, first_share=1.0, speeds=None):
        seen.append(None if speeds is None else [float(x) for x in speeds])
        return split(weights, parts, first_share, speeds)
    return recorded

pipeline.split_even = spy(pipeline.split_even)
write_stages.split_even = spy(write_stages.split_even)
comm = world()
pipeline.run(ProfOptions.build([Path(sys.argv[1])], output=Path(sys.argv[2])), comm=comm)
# a file per rank: two ranks' lines on one stdout can come through interleaved
Path(sys.argv[3], f"splits-{comm.rank}.json").write_text(json.dumps([comm.rank, seen]))
"""


@pytest.mark.mpi
def test_the_speeds_reach_the_read_and_cct_db_splits(reference: Path, tmp_path: Path) -> None:
    """The splits of the input and of every cct.db round get the ranks' speeds (the
    byte-identity tests above pass whatever the split: this pins that the speeds are used)."""
    measurement = reference / "meas" / "loops-cputime-t.m"
    script = tmp_path / "splits.py"
    script.write_text(SPLITS)
    command = [str(MPIEXEC), "-n", "2", sys.executable, str(script), str(measurement),
               str(tmp_path / "db"), str(tmp_path)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYHPCTK_PYPROF_SPEEDS="3,0.5")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    files = sorted(tmp_path.glob("splits-*.json"))
    assert [path.name for path in files] == ["splits-0.json", "splits-1.json"], done.stdout
    for rank, seen in (json.loads(path.read_text()) for path in files):
        assert len(seen) >= 2, (rank, seen)  # the read, then at least one cct.db round
        assert all(speeds == [3.0, 0.5] for speeds in seen), (rank, seen)


@pytest.mark.mpi
def test_a_bad_speeds_setting_is_one_clear_error(reference: Path, tmp_path: Path) -> None:
    measurement = reference / "meas" / "loops-cputime-t.m"
    output = tmp_path / "mpi"
    done = pyprof_mpi(
        2, "-o", str(output), str(measurement), env={"PYHPCTK_PYPROF_SPEEDS": "1,fast"}
    )
    assert done.returncode == 2, done.stderr
    assert "PYHPCTK_PYPROF_SPEEDS='1,fast': give 'even' or 2 positive numbers" in done.stderr
    assert "Traceback" not in done.stderr
    assert not output.exists()


@pytest.mark.mpi
def test_gpu_measurement_on_four_ranks(reference: Path, tmp_path: Path) -> None:
    """PC samples: the GINS weights of the device call graph are summed over ranks (two of
    the four ranks have no profile)."""
    measurement = reference / "meas" / "loops-cuda-nvidiapc-t.m"
    output = tmp_path / "mpi"
    done = pyprof_mpi(4, "-o", str(output), str(measurement))
    assert done.returncode == 0, done.stderr
    assert compare_dirs(reference / "dbase" / "loops-cuda-nvidiapc-t.d", output) == []
    serial = tmp_path / "serial"
    run(ProfOptions.build([measurement], output=serial))
    assert_same_files(serial, output)


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("ranks", "extra"),
    [(2, []), (3, ["--memory-limit", "1k"])],
    ids=["n2", "n3-read-twice"],
)
def test_worker_threads_are_grafted_alike_on_every_rank_count(
    tmp_path: Path, ranks: int, extra: list[str]
) -> None:
    """Native runtimes' worker threads under the lines that called them (issue #36 item 3):
    one process traced (by time), one not (in proportion); a rank may hold a worker and not
    its dispatcher, and under the cap each rank reads its profiles twice (the values moved
    again as they are read)."""
    measurement = tmp_path / "workers.m"
    write_process(measurement, pid=100, traced=True)
    write_process(measurement, pid=200)
    serial = tmp_path / "serial"
    run(ProfOptions.build([measurement], output=serial))
    output = tmp_path / "mpi"
    done = pyprof_mpi(ranks, "-o", str(output), *extra, str(measurement))
    assert done.returncode == 0, done.stderr
    assert b"<OpenBLAS worker threads>" in (output / "meta.db").read_bytes()
    assert_same_files(serial, output)


@pytest.mark.mpi
def test_thread_names_survive_pyprof_mpi(tmp_path: Path) -> None:
    """pyrun's thread names (issue #21 item 7): threads.txt as serial pyprof writes it."""
    measurement = tmp_path / "m"
    command = [sys.executable, str(NAMED_THREADS), "0.1"]
    assert pyrun_main(["-t", "-o", str(measurement), *command]) == 0
    serial = tmp_path / "serial"
    run(ProfOptions.build([measurement], output=serial))
    output = tmp_path / "mpi"
    done = pyprof_mpi(3, "-o", str(output), str(measurement))
    assert done.returncode == 0, done.stderr
    assert_same_files(serial, output)
    names = threads.read(output / "threads.txt")
    assert {e.name for e in names.entries} >= {"MainThread", "loader-done"}


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no such measurement directory"),
        (["--memory-limit", "lots"], "cannot read 'lots' as a size"),
    ],
    ids=["missing-input", "bad-size"],
)
def test_an_error_is_reported_once_and_every_rank_exits(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = pyprof_mpi(2, *args, "-o", str(tmp_path / "db"), str(tmp_path / "nowhere.m"))
    assert done.returncode == 2
    assert done.stderr.count(message) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "db").exists()

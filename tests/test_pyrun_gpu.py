"""``pyrun -e gpu=simulated`` end to end: GPU work under the Python lines that issued it.

The simulated backend answers each call of ``examples/gpu_demo.py`` with activity recorded on an
H200, through the same monitor, channels and stream tracing as ``gpu=nvidia`` (issue #6, item 7).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pyhpctk.analysis import pipeline
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.cli.main import main as pyhpctk_main
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.formats import hpcrun
from pyhpctk.present.api import open_database

DEMO = Path(__file__).resolve().parent.parent / "examples" / "gpu_demo.py"
STEPS = 7


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "m"
    # pyrun measures every thread, BLAS pools included: one BLAS thread keeps the threads
    # written to the application's and pyrun's own (which must not be written).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENBLAS_NUM_THREADS", "1")
        status = pyrun_main(
            [
                "-e",
                "gpu=simulated",
                "-t",
                "-o",
                str(out),
                sys.executable,
                str(DEMO),
                str(STEPS),
                "--simulated",
            ]
        )
    assert status == 0
    return out


@pytest.fixture(scope="module")
def database(measured: Path) -> Path:
    db = measured.parent / "db"
    pipeline.run(ProfOptions.build([str(measured)], output=str(db)))
    return db


def test_only_the_application_thread_and_gpu_streams_are_written(measured: Path) -> None:
    threads = sorted(int(p.name.split("-")[2]) for p in measured.glob("*.hpcrun"))
    assert threads[0] == 0
    assert threads[1:] and all(t >= 500 for t in threads[1:]), threads  # no monitor threads
    assert len(list(measured.glob("*.hpctrace"))) == len(threads)
    assert pyhpctk_main(["verify", str(measured)]) == 0


def test_stream_profiles_carry_gpu_context_and_stream_ids(measured: Path) -> None:
    for path in measured.glob("*-5??-*.hpcrun"):
        profile = hpcrun.read(path)
        kinds = [int(k) & 0x3FFF for k in profile.id_tuple["kind"]]
        assert kinds[-2:] == [5, 6], kinds  # GPUCONTEXT, GPUSTREAM (formats.md §1.8)


def _row(db: Path, line: int, metric: str) -> float:
    database = open_database(db)
    arrays = database.arrays([metric])
    labels = arrays["label"]
    values = arrays[f"{metric} (I)"]
    hits = [
        float(v)
        for lab, v in zip(labels, values, strict=True)
        # pyview names a file below the program's root, which moves up when samples reach
        # files outside examples/: the line is found by its file's basename
        if lab.rsplit("/", 1)[-1] == f"gpu_demo.py: {line}"
    ]
    assert hits, f"no context for gpu_demo.py:{line}"
    return sum(hits)


def test_kernels_copies_and_syncs_land_under_the_lines_that_issued_them(database: Path) -> None:
    source = DEMO.read_text().splitlines()
    launch = next(i for i, text in enumerate(source, 1) if "gpu.launch()" in text)
    stencil_call = next(i for i, text in enumerate(source, 1) if "simulated_stencil(gpu)" in text)
    sync = next(i for i, text in enumerate(source, 1) if "gpu.synchronize()" in text)
    assert _row(database, launch, "GKER:COUNT") == 4 * STEPS
    assert _row(database, stencil_call, "GKER:COUNT") == 4 * STEPS
    assert _row(database, sync, "GSYNC:COUNT") == 1
    copies = [i for i, text in enumerate(source, 1) if "gpu.copy()" in text]
    assert sum(_row(database, line, "GXCOPY:COUNT") for line in copies) == 2 * STEPS
    assert _row(database, launch, "GKER (sec)") > 0


def test_simulated_runtime_outside_pyrun_is_a_clear_error() -> None:
    run = subprocess.run(
        [sys.executable, str(DEMO), "2", "--simulated"], capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "pyrun -e gpu=simulated" in run.stderr


def test_bad_gpu_events_are_refused_before_the_program_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"
    program = ["python", "-c", f"open({str(marker)!r}, 'w')"]
    assert pyrun_main(["-e", "gpu=quantum", "-o", str(tmp_path / "m"), *program]) == 2
    assert "unknown GPU backend" in capsys.readouterr().err
    assert pyrun_main(["-e", "gpu=simulated", "-e", "gpu=nvidia", *program]) == 2
    assert "at most one gpu" in capsys.readouterr().err
    for event, message in (
        ("gpu=simulated,hook=bogus", "hook='bogus'"),
        ("gpu=nvidia,pcmode=sideways", "pcmode='sideways'"),
        ("gpu=nvidia,pc,period=3", "period"),
        ("gpu=nvidia,pc,inst", "exclude each other"),
        (f"gpu=simulated,inst={tmp_path / 'nope.json'}", "no such file"),
    ):
        assert pyrun_main(["-e", event, "-o", str(tmp_path / "m"), *program]) == 2, event
        assert message in capsys.readouterr().err, event
    assert not marker.exists() and not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("how", "status"), [("exception", 1), ("exit", 3), ("sigterm", 128 + 15), ("os_exit", 5)]
)
def test_gpu_work_survives_every_way_of_ending(tmp_path: Path, how: str, status: int) -> None:
    """Nothing lost: every kernel launched before the program died is in its profile."""
    program = Path(__file__).resolve().parent / "programs" / "gpu_ending.py"
    out = tmp_path / "m"
    launches = 300
    argv = ["-e", "gpu=simulated", "-t", "-o", str(out), sys.executable, str(program), how]
    assert pyrun_main([*argv, str(launches)]) == status
    assert pyhpctk_main(["verify", str(out)]) == 0
    db = tmp_path / "db"
    pipeline.run(ProfOptions.build([str(out)], output=str(db)))
    arrays = open_database(db).arrays(["GKER:COUNT"])
    assert arrays["GKER:COUNT (I)"][0] == launches

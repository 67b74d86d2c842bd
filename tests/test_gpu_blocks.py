"""Block counts of instrumented kernels in the calling context tree, without a GPU (issue #34,
items 3 and 5): PTX that Triton compiles here for sm_90, counters of a known execution (the
paths each program takes, derived from its inputs: ``ptx_paths``) replayed through
``pyrun -e gpu=simulated,blocks=RECORDING``, then ``pyprof`` and ``pyview``; and the counts an
H100 measured for the nvcc-compiled kernels of kernels.cu, replayed the same way. What pyview
shows under the kernel — its loops and source lines, inlined code included — must be what the
kernel's arithmetic implies."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import block_rows
from block_rows import expected_rows, outermost_line, pyview_argv, scaled, shown_rows
from gpu_helpers import SIMULATED_LAUNCHES
from ptx_helpers import PTX_DIR
from ptx_paths import block_counts, counters, loop_decider, walk
from pyhpctk.instrument.ptx import Buffer, Cfg, Mode, build, find_loops, instrument, parse
from pyhpctk.instrument.ptx.lines import instruction_locations
from pyhpctk.measure.gpu.simulated.block_recording import (
    BlockRecording,
    RecordedLaunch,
    RecordedModule,
    save,
)

pytest.importorskip("triton", reason="Triton (the dev extra) compiles the kernels")

THREADS, WARPS = 128, 4  # Triton's default: 4 warps a program
ROWS = [0, 3, 3, 7, 12, 12, 20]  # trips: program p loops ROWS[p + 1] - ROWS[p] times
PROGRAMS = len(ROWS) - 1
REDUCE_PROGRAMS = 5  # reduce: programs 0, 2, 4 sum, 1 and 3 take the maximum
LAUNCHES = 3


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """Triton's PTX of a kernel, its cache in a temporary folder for this module."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_DEFAULT_FP_FUSION", os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
        env.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        env.syspath_prepend(str(PTX_DIR))
        import triton_counted
        import triton_kernels

        def ptx(name: str) -> str:
            if name == "trips":
                return triton_counted.compile_counted("trips")
            return str(triton_kernels.compile_ptx(name))

        yield ptx


# -- the truth: paths from the inputs, and what they imply per line --------------------------


def _kernel_cfg(ptx: str) -> Cfg:
    return build(parse(ptx).kernels[0])


def trips_paths(ptx: str) -> list[tuple[list[int], int, int]]:
    """Each program of ``trips`` goes round its loop ROWS[p + 1] - ROWS[p] times."""
    cfg = _kernel_cfg(ptx)
    loops = find_loops(cfg)
    return [
        (walk(cfg, loop_decider(cfg, loops, ROWS[p + 1] - ROWS[p])), WARPS, THREADS)
        for p in range(PROGRAMS)
    ]


def reduce_paths(ptx: str) -> list[tuple[list[int], int, int]]:
    """``reduce``: even programs take the branch that sums (``add.f32``), odd ones the one
    that takes the maximum (``max.f32``)."""
    cfg = _kernel_cfg(ptx)

    def holds(block: int, opcode: str) -> bool:
        return any(cfg.statement(i).opcode == opcode for i in cfg.blocks[block].instructions)

    def parity(p: int) -> Callable[[int, tuple[int, ...], list[int]], int]:
        wanted = "add.f32" if p % 2 == 0 else "max.f32"
        return lambda block, successors, path: next(s for s in successors if holds(s, wanted))

    return [(walk(cfg, parity(p)), WARPS, THREADS) for p in range(REDUCE_PROGRAMS)]


# -- the pipeline: recording, pyrun, pyprof, pyview ---------------------------------------------


def record(
    path: Path, mode: Mode, kernels: list[tuple[str, str, list[tuple[list[int], int, int]]]]
) -> Path:
    """A recording of LAUNCHES rounds, each launching every kernel (name, ptx, paths) once."""
    modules = [RecordedModule("triton", ptx, (name,)) for name, ptx, _ in kernels]
    launches = []
    for _ in range(LAUNCHES):
        for number, (name, ptx, paths) in enumerate(kernels):
            plan = instrument(ptx, mode, {name}, Buffer.GLOBAL).plans[name]
            launches.append(RecordedLaunch(number, name, counters(plan, paths), 25_000))
    save(BlockRecording(mode, modules, launches, "test_gpu_blocks"), path)
    return path


def measure(tmp: Path, recording: Path, launches: int, options: str = "") -> Path:
    from pyhpctk.analysis.options import ProfOptions
    from pyhpctk.analysis.pipeline import run
    from pyhpctk.cli.pyrun import main as pyrun_main

    program = tmp / "launches.py"
    program.write_text(SIMULATED_LAUNCHES.format(launches=launches))
    out, database = tmp / "m", tmp / "d"
    event = f"gpu=simulated,blocks={recording}{options}"
    command = ["-e", event, "-o", str(out), sys.executable, str(program)]
    assert pyrun_main(command) == 0
    run(ProfOptions.build([out], output=database))
    return database


def pyview(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from pyhpctk.cli.pyview import main

    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def rows_below(capsys: pytest.CaptureFixture[str], database: Path, kernel: str) -> list[dict]:
    """pyview's CSV rows of everything below the kernel's row (metrics inclusive)."""
    return block_rows.rows_below(pyview(capsys, *pyview_argv(str(database))), kernel)


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [Mode.EDGES, Mode.BLOCKS])
def test_a_data_dependent_loop_counts_every_trip_under_its_loop_and_lines(
    compiled: Callable[[str], str],
    mode: Mode,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ptx = compiled("trips")
    paths = trips_paths(ptx)
    recording = record(tmp_path / "trips.json", mode, [("trips", ptx, paths)])
    database = measure(tmp_path, recording, LAUNCHES)
    below = rows_below(capsys, database, "trips")
    cfg = _kernel_cfg(ptx)
    threads = block_counts(cfg, paths)
    warps = [t // 32 for t in threads] if mode is Mode.BLOCKS else None
    want = scaled(expected_rows(ptx, threads, warps), LAUNCHES)
    assert shown_rows(below) == want
    # the arithmetic itself: every trip runs the loop's block(s) once per thread
    (loop,) = find_loops(cfg).loops
    trips = ROWS[-1] - ROWS[0]
    (loop_row,) = [r for r in below if r["kind"] == "loop"]
    per_trip = sum(len(cfg.blocks[b].instructions) for b in loop.blocks)
    assert int(float(loop_row["GPTX:INST (I)"])) == LAUNCHES * trips * THREADS * per_trip
    assert loop_row["line"] == str(21)  # `while e < end:` in triton_counted.py
    kernel = below[0]
    assert int(float(kernel["GPTX:COUNT (I)"])) == LAUNCHES
    assert int(float(kernel["GKER:COUNT (I)"])) == LAUNCHES
    entry = want[(False, outermost_line(_first_location(ptx)))][0]
    assert entry >= LAUNCHES * PROGRAMS * THREADS  # every thread launched enters the kernel
    # and the text view shows the loop and its lines with their counts
    text = pyview(capsys, str(database), "--full", "-m", "GPTX:INST")
    assert "loop at " in text and "triton_counted.py: 21" in text
    assert f"{float(loop_row['GPTX:INST (I)']):.2e}" in text


def _first_location(ptx: str):  # type: ignore[no-untyped-def]
    module = parse(ptx)
    cfg = build(module.kernels[0])
    return instruction_locations(module, cfg).get(cfg.blocks[0].instructions[0])


def test_a_divergent_branch_counts_each_side_by_the_programs_that_took_it(
    compiled: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ptx = compiled("reduce")
    paths = reduce_paths(ptx)
    recording = record(tmp_path / "reduce.json", Mode.EDGES, [("reduce", ptx, paths)])
    database = measure(tmp_path, recording, LAUNCHES)
    below = rows_below(capsys, database, "reduce")
    cfg = _kernel_cfg(ptx)
    threads = block_counts(cfg, paths)
    assert shown_rows(below) == scaled(expected_rows(ptx, threads, None), LAUNCHES)
    # tl.sum's line ran in the even programs, tl.max's in the odd ones
    source = (PTX_DIR / "triton_kernels.py").read_text().splitlines()
    sum_line = next(i for i, t in enumerate(source, 1) if "total = tl.sum(x, 0)" in t)
    max_line = next(i for i, t in enumerate(source, 1) if "total = tl.max(x, 0)" in t)
    rows = shown_rows(below)
    even, odd = (REDUCE_PROGRAMS + 1) // 2, REDUCE_PROGRAMS // 2
    sums = [b for b in range(len(cfg.blocks)) if _holds(cfg, b, "add.f32")]
    maxes = [b for b in range(len(cfg.blocks)) if _holds(cfg, b, "max.f32")]
    assert threads[sums[0]] == even * THREADS and threads[maxes[0]] == odd * THREADS
    assert rows[(False, sum_line)][0] == LAUNCHES * even * THREADS  # the branch's block, entered
    assert rows[(False, max_line)][0] == LAUNCHES * odd * THREADS
    # inlined: tl.sum's code shows under its call site as the function Triton inlined
    inlined = [r for r in below if r["kind"] == "inlined"]
    assert {r["scope"] for r in inlined} == {"[I] reduce"}  # Triton's tl.reduce, inlined
    assert {Path(r["file"]).name for r in inlined} == {"standard.py"}


def _holds(cfg: Cfg, block: int, opcode: str) -> bool:
    return any(cfg.statement(i).opcode == opcode for i in cfg.blocks[block].instructions)


def test_the_launch_window_and_the_kernel_filter_choose_what_is_counted(
    compiled: Callable[[str], str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """launch-skip=1, launch-count=2 of 3 launches of trips, kernel-name leaving reduce out;
    pyrun's summary says so, with trips' registers before and after instrumenting."""
    from pyhpctk.instrument.ptx import assemble, find_ptxas

    trips, reduce = compiled("trips"), compiled("reduce")
    kernels = [("trips", trips, trips_paths(trips)), ("reduce", reduce, reduce_paths(reduce))]
    recording = record(tmp_path / "both.json", Mode.EDGES, kernels)
    options = ",kernel-name=^tri,launch-skip=1,launch-count=2"
    capfd.readouterr()
    database = measure(tmp_path, recording, 2 * LAUNCHES, options)
    summary = capfd.readouterr().err
    assert (
        "pyrun: gpu: blocks: 2 launches of 1 instrumented kernels counted (edges mode)" in summary
    )
    assert (
        "pyrun: gpu: blocks: not counted: reduce: triton: kernel-name=^tri leaves it out" in summary
    )
    if find_ptxas() is not None:  # the nvcc wheel of the dev extra
        arch = parse(trips).target.split(",")[0].strip()
        before = assemble(trips, arch).registers["trips"]
        after = assemble(instrument(trips, Mode.EDGES, {"trips"}, Buffer.GLOBAL).ptx, arch)
        told = f"trips: 2 launches; registers {before} -> {after.registers['trips']} (ptxas"
        assert told in summary
    capsys = capfd
    below = rows_below(capsys, database, "trips")
    assert int(float(below[0]["GPTX:COUNT (I)"])) == 2  # trips launches 2 and 3 of 3
    assert int(float(below[0]["GKER:COUNT (I)"])) == LAUNCHES
    threads = block_counts(_kernel_cfg(trips), trips_paths(trips))
    assert shown_rows(below) == scaled(expected_rows(trips, threads, None), 2)
    text = pyview(capsys, str(database), "--full", "-m", "GPTX:INST")
    assert "triton_kernels.py" not in text  # reduce was not instrumented: no lines of it


def test_counts_an_h100_measured_show_each_warps_divergence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kernels.cu's tree reduction as nvcc compiled it on an H100, and the warp and thread
    counts of its blocks measured there (blocks mode; device_counts_h100.json): 65 CTAs of 256
    threads halve ``stride`` from 128 to 1, and ``if (t < stride)`` is taken by ``stride``
    threads, in max(stride / 32, 1) warps."""
    import json

    ptx = (PTX_DIR / "kernels_sm90_h100.ptx").read_text()
    measured = json.loads((PTX_DIR / "device_counts_h100.json").read_text())
    record_ = measured["kernels"]["reduce"]["blocks"]
    threads, warps = record_["block_threads"], record_["block_warps"]
    buffer = np.array([warps, threads], dtype=np.uint64).T
    launch = RecordedLaunch(0, "reduce", buffer, 0)
    recording = BlockRecording(Mode.BLOCKS, [RecordedModule("cupy", ptx, ("reduce",))], [launch])
    save(recording, tmp_path / "reduce_h100.json")
    database = measure(tmp_path, tmp_path / "reduce_h100.json", 1)
    below = rows_below(capsys, database, "reduce")
    rows = shown_rows(below)
    assert rows == expected_rows(ptx, threads, warps, "reduce")
    ctas, strides = 65, [128 >> k for k in range(8)]
    # line 22 in the loop: the test `t < stride` (every thread, 8 warps) and the add (taken)
    assert rows[(True, 22)][0] == ctas * sum(256 + s for s in strides)
    assert rows[(True, 22)][1] == ctas * sum(8 + max(s // 32, 1) for s in strides)
    assert rows[(False, 25)][:2] == [ctas * 256 + ctas, ctas * 8 + ctas]  # if (t == 0) out[...]


@pytest.mark.mpi
def test_pyprof_mpi_and_the_html_report_show_the_counts(
    compiled: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The counts are metrics like any other: pyprof-mpi on 2 ranks writes pyprof's database
    byte for byte, and the HTML report shows the loop's instruction count."""
    import subprocess

    ptx = compiled("trips")
    recording = record(tmp_path / "trips.json", Mode.EDGES, [("trips", ptx, trips_paths(ptx))])
    database = measure(tmp_path, recording, LAUNCHES)
    mpiexec = Path(sys.executable).parent / "mpiexec"  # the dev extra's mpich
    command = [str(mpiexec), "-n", "2", sys.executable, "-m", "pyhpctk.cli.pyprof_mpi"]
    output = tmp_path / "d-mpi"
    done = subprocess.run(
        [*command, "-o", str(output), str(tmp_path / "m")],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in ("meta.db", "profile.db", "cct.db"):
        assert (output / name).read_bytes() == (database / name).read_bytes(), name
    (loop_row,) = [r for r in rows_below(capsys, output, "trips") if r["kind"] == "loop"]
    report = tmp_path / "report.html"
    pyview(capsys, str(output), "-m", "GPTX:INST", "--html", str(report))
    html = report.read_text()
    assert "GPTX:INST" in html and "trips" in html
    assert f'"v":[{float(loop_row["GPTX:INST (I)"])},' in html  # the loop's row, inclusive


DEVICE_RECORDINGS = sorted((PTX_DIR.parent / "gpu").glob("blocks_recording_*.json"))


@pytest.mark.parametrize("path", DEVICE_RECORDINGS, ids=[p.stem for p in DEVICE_RECORDINGS])
def test_a_run_recorded_on_the_device_replays_to_the_counts_it_implies(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recording blocks_device.py made on a GPU (copied here as blocks_recording_<card>.json):
    each kernel's rows in pyview are what its recorded counters imply, launch by launch."""
    from pyhpctk.instrument.ptx import derive
    from pyhpctk.measure.gpu.simulated.block_recording import load

    recording = load(path)
    database = measure(tmp_path, path, len(recording.launches))
    want: dict[str, list] = {}
    for launch in recording.launches:
        done = recording.instrumented[launch.module]
        assert done is not None
        counts = derive(done.plans[launch.kernel], launch.counters)
        warps = counts.block_warps if recording.mode is Mode.BLOCKS else None
        rows = expected_rows(done.source, counts.block_threads, warps, launch.kernel)
        want[launch.kernel] = [*want.get(launch.kernel, []), rows]
    assert want
    for kernel, launches in want.items():
        assert shown_rows(rows_below(capsys, database, kernel)) == block_rows.summed(*launches)


def test_pystruct_describes_the_saved_ptx_as_pyprof_does(
    compiled: Callable[[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pystruct on the measurement writes the structure of ptxbins/<md5>.ptx; pyprof with it
    (the PTX itself removed) shows the same kernel, loop and lines as from the PTX."""
    from pyhpctk.analysis.options import ProfOptions
    from pyhpctk.analysis.pipeline import run
    from pyhpctk.cli.pystruct import main as pystruct_main

    ptx = compiled("trips")
    recording = record(tmp_path / "trips.json", Mode.EDGES, [("trips", ptx, trips_paths(ptx))])
    database = measure(tmp_path, recording, LAUNCHES)
    (saved,) = (tmp_path / "m" / "ptxbins").glob("*.ptx")
    assert saved.read_text() == ptx  # the original PTX, as Triton made it
    assert pystruct_main([str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "structs" / f"{saved.name}.hpcstruct").is_file()
    saved.unlink()  # the structure file alone now places the counts
    again = tmp_path / "d2"
    run(ProfOptions.build([tmp_path / "m"], output=again))
    by_pystruct = rows_below(capsys, again, "trips")
    assert shown_rows(by_pystruct) == shown_rows(rows_below(capsys, database, "trips"))
    assert [r["kind"] for r in by_pystruct].count("loop") == 1

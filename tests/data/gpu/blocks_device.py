"""Issue #34 items 3 and 5 on the device: a Triton kernel and a CuPy kernel with data-dependent
loops, measured by ``pyrun -e gpu=nvidia,blocks``, analyzed by pyprof, shown by pyview; the
per-line block counts checked against what each kernel's arithmetic implies; a recording made
for CI to replay (``gpu=simulated,blocks=RECORDING``).

    python3 tests/data/gpu/blocks_device.py OUT_DIR [--quick]     (repository root or anywhere)

Runs (each a process of its own, logs in OUT_DIR): the program plain; under pyrun with
``blocks`` (edges mode), ``blocks=warps``, and ``blocks,kernel-name=^trips$,launch-skip=1,
launch-count=2``; the program again with the framework hooks installed directly, reading each
launch's counters into OUT_DIR/blocks_recording.json; that recording replayed by
``gpu=simulated``. ``--quick`` (about a minute on an H100) leaves out the ``blocks=warps`` run
and the HTML reports, and pyprof copies no sources: the same checks of the rest, the same
recording. pyrun's steps run with ``PYHPCTK_PYRUN_CPU_TIMER=signal`` (CPU samples through a
realtime signal, never SIGTRAP, which LLVM's crash recovery took for a crash in Triton's
compile on the H100). Checks (one ``ok``/``ERR`` line each, OUT_DIR/blocks_device.log): outputs
bit-identical to the plain run's; for every kernel, pyview's rows below it (source lines, in a
loop or not) equal what the paths the inputs imply give (Triton's programs and CuPy's threads
walked through the kernel's CFG, ``tests/ptx_paths.py``); launches counted; the summary's
registers and occupancy lines; the filter's choice and its reason; the replay equal to the
measurement. Exit status 1 if a check failed. Python 3.12 with torch, triton and cupy; cupti-
python from the repository's ``.whl/`` when it is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "data" / "ptx")]

LAUNCHES = 3
QUICK = False  # --quick: the module docstring
PROGRAMS = 64  # Triton: one program (4 warps, 128 threads) per row of a CSR-like array
WARPS, THREADS = 4, 128
N, BLOCK, PERIOD = 100_000, 256, 7  # CuPy: thread i sums i % PERIOD values, stores if i < N
FILTER = "blocks,kernel-name=^trips$,launch-skip=1,launch-count=2"

CUPY_SOURCE = r"""
extern "C" __global__ void ragged(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.0f;
    #pragma unroll 1
    for (int k = 0; k < i % 7; ++k) {
        s += x[(i + k) % n];
    }
    if (i < n) {
        y[i] = s;
    }
}
"""


# -- the program: the same launches plain, under pyrun, and recorded -------------------------


def row_starts() -> np.ndarray:
    """Program p of ``trips`` loops ROWS[p + 1] - ROWS[p] times (0 to 9, seeded)."""
    trips = np.random.default_rng(34).integers(0, 10, PROGRAMS)
    return np.concatenate([[0], np.cumsum(trips)]).astype(np.int32)


def program(out: Path, record: Path | None) -> None:
    import cupy as cp
    import torch
    from triton_counted import trips  # the kernel test_gpu_blocks.py compiles for CI

    rows = row_starts()
    row_t = torch.tensor(rows, device="cuda")
    x_t = torch.arange(int(rows[-1]) + 1, dtype=torch.int32, device="cuda")
    x_c = cp.asarray(np.random.default_rng(7).standard_normal(N, dtype=np.float32))
    ragged = cp.RawKernel(CUPY_SOURCE, "ragged", options=("-lineinfo",))
    grid = (N + BLOCK - 1) // BLOCK
    recorder = Recorder() if record is not None else None
    outputs: dict[str, list[np.ndarray]] = {"trips": [], "ragged": []}
    for _ in range(LAUNCHES):
        y_t = torch.zeros(PROGRAMS, dtype=torch.int32, device="cuda")
        compiled = trips[(PROGRAMS,)](row_t, x_t, y_t, num_warps=WARPS)
        torch.cuda.synchronize()
        outputs["trips"].append(y_t.cpu().numpy())
        registers = {"trips": int(getattr(compiled, "n_regs", 0) or 0)}  # the loaded cubin's
        if recorder is not None:
            recorder.read(THREADS, registers["trips"])
        y_c = cp.zeros(N, cp.float32)
        ragged((grid,), (BLOCK,), (x_c, y_c, np.int32(N)))
        cp.cuda.Device().synchronize()
        outputs["ragged"].append(cp.asnumpy(y_c))
        registers["ragged"] = int(ragged.num_regs)  # cuFuncGetAttribute of the loaded kernel
        if recorder is not None:
            recorder.read(BLOCK, registers["ragged"])
    print(" ".join(f"registers {k} {v}" for k, v in registers.items()), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "outputs.npz", **{k: np.stack(v) for k, v in outputs.items()})
    if recorder is not None and record is not None:
        recorder.save(record)


class Recorder:
    """The framework hooks installed directly (no pyrun): each launch's counters, read after it
    and zeroed, become a launch of a block recording."""

    def __init__(self) -> None:
        from pyhpctk.instrument.frameworks import FRAMEWORKS, Collector
        from pyhpctk.instrument.ptx import Mode

        self.collector = Collector(Mode.EDGES)
        self.hooks = [FRAMEWORKS[name]() for name in ("triton", "cupy")]
        for hook in self.hooks:
            hook.install(self.collector)
        self.launches: list[Any] = []
        self.modules: list[Any] = []  # LoadedModule, in the order first seen

    def read(self, threads: int, registers: int) -> None:
        from pyhpctk.measure.gpu.simulated.block_recording import RecordedLaunch

        for loaded in self.collector.loaded_modules:
            for kernel in loaded.kernels:
                counters = loaded.counters(kernel)
                if counters.any():
                    if loaded not in self.modules:
                        self.modules.append(loaded)
                    index = self.modules.index(loaded)
                    self.launches.append(
                        RecordedLaunch(index, kernel, counters.copy(), 0, threads, registers)
                    )
            loaded.reset()

    def save(self, path: Path) -> None:
        from pyhpctk.instrument.ptx import Mode
        from pyhpctk.measure.gpu.simulated.block_recording import (
            BlockRecording,
            RecordedModule,
            save,
        )

        for hook in reversed(self.hooks):
            hook.uninstall()
        modules = [
            RecordedModule(m.framework, m.instrumented.source, tuple(m.kernels))
            for m in self.modules
        ]
        note = f"blocks_device.py on {gpu_name()}, {time.strftime('%Y-%m-%d', time.gmtime())}"
        save(BlockRecording(Mode.EDGES, modules, self.launches, note), path)


def gpu_name() -> str:
    try:
        import torch

        return str(torch.cuda.get_device_name())
    except Exception as error:  # a note only
        return f"an unknown GPU ({error})"


# -- the truth: block counts from the inputs -------------------------------------------------


def trips_threads(ptx: str, kernel: str) -> tuple[list[int], list[int]]:
    """(threads, warps) of every block of ``trips`` in one launch: program p goes round its
    loop ROWS[p + 1] - ROWS[p] times, all its 128 threads together."""
    from ptx_paths import block_counts, loop_decider, walk
    from pyhpctk.instrument.ptx import build, find_loops, parse

    cfg = build(parse(ptx).function(kernel))
    loops, rows = find_loops(cfg), row_starts()
    paths = [
        (walk(cfg, loop_decider(cfg, loops, int(rows[p + 1] - rows[p]))), WARPS, THREADS)
        for p in range(PROGRAMS)
    ]
    threads = block_counts(cfg, paths)
    return threads, [t // 32 for t in threads]


def ragged_threads(ptx: str, kernel: str) -> list[int]:
    """Threads of every block of ``ragged`` in one launch: thread i goes round the loop
    i % 7 times and takes the store's branch when i < N."""
    from ptx_paths import block_counts, loop_decider, walk
    from pyhpctk.instrument.ptx import build, find_loops, parse

    cfg = build(parse(ptx).function(kernel))
    loops = find_loops(cfg)

    def stores(block: int) -> bool:
        return any(
            cfg.statement(i).opcode.startswith("st.global") for i in cfg.blocks[block].instructions
        )

    def stored(inside: bool):  # type: ignore[no-untyped-def]
        def decide(block: int, successors: tuple[int, ...], path: list[int]) -> int:
            wanted = [s for s in successors if stores(s) == inside]
            assert len(wanted) == 1, f"block {block}: no single way to the store"
            return wanted[0]

        return decide

    paths: dict[tuple[int, bool], list[int]] = {}
    count: dict[tuple[int, bool], int] = {}
    for i in range(((N + BLOCK - 1) // BLOCK) * BLOCK):
        key = (i % PERIOD, i < N)
        count[key] = count.get(key, 0) + 1
        if key not in paths:
            paths[key] = walk(cfg, loop_decider(cfg, loops, key[0], stored(key[1])))
    return block_counts(cfg, [(paths[key], 0, n) for key, n in count.items()])


# -- the runs ---------------------------------------------------------------------------------

LOG: list[str] = []
WORK = Path(os.environ.get("BLOCKS_WORK", "/tmp/blocks_work"))  # measurements and databases
RESULTS: list[dict[str, Any]] = []


def say(text: str) -> None:
    print(text, flush=True)
    LOG.append(text)


def check(what: str, got: object, expected: object) -> bool:
    ok = got == expected
    say(f"{'ok ' if ok else 'ERR'} {what}: {got}{'' if ok else f' expected {expected}'}")
    RESULTS.append(
        {"check": what, "got": str(got)[:2000], "expected": str(expected)[:2000], "ok": ok}
    )
    return ok


def run(out: Path, name: str, argv: list[str], env: dict[str, str], timeout: int = 200) -> int:
    """One step: its output in OUT/<name>.txt; its status said."""
    began = time.monotonic()
    with open(out / f"{name}.txt", "w") as log:
        try:
            done = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False
            )
            status = done.returncode
        except subprocess.TimeoutExpired:
            status = 124
    say(
        f"== {name}: status {status} in {time.monotonic() - began:.1f} s ({' '.join(argv[:6])} ...)"
    )
    return status


def environment(out: Path) -> dict[str, str]:
    """The children's environment: pyhpctk from this checkout, cupti-python from .whl/ when
    missing, Triton's bundled ptxas on PATH (registers before and after)."""
    env = dict(os.environ)
    site = Path("/tmp/blocks_site")
    paths = [str(ROOT / "src")]
    try:
        import cupti  # noqa: F401
    except ImportError:
        wheels = sorted((ROOT / ".whl").glob("*.whl"))
        wanted = [
            w for w in wheels if w.name.startswith(("cupti_python", "pyelftools", "capstone"))
        ]
        if wanted and not site.exists():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--target", str(site), *map(str, wanted)], check=False)  # fmt: skip
        paths.append(str(site))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        import triton

        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        if (ptxas / "ptxas").exists():
            env["PATH"] = f"{env.get('PATH', '')}{os.pathsep}{ptxas}"
    except ImportError:
        pass
    env.update(PYTHONUNBUFFERED="1", TRITON_DEFAULT_FP_FUSION="1",
               TRITON_CACHE_DIR="/tmp/blocks_tc", CUPY_CACHE_DIR="/tmp/blocks_cc")  # fmt: skip
    smi = (
        subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False)
        if shutil.which("nvidia-smi")
        else None
    )
    (out / "env.txt").write_text(
        f"{gpu_name()}\n{sys.version}\nPYTHONPATH={env['PYTHONPATH']}\n{smi.stdout if smi else ''}"
    )
    return env


def view(out: Path, name: str, env: dict[str, str]) -> str:
    """pyprof of m_<name>, then pyview's CSV of it (in the work folder: the whole tree), its
    text view of the block metrics (OUT/pyview_<name>_text.txt) and, unless quick, its HTML
    report. An empty CSV when pyview gave none (the checks then fail one line each)."""
    from block_rows import pyview_argv

    database = WORK / f"db_{name}"
    prof = [sys.executable, "-m", "pyhpctk.cli.pyprof", "-o", str(database)]
    if QUICK:
        prof += ["--no-sources", "-j", "4"]
    run(out, f"pyprof_{name}", [*prof, str(WORK / f"m_{name}")], env)
    viewer = [sys.executable, "-m", "pyhpctk.cli.pyview"]
    run(WORK, f"pyview_{name}", [*viewer, *pyview_argv(str(database))], env)
    shown = [str(database), "-m", "GPTX:INST", "-m", "GPTX:BLK", "-m", "GKER:COUNT"]
    run(out, f"pyview_{name}_text", [*viewer, *shown], env)
    if not QUICK:
        html = [*viewer, *shown, "--html", str(database / "report.html")]
        run(WORK, f"pyview_{name}_html", html, env)
    csv_path = WORK / f"pyview_{name}.txt"
    return csv_path.read_text() if csv_path.exists() else ""


def ptx_of(measurement: str, kernel: str) -> str:
    for path in sorted((WORK / measurement / "ptxbins").glob("*.ptx")):
        text = path.read_text()
        if f".entry {kernel}(" in text or f".entry {kernel} (" in text:
            return text
    raise LookupError(f"no saved PTX holds {kernel} in {measurement}/ptxbins")


def check_kernels(
    out: Path, name: str, csv_text: str, warps: bool, counted: dict[str, int]
) -> dict[str, Any]:
    """pyview's rows below each kernel against the truth, ``counted[kernel]`` launches."""
    shown = {}
    for kernel, launches in counted.items():
        try:  # a step that failed before: one failed check, the others still run
            shown[kernel] = check_kernel(name, csv_text, warps, kernel, launches)
        except Exception as error:
            check(f"{name}: {kernel}: checked", repr(error)[:300], "checked")
    return shown


def check_kernel(name: str, csv_text: str, warps: bool, kernel: str, launches: int) -> Any:
    from block_rows import expected_rows, rows_below, scaled, shown_rows

    ptx = ptx_of(f"m_{name}", kernel)
    below = rows_below(csv_text, kernel)
    rows = shown_rows(below)
    counted = int(float(below[0]["GPTX:COUNT (I)"] or 0))
    check(f"{name}: {kernel}: launches counted (GPTX:COUNT)", counted, launches)
    ran = int(float(below[0]["GKER:COUNT (I)"] or 0))
    check(f"{name}: {kernel}: launches (GKER:COUNT)", ran, LAUNCHES)
    if kernel == "trips":
        threads, warp_counts = trips_threads(ptx, kernel)
        want = expected_rows(ptx, threads, warp_counts if warps else None, kernel)
        check(f"{name}: trips: every line's counts", rows, scaled(want, launches))
        return rows
    want = scaled(expected_rows(ptx, ragged_threads(ptx, kernel), None, kernel), launches)
    got = {k: [v[0], v[2]] for k, v in rows.items()}
    threads_only = {k: [v[0], v[2]] for k, v in want.items()}
    check(f"{name}: ragged: every line's thread counts", got, threads_only)
    if warps:  # divergent threads: between a warp per 32 threads and a warp per thread
        bounded = all(-(-v[0] // 32) <= v[1] <= v[0] for v in rows.values())
        check(f"{name}: ragged: warp counts between threads/32 and threads", bounded, True)
    return rows


def measured_runs() -> tuple[tuple[str, str], ...]:
    """(name, the -e option after gpu=nvidia) of each pyrun step; --quick leaves out warps."""
    runs = (("edges", "blocks"), ("warps", "blocks=warps"), ("filter", FILTER))
    return tuple(r for r in runs if not (QUICK and r[0] == "warps"))


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    began = time.monotonic()
    env = environment(out)
    measuring = {**env, "PYHPCTK_PYRUN_CPU_TIMER": "signal"}  # the module docstring
    me = [sys.executable, str(Path(__file__).resolve())]
    pyrun = [sys.executable, "-m", "pyhpctk.cli.pyrun"]
    run(out, "plain", [*me, "--program", str(WORK / "plain")], env)
    for name, option in measured_runs():
        measured = ["-e", f"gpu=nvidia,{option}", "-o", str(WORK / f"m_{name}")]
        argv = [*pyrun, *measured, *me, "--program", str(WORK / name)]
        run(out, f"pyrun_{name}", argv, measuring)
    recording = ["--record", str(out / "blocks_recording.json")]
    run(out, "record", [*me, "--program", str(WORK / "record"), *recording], env)
    for name in [*(n for n, _ in measured_runs()), "record"]:
        try:
            got, plain = np.load(WORK / name / "outputs.npz"), np.load(WORK / "plain/outputs.npz")
            same = all(got[k].tobytes() == plain[k].tobytes() for k in ("trips", "ragged"))
        except OSError as error:
            same = repr(error)
        check(f"{name}: outputs bit-identical to the plain run's", same, True)
    shown = {}
    for name, warps in (("edges", False), ("warps", True)):
        if QUICK and warps:
            continue
        counted = {"trips": LAUNCHES, "ragged": LAUNCHES}
        shown[name] = check_kernels(out, name, view(out, name, env), warps, counted)
        summary = (out / f"pyrun_{name}.txt").read_text()
        for kernel in counted:
            line = next((ln for ln in summary.splitlines() if f"blocks:   {kernel}:" in ln), "")
            say(f"    {line}")
            loaded = re.search(rf"registers {kernel} (\d+)", summary)  # the driver's count
            told = re.search(r"registers \d+ -> (\d+) \(ptxas[^)]*\)(?:, (\d+) at launch)?", line)
            what = f"{name}: {kernel}: registers at launch as the summary says"
            if told and loaded:
                check(what, int(told[2] or told[1]), int(loaded[1]))
            else:
                check(what, line or "no summary line", "a summary line and the driver's count")
            check(
                f"{name}: {kernel}: registers before -> after in the summary",
                " -> " in line and "registers" in line,
                True,
            )
    check_kernels(out, "filter", view(out, "filter", env), False, {"trips": 2})
    summary = (out / "pyrun_filter.txt").read_text()
    check(
        "filter: ragged left out, with the reason",
        "not counted: ragged: cupy: kernel-name=^trips$ leaves it out" in summary,
        True,
    )
    replay(out, measuring, shown.get("edges", {}))
    (out / "blocks_device.json").write_text(json.dumps(RESULTS, indent=1))
    with tarfile.open(out / "edges_run.tgz", "w:gz") as tar:  # the measurement and database
        for name in ("m_edges", "db_edges"):
            if (WORK / name).exists():
                tar.add(WORK / name, arcname=name)
    failures = [r for r in RESULTS if not r["ok"]]
    say(f"{len(RESULTS) - len(failures)} checks passed, {len(failures)} failed "
        f"in {time.monotonic() - began:.0f} s{' (--quick)' if QUICK else ''}")  # fmt: skip
    (out / "blocks_device.log").write_text("\n".join(LOG) + "\n")
    return 1 if failures else 0


REPLAY = """
from pyhpctk.measure.gpu import simulated_runtime

gpu = simulated_runtime()
for _ in range({launches}):
    gpu.launch()
gpu.synchronize()
"""


def replay(out: Path, env: dict[str, str], measured: dict[str, Any]) -> None:
    """The recording through gpu=simulated: the same rows as the measurement on the GPU."""
    from block_rows import rows_below, shown_rows

    recording = out / "blocks_recording.json"
    if not recording.exists():
        check("record: a recording written", False, True)
        return
    launches = len(json.loads(recording.read_text())["launches"])
    check("record: launches recorded", launches, 2 * LAUNCHES)
    (out / "replay.py").write_text(REPLAY.format(launches=launches))
    argv = [sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", f"gpu=simulated,blocks={recording}",
            "-o", str(WORK / "m_replay"), sys.executable, str(out / "replay.py")]  # fmt: skip
    run(out, "pyrun_replay", argv, env)
    text = view(out, "replay", env)
    for kernel, rows in measured.items():
        try:
            check(
                f"replay: {kernel}: the rows measured on the GPU",
                shown_rows(rows_below(text, kernel)),
                rows,
            )
        except Exception as error:
            check(f"replay: {kernel}: checked", repr(error)[:300], "checked")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--program":
        record = Path(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--record" else None
        program(Path(sys.argv[2]), record)
    elif len(sys.argv) in (2, 3) and sys.argv[2:] in ([], ["--quick"]):
        QUICK = sys.argv[2:] == ["--quick"]
        sys.exit(main(Path(sys.argv[1])))
    else:
        sys.exit("usage: blocks_device.py OUT_DIR [--quick]")

"""Benchmark: pyprof-mpi on a synthetic measurement directory, for 1..N MPI ranks.

A generator writes a measurement directory like hpcrun's: thousands of ``.hpcrun`` profiles
(CPU threads with ``CPUTIME (sec)``, GPU streams with ``GKER (sec)`` and integer ``GINS``), each a
calling context tree of tens of thousands of nodes drawn from one random recursive tree (so they
unify into a shared tree with per-profile variation), sparse values on about half the nodes, and
an ``.hpctrace`` beside every profile. Then, for each rank count of ``--ranks``, the benchmark
launches ``mpiexec -n N python benchmarks/pyprof.py --worker ...``, whose ranks run the
analysis driver in-process (``pipeline.run`` on ``MPI.COMM_WORLD``) and report wall time, each
rank's peak RSS and each rank's seconds per stage (printed as a table per rank count, so the
critical path is visible). ``--serial`` first runs serial pyprof (the driver on one process, no
MPI; shown as rank count ``pyprof``); ``--src DIR`` measures another checkout's ``src/`` (to
measure before a change). It prints a table: input MB/s (total and per core), profiles/s, CPU
seconds of the busiest rank (steadier than wall time on a shared machine), peak
RSS per rank against ``--memory-limit``, database size against a dense layout, and parallel
efficiency relative to the first MPI rank count. ``wall`` and ``efficiency`` are the driver's
(``pipeline.run`` between two barriers: listing the inputs counts, starting the processes does
not); ``process wall`` is the whole ``mpiexec`` launch (interpreters, imports, MPI's start and
end, the result's gather), and its efficiency is printed beside the driver's. Every database
is compared byte for byte with the first one (any rank count must give the same).

Runs with only Python >= 3.11, numpy, click and mpi4py present, from a checkout::

    PYTHONPATH=src python3 benchmarks/pyprof.py --quick --ranks 1,2,4,8,16

The launcher is ``--mpiexec`` (default: the one beside the Python interpreter, else ``mpiexec``
on PATH); Open MPI gets ``--oversubscribe`` (and ``--allow-run-as-root`` when run as root),
detected from ``mpiexec --version``. Everything goes to a temporary directory (``--dir``),
removed at the end unless ``--keep``.

``--ceiling N`` measures what this machine allows N ranks at best, with no analysis driver in
the way: the input is split into N slices (every N-th profile), serial pyprof analyses each
slice alone, one after the other, and then all N at once, one process a slice (no MPI, nothing
shared but the machine). ``ceiling efficiency`` = the slices' summed walls alone / (N x the
slowest wall of the N at once): N processes that never wait for each other would reach it, and
the rank counts' efficiencies are read against it. ``--copies N`` bounds it from the other side:
serial pyprof on the whole input alone, then N copies of that same analysis at once (one
process each, no MPI); ``bound`` = the wall alone / the slowest wall at once, the efficiency N
ranks would reach if each did 1/N of one rank's work at the speed the machine gives N busy
copies. No fixed part per analysis flatters it, but N whole working sets share the caches
where N ranks would hold 1/N of one each, so ranks might do a little better. Both print the
machine's CPU topology (logical CPUs, physical cores, threads a core): ranks on a core's second
hardware thread share its execution units.

``--allocations`` compiles a small ``malloc`` counter (C, with ``cc``), preloads it into every
worker (``LD_PRELOAD``) and adds per stage the bytes allocated (arrays of 4 KiB and more: numpy's
temporaries and copies; every thread of every rank, summed over ranks) per byte of input: how
much fresh memory a stage touches for each byte it reads, the cost that grows when many ranks
share a machine's memory bandwidth. It slows the run a little; compare it between runs, not
the times.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# The pyhpctk to measure: this checkout's, or another's (--src, to measure before a change).
SRC = Path(os.environ.get("PYPROF_BENCH_SRC") or HERE.parent / "src")
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from pyhpctk.formats import hpcrun, hpctrace  # noqa: E402
from pyhpctk.formats.hpcrun_model import (  # noqa: E402
    CCT_NODE_DTYPE,
    ID_TUPLE_ELEMENT_DTYPE,
    METRIC_VALUE_DTYPE,
    NODE_START_DTYPE,
    TRACE_RECORD_DTYPE,
    HpcrunProfile,
    HpctraceFile,
    LoadModule,
    MetricDescriptor,
    placeholder_ip,
)

REAL = bytes([1, 0, 2, 0, 0, 0, 1, 1]) + bytes(8)  # raw, real, shown, percent
INTEGER = bytes([1, 0, 1, 0, 0, 0, 1, 1]) + bytes(8)  # raw, integer
KIND_RANK, KIND_THREAD, KIND_GPUCONTEXT, KIND_GPUSTREAM = 2, 3, 5, 6
MODULES = ["/opt/app/bin/app", "/opt/app/lib/libsolver.so", "/usr/lib/libc.so.6"]

SIZES = {
    "quick": {"profiles": 1024, "nodes": 20_000},
    "default": {"profiles": 2048, "nodes": 40_000},
}


# --------------------------------------------------------------------------------------------
# Generator


def base_tree(nodes: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random recursive tree (depth ~ ln n): parent, load module (1..3), offset per node."""
    parent = np.zeros(nodes, dtype=np.int64)
    parent[0] = -1  # the "| Main" placeholder
    parent[1:] = (rng.random(nodes - 1) * np.arange(1, nodes)).astype(np.int64)
    module = rng.integers(1, len(MODULES) + 1, size=nodes)
    offset = rng.integers(0x1000, 0x400000, size=nodes).astype(np.uint64)
    depth = np.zeros(nodes, dtype=np.int64)
    for i in range(1, nodes):  # once per benchmark: fine in Python
        depth[i] = depth[parent[i]] + 1
    return parent, module, offset


def _closure(keep: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """``keep`` plus every ancestor of a kept node."""
    frontier = np.flatnonzero(keep)
    while len(frontier):
        up = parent[frontier]
        up = up[up >= 0]
        up = up[~keep[up]]
        keep[up] = True
        frontier = np.unique(up)
    return keep


def make_profile(
    number: int,
    tree: tuple[np.ndarray, np.ndarray, np.ndarray],
    rng: np.random.Generator,
    gpu: bool,
    trace_length: int,
) -> tuple[HpcrunProfile, HpctraceFile]:
    """One profile: 90% of the base tree's nodes, values on about half, and its trace."""
    parent, module, offset = tree
    n = len(parent)
    keep = _closure(rng.random(n) < 0.9, parent)
    keep[0] = True
    nodes = np.flatnonzero(keep)
    renumber = np.full(n, -1, dtype=np.int64)
    renumber[nodes] = np.arange(len(nodes))
    ids = 2 * (np.arange(len(nodes), dtype=np.int64) + 1)
    cct = np.zeros(len(nodes), CCT_NODE_DTYPE)
    cct["id"] = ids
    cct["parent_id"] = np.where(parent[nodes] >= 0, ids[renumber[np.maximum(parent[nodes], 0)]], 0)
    cct["lm_id"] = np.where(nodes == 0, 0, module[nodes])
    cct["lm_ip"] = np.where(nodes == 0, np.uint64(placeholder_ip("| Main  ")), offset[nodes])
    cct["flags"] = 1
    if gpu:
        metrics = [
            MetricDescriptor("GKER (sec)", flags=REAL),
            MetricDescriptor("GINS", flags=INTEGER),
        ]
    else:
        metrics = [MetricDescriptor("CPUTIME (sec)", flags=REAL)]
    with_values = np.flatnonzero(rng.random(len(nodes)) < 0.5)
    with_values = with_values[with_values > 0]
    per_node = rng.integers(1, len(metrics) + 1, size=len(with_values))
    value_node = np.repeat(with_values, per_node)
    first = np.cumsum(per_node) - per_node
    metric = np.arange(len(value_node)) - np.repeat(first, per_node)
    values = np.zeros(len(value_node), METRIC_VALUE_DTYPE)
    values["metric"] = metric
    real = rng.random(len(value_node)) * 1e-3 + 1e-6
    integer = rng.integers(1, 1000, size=len(value_node)).astype(np.uint64)
    is_integer = gpu & (metric == 1)
    values["value_bits"] = np.where(is_integer, integer, real.view(np.uint64))
    starts = np.zeros(len(with_values), NODE_START_DTYPE)
    starts["node_id"] = ids[with_values]
    starts["start"] = first
    thread = number
    if gpu:
        elements = [(KIND_RANK, 0, 0), (KIND_GPUCONTEXT, 1, 1), (KIND_GPUSTREAM, thread, thread)]
    else:
        elements = [(KIND_RANK, 0, 0), (KIND_THREAD, thread, thread)]
    id_tuple = np.zeros(len(elements), ID_TUPLE_ELEMENT_DTYPE)
    for i, (kind, physical, logical) in enumerate(elements):
        id_tuple[i] = (kind, physical, logical)
    profile = HpcrunProfile(
        nvpairs=[("program-name", "bench"), ("mpi-rank", "0"), ("thread-id", str(thread))],
        load_modules=[LoadModule(i + 1, path) for i, path in enumerate(MODULES)],
        cct=cct,
        metrics=metrics,
        id_tuple=id_tuple,
        values=values,
        node_starts=starts,
    )
    records = np.zeros(trace_length, TRACE_RECORD_DTYPE)
    records["time"] = 1_700_000_000_000_000_000 + np.cumsum(
        rng.integers(1000, 100_000, size=trace_length)
    ).astype(np.uint64)
    records["node_id"] = ids[rng.choice(with_values, size=trace_length)]
    return profile, HpctraceFile(flags=0, records=records)


def generate(
    directory: Path,
    profiles: int,
    nodes: int,
    seed: int = 1,
    gpu_share: float = 0.25,
    trace_length: int = 2000,
) -> int:
    """Write a measurement directory; returns its size in bytes."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    tree = base_tree(nodes, rng)
    total = 0
    every = max(1, round(1 / gpu_share)) if gpu_share > 0 else 0
    for number in range(profiles):
        # As hpcrun names them, each process's GPU streams sort among its threads.
        gpu = every > 0 and number % every == every - 1
        profile, trace = make_profile(number, tree, rng, gpu, trace_length)
        stem = f"bench-000000-{number:03d}-a0000001-4242-0"
        hpcrun.write(profile, directory / f"{stem}.hpcrun")
        hpctrace.write(trace, directory / f"{stem}.hpctrace")
        total += (directory / f"{stem}.hpcrun").stat().st_size
        total += (directory / f"{stem}.hpctrace").stat().st_size
    return total


# --------------------------------------------------------------------------------------------
# Worker: one rank of an mpiexec launch


def worker(args: argparse.Namespace) -> int:
    """One rank: the analysis driver on the measurement; rank 0 prints a JSON line (wall time,
    every rank's peak RSS and seconds per stage)."""
    import inspect
    import resource

    from pyhpctk.analysis.options import ProfOptions
    from pyhpctk.analysis.pipeline import run

    try:
        from pyhpctk.cli.pyprof import parse_size
    except ImportError:  # a checkout from before the one driver (--src)
        from pyhpctk.cli.pyprof_mpi import parse_size

    counter = os.environ.get("PYPROF_BENCH_ALLOC")
    if counter:
        import ctypes

        from pyhpctk.analysis import timing

        library = ctypes.CDLL(counter)
        library.allocount_bytes.restype = ctypes.c_ulonglong
        if hasattr(timing, "count_allocations"):  # not in older checkouts (--src)
            timing.count_allocations(lambda: int(library.allocount_bytes()))
    limit = parse_size(args.memory_limit) if args.memory_limit else None
    capped = "memory_limit" in inspect.signature(ProfOptions.build).parameters  # not before
    extra = {"memory_limit": limit} if limit and capped else {}
    options = ProfOptions.build(
        [args.measurement], output=args.output, copy_sources=False, jobs=args.jobs, **extra
    )
    if args.serial:  # pyprof: the driver on this process alone, no MPI
        start_at = float(os.environ.get("PYPROF_BENCH_START_AT") or 0)  # --ceiling: all at once
        time.sleep(max(0.0, start_at - time.time()))
        start, cpu = time.perf_counter(), time.process_time()
        report = run(options)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        timings = getattr(report, "timings", {})  # older checkouts (--src) report none
        result = {"status": 0, "wall": wall, "rss": [rss], "cpu": [cpu], "stages": [timings]}
        print("RESULT " + json.dumps(result))
        return 0
    from pyhpctk.analysis.comm import world

    comm = world()
    pin = os.environ.get("PYPROF_BENCH_PIN")  # rank i on the i-th CPU listed, whatever the MPI
    if pin:
        os.sched_setaffinity(0, {int(pin.split(",")[comm.rank])})
    comm.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    if "comm" in inspect.signature(run).parameters:
        report = run(options, comm=comm)
    else:  # a checkout from before the one driver (--src): pyprof-mpi's own entry point
        from pyhpctk.analysis.distributed import run_distributed

        report = run_distributed(options, comm, limit)
    cpu = time.process_time() - cpu
    comm.barrier()
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    cpus = sorted(os.sched_getaffinity(0))
    everyone = comm.gather((rss, cpu, getattr(report, "timings", {}), cpus))
    if everyone is not None:
        result = {
            "status": 0,
            "wall": wall,
            "rss": [r for r, _, _, _ in everyone],
            "cpu": [c for _, c, _, _ in everyone],
            "stages": [t for _, _, t, _ in everyone],
            "cpus": [c for _, _, _, c in everyone],
        }
        print("RESULT " + json.dumps(result))
    return 0


# keys of the split of a stage (pyhpctk.analysis.timing)
SPLITS = ("mpi: ", "cpu: ", "alloc: ", "lap cpu: ")


def stage_table(n: int, stages: list[dict[str, float]]) -> str:
    """Seconds per stage on every rank (one row per rank): where the critical path runs."""
    names = list(
        dict.fromkeys(name for rank in stages for name in rank if not name.startswith(SPLITS))
    )
    lines = [
        f"{n} ranks, seconds per stage:",
        "| rank | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for rank, timings in enumerate(stages):
        cells = [f"{timings[name]:.2f}" if name in timings else "" for name in names]
        lines.append(f"| {rank} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lap_cpu_table(n: int, stages: list[dict[str, float]]) -> str:
    """CPU seconds of each stage part on every rank, in its main thread outside collectives
    (``lap cpu:``; what a part costs a rank where wall-clock time means little), and the sum
    over ranks."""
    names = list(dict.fromkeys(k[9:] for rank in stages for k in rank if k.startswith("lap cpu: ")))
    if not names:
        return ""
    lines = [
        f"{n} ranks, CPU seconds per stage part (main thread, outside collectives):",
        "| rank | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for rank, timings in enumerate(stages):
        cells = [f"{timings.get('lap cpu: ' + k, 0.0):.3f}" for k in names]
        lines.append(f"| {rank} | " + " | ".join(cells) + " |")
    sums = [sum(t.get("lap cpu: " + k, 0.0) for t in stages) for k in names]
    lines.append("| sum | " + " | ".join(f"{v:.3f}" for v in sums) + " |")
    return "\n".join(lines)


def work_table(
    n: int, stages: list[dict[str, float]], base: dict[str, float] | None, input_bytes: int = 0
) -> tuple[str, dict[str, float]]:
    """Per stage: wall seconds (rank 0, of which in MPI collectives; the slowest rank) and CPU
    seconds of work outside collectives (rank 0, the busiest rank, the sum over ranks, and that
    sum over ``base``'s, the first run's: 1.00 when the work divides among ranks with no
    overhead); with ``--allocations``, the bytes allocated summed over ranks per input byte.
    Returns the table and this run's sums."""
    names = [
        k[len("cpu: ") :] for k in dict.fromkeys(k for t in stages for k in t) if k[:5] == "cpu: "
    ]
    counted = input_bytes > 0 and any("alloc: " + name in t for t in stages for name in names)
    lines = [
        f"{n} ranks, wall and work per stage (work: CPU s outside MPI collectives, all threads):",
        "| stage | rank 0 wall (in MPI) | slowest wall | rank 0 work | busiest work "
        "| work summed over ranks | sum / first run's |"
        + (" allocated summed over ranks (MB) | per input byte |" if counted else ""),
        "| --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if counted else ""),
    ]

    def allocated(names: list[str]) -> str:
        if not counted:
            return ""
        total = sum(t.get("alloc: " + name, 0.0) for t in stages for name in names)
        return f" {total / 1e6:.0f} | {total / input_bytes:.2f} |"

    sums: dict[str, float] = {}
    for name in names:
        work = [t.get("cpu: " + name, 0.0) for t in stages]
        sums[name] = total = sum(work)
        ratio = f"{total / base[name]:.2f}" if base and base.get(name) else "-"
        lines.append(
            f"| {name} | {stages[0].get(name, 0.0):.2f} ({stages[0].get('mpi: ' + name, 0.0):.2f})"
            f" | {max(t.get(name, 0.0) for t in stages):.2f} | {work[0]:.2f} | {max(work):.2f}"
            f" | {total:.2f} | {ratio} |" + allocated([name])
        )
    work = [sum(t.get("cpu: " + name, 0.0) for name in names) for t in stages]
    total = sum(work)
    ratio = f"{total / sum(base.values()):.2f}" if base else "-"
    lines.append(
        f"| all | {sum(stages[0].get(name, 0.0) for name in names):.2f} "
        f"({sum(stages[0].get('mpi: ' + name, 0.0) for name in names):.2f}) | | "
        f"{work[0]:.2f} | {max(work):.2f} | {total:.2f} | {ratio} |" + allocated(names)
    )
    return "\n".join(lines), sums


# --------------------------------------------------------------------------------------------
# Driver


def launcher(mpiexec: str) -> list[str]:
    """The mpiexec command with the options its MPI needs (detected from ``--version``)."""
    try:
        version = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SystemExit(f"cannot run {mpiexec}: {error}") from error
    command = [mpiexec]
    if "Open MPI" in version or "OpenRTE" in version or "open-mpi" in version.lower():
        command.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-run-as-root")
    return command


def default_mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def database_bytes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()}


def same_database(a: Path, b: Path) -> bool:
    names = ("meta.db", "profile.db", "cct.db", "trace.db")
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names if (a / n).exists())


def dense_bytes(db: Path) -> int:
    """A dense layout of the same values: (profiles + 1) x contexts x metric ids x 8 bytes,
    once profile-major and once context-major, as profile.db + cct.db hold them."""
    from pyhpctk.formats import cctdb, metadb, profiledb

    meta = metadb.read(db / "meta.db")
    n_profiles = len(profiledb.read(db / "profile.db").profiles)
    n_contexts = cctdb.read(db / "cct.db").n_contexts
    ids = sum(len(m.scope_insts) for m in meta.metrics)
    return 2 * n_profiles * n_contexts * ids * 8


def launch(
    mpiexec: list[str],
    n: int,
    measurement: Path,
    output: Path,
    limit: str | None,
    env: dict[str, str],
    jobs: int = 1,
) -> dict[str, object]:
    """One ``mpiexec -n N`` run of the worker (``n`` 0: serial pyprof, no mpiexec); its RESULT
    line (wall, per-rank peak RSS and stage times)."""
    worker = [sys.executable, str(Path(__file__).resolve()), "--worker", "--jobs", str(jobs)]
    command = [*worker, "--serial"] if n == 0 else [*mpiexec, "-n", str(n), *worker]
    command += ["--output", str(output), "--measurement", str(measurement)]
    command += ["--memory-limit", limit or ""]
    # The previous run's database (and the generated input) are still being written back to
    # disk: that would steal a core from some rank of this run, which every rank then waits for.
    os.sync()
    t0 = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    outer = time.perf_counter() - t0
    result = next(
        (
            json.loads(line[len("RESULT ") :])
            for line in done.stdout.splitlines()
            if line.startswith("RESULT ")
        ),
        None,
    )
    if done.returncode != 0 or result is None or result["status"] != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"pyprof-mpi on {n} ranks failed ({done.returncode})")
    result["outer"] = outer
    return dict(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2", help="rank counts, e.g. 1,2,4,8,16")
    parser.add_argument("--quick", action="store_true", help="the quick size (< 3 min on 16)")
    parser.add_argument("--profiles", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=None, help="nodes of the base tree")
    parser.add_argument("--trace-length", type=int, default=2000)
    parser.add_argument(
        "--memory-limit",
        default="256M",
        help="--memory-limit of the second, capped run per rank count ('' for none)",
    )
    parser.add_argument("--mpiexec", default=None)
    parser.add_argument("--dir", default=None, help="where the temporary files go")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--measurement", default=None, help="use this directory (no generation)")
    parser.add_argument(
        "--serial",
        action="store_true",
        help="first run serial pyprof (the driver on one process, no MPI) as rank count 0",
    )
    parser.add_argument("--jobs", type=int, default=1, help="-j: threads per rank")
    parser.add_argument(
        "--src", default=None, help="the pyhpctk src/ directory to measure (default: this one)"
    )
    parser.add_argument(
        "--allocations",
        action="store_true",
        help="count the bytes each stage allocates (a malloc counter preloaded, built with cc)",
    )
    parser.add_argument(
        "--ceiling",
        type=int,
        default=0,
        metavar="N",
        help="also run N serial pyprofs on 1/N of the input each, alone and at once",
    )
    parser.add_argument(
        "--copies",
        type=int,
        default=0,
        metavar="N",
        help="also run serial pyprof on the whole input alone, then N copies of it at once",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.output = Path(args.output)
        return worker(args)

    size = SIZES["quick" if args.quick else "default"]
    profiles = args.profiles or size["profiles"]
    nodes = args.nodes or size["nodes"]
    ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    if args.serial:
        ranks = [0, *ranks]
    mpiexec = launcher(args.mpiexec or default_mpiexec())
    limit = args.memory_limit or None
    work = Path(tempfile.mkdtemp(prefix="pyprof-bench-", dir=args.dir))
    try:
        if args.measurement:
            measurement = Path(args.measurement)
            input_bytes = sum(p.stat().st_size for p in measurement.iterdir() if p.is_file())
            profiles = len(list(measurement.glob("*.hpcrun")))
        else:
            measurement = work / "bench.m"
            t0 = time.perf_counter()
            input_bytes = generate(measurement, profiles, nodes, trace_length=args.trace_length)
            print(
                f"generated {profiles} profiles x ~{int(nodes * 0.9)} nodes, "
                f"{input_bytes / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s",
                file=sys.stderr,
            )
        env = dict(os.environ)
        src = Path(args.src).resolve() if args.src else SRC
        env["PYPROF_BENCH_SRC"] = str(src)
        env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
        if args.allocations:
            counter = build_counter(work)
            env["PYPROF_BENCH_ALLOC"] = str(counter)
            env["LD_PRELOAD"] = " ".join(filter(None, [str(counter), env.get("LD_PRELOAD")]))
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        rows = []
        first_db = work / "db-first"
        base_work: dict[str, float] | None = None
        for n in ranks:
            output = work / f"db-{n}"
            fast = launch(mpiexec, n, measurement, output, None, env, args.jobs)
            capped = None
            if limit and not (n == 0 and args.src):  # before the one driver, no cap serially
                capped_db = work / f"db-{n}-capped"
                capped = launch(mpiexec, n, measurement, capped_db, limit, env, args.jobs)
            same = True
            if not first_db.exists():
                output.rename(first_db)
            else:
                same = same_database(first_db, output)
                shutil.rmtree(output)
            if capped is not None:
                same = same and same_database(first_db, work / f"db-{n}-capped")
                shutil.rmtree(work / f"db-{n}-capped")
            rows.append((n, fast, capped, same))
            print(
                f"{n or 'serial pyprof, no'} ranks: {fast['wall']:.2f} s"
                + (f", capped {capped['wall']:.2f} s" if capped else ""),
                file=sys.stderr,
            )
            print(stage_table(n, fast["stages"]), file=sys.stderr)  # type: ignore[arg-type]
            table, sums = work_table(n, fast["stages"], base_work, input_bytes)  # type: ignore[arg-type]
            if sums:
                print(table, file=sys.stderr)
                base_work = base_work or sums
            laps = lap_cpu_table(n, fast["stages"])  # type: ignore[arg-type]
            if laps:
                print(laps, file=sys.stderr)
            if capped is not None:
                print("capped: " + stage_table(n, capped["stages"]), file=sys.stderr)  # type: ignore[arg-type]
        if args.ceiling > 1 or args.copies > 1:
            print(topology())
        if args.ceiling > 1:
            print(ceiling(measurement, args.ceiling, work, env))
        if args.copies > 1:
            print(copies(measurement, args.copies, work, env))
        files = database_bytes(first_db)
        stored = files.get("profile.db", 0) + files.get("cct.db", 0)
        dense = dense_bytes(first_db)
        print()
        print(
            f"input: {profiles} profiles, {input_bytes / 1e6:.1f} MB; database: "
            + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(files.items()))
            + f"; profile.db + cct.db = {stored / 1e6:.1f} MB vs a dense layout "
            f"{dense / 1e6:.1f} MB ({stored / dense:.3f} of dense)"
        )
        print()
        head = (
            "| ranks | wall (s) | MB/s | MB/s per core | profiles/s | efficiency "
            "| process wall (s) | efficiency of process walls "
            "| CPU s/rank (max) | peak RSS/rank (MB) |"
        )
        rule = "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        if limit:
            cap_mb = parse_bytes(limit) / 1e6
            head += f" capped {limit}: wall (s) | capped: peak RSS/rank (MB) | <= cap + 200 MB |"
            rule += " --- | --- | --- |"
        print(head + " same DB |")
        print(rule + " --- |")
        mpi_rows = [r for r in rows if r[0] > 0] or rows
        base_n, base_wall = mpi_rows[0][0], float(mpi_rows[0][1]["wall"])  # type: ignore[arg-type]
        base_outer = float(mpi_rows[0][1]["outer"])  # type: ignore[arg-type]
        for n, fast, capped, same in rows:
            wall = float(fast["wall"])  # type: ignore[arg-type]
            rss = max(fast["rss"]) / 1e6  # type: ignore[call-overload]
            rate = input_bytes / 1e6 / wall
            cores = max(n, 1)
            efficiency = f"{(base_wall * base_n) / (wall * n):.0%}" if n else "-"
            outer = float(fast["outer"])  # type: ignore[arg-type]
            whole = f"{(base_outer * base_n) / (outer * n):.0%}" if n else "-"
            line = (
                f"| {n or 'pyprof'} | {wall:.2f} | {rate:.1f} | {rate / cores:.1f} | "
                f"{profiles / wall:.1f} | {efficiency} | {outer:.2f} | {whole} | "
                f"{max(fast['cpu']):.2f} | {rss:.0f} |"  # type: ignore[call-overload]
            )
            if capped is not None:
                capped_rss = max(capped["rss"]) / 1e6  # type: ignore[call-overload]
                ok = capped_rss <= cap_mb + 200
                line += (
                    f" {float(capped['wall']):.2f} | {capped_rss:.0f} | {'yes' if ok else 'NO'} |"  # type: ignore[arg-type]
                )
            print(line + f" {'yes' if same else 'NO'} |")
        return 0 if all(r[3] for r in rows) else 1
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def topology() -> str:
    """Logical CPUs this process may use, the physical cores they sit on, threads a core."""
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores: set[tuple[str, str]] = set()
    for cpu in usable:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (base / "physical_package_id").read_text().strip()
            core = (base / "core_id").read_text().strip()
        except OSError:
            return f"CPU topology: {len(usable)} logical CPUs usable (cores unknown)"
        cores.add((package, core))
    per_core = len(usable) / len(cores) if cores else 0.0
    return (
        f"CPU topology: {len(usable)} logical CPUs usable on {len(cores)} physical cores "
        f"({per_core:.1f} threads a core), {os.cpu_count()} logical CPUs in the machine"
    )


def ceiling(measurement: Path, n: int, work: Path, env: dict[str, str]) -> str:
    """The machine's bound on N-rank efficiency for this input: N slices (every N-th profile and
    its trace), each analysed by serial pyprof alone and then all N at once (see the module's
    docstring); a table with the walls and CPU seconds of both."""
    profiles = sorted(measurement.glob("*.hpcrun"))
    slices = []
    for i in range(n):
        part = work / f"slice-{i}.m"
        part.mkdir()
        for profile in profiles[i::n]:
            (part / profile.name).symlink_to(profile.resolve())
            trace = profile.with_suffix(".hpctrace")
            if trace.exists():
                (part / trace.name).symlink_to(trace.resolve())
        slices.append(part)
    worker = [sys.executable, str(Path(__file__).resolve()), "--worker", "--serial"]

    def command(i: int, tag: str) -> list[str]:
        output = work / f"slice-{i}-{tag}.d"
        return [*worker, "--output", str(output), "--measurement", str(slices[i]),
                "--memory-limit", ""]  # fmt: skip

    def result(text: str) -> dict[str, float]:
        line = next(x for x in text.splitlines() if x.startswith("RESULT "))
        found = json.loads(line[len("RESULT ") :])
        stages = found["stages"][0] if found.get("stages") else {}
        top = {k: float(v) for k, v in stages.items() if ":" not in k}  # whole stages only
        return {"wall": float(found["wall"]), "cpu": float(found["cpu"][0]), **top}

    alone = []
    for i in range(n):
        os.sync()
        done = subprocess.run(command(i, "alone"), env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"serial pyprof on slice {i} failed: {done.stderr[-2000:]}")
        alone.append(result(done.stdout))
    os.sync()
    # every process starts the driver at the same moment, after its interpreter and imports
    together_env = dict(env, PYPROF_BENCH_START_AT=str(time.time() + max(3.0, 0.25 * n)))
    running = [
        subprocess.Popen(
            command(i, "together"), env=together_env, stdout=subprocess.PIPE, text=True
        )
        for i in range(n)
    ]
    outputs = [p.communicate()[0] for p in running]
    if any(p.returncode != 0 for p in running):
        raise SystemExit("a serial pyprof of the N at once failed")
    together = [result(text) for text in outputs]
    walls = sum(r["wall"] for r in alone)
    slowest = max(r["wall"] for r in together)
    cpu_alone, cpu_together = sum(r["cpu"] for r in alone), sum(r["cpu"] for r in together)
    # where a slice's time goes, to hold against one rank's table: a stage whose summed walls
    # alone exceed one rank's on the whole input has a part that does not shrink with it
    names = [k for k in alone[0] if k not in ("wall", "cpu")]
    per_stage = ", ".join(f"{k} {sum(r.get(k, 0.0) for r in alone):.2f}" for k in names)
    return "\n".join([
        f"ceiling: the slices' summed walls alone per stage (s): {per_stage or 'not reported'}",
        f"ceiling: {n} serial pyprofs on 1/{n} of the input each, alone and at once",
        "| slices | summed walls alone (s) | slowest wall at once (s) | mean wall at once / alone "
        "| CPU s at once / alone | ceiling efficiency |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {n} | {walls:.2f} | {slowest:.2f} | "
        f"{sum(r['wall'] for r in together) / walls:.2f} | {cpu_together / cpu_alone:.2f} | "
        f"{walls / (n * slowest):.0%} |",
    ])  # fmt: skip


def copies(measurement: Path, n: int, work: Path, env: dict[str, str]) -> str:
    """Serial pyprof on the whole input alone, then ``n`` copies of it at once (see the module's
    docstring); a table with their walls, CPU seconds and the bound they set."""
    worker = [sys.executable, str(Path(__file__).resolve()), "--worker", "--serial"]

    def command(tag: str) -> list[str]:
        return [*worker, "--output", str(work / f"copy-{tag}.d"), "--measurement",
                str(measurement), "--memory-limit", ""]  # fmt: skip

    def result(text: str) -> tuple[float, float]:
        line = next(x for x in text.splitlines() if x.startswith("RESULT "))
        found = json.loads(line[len("RESULT ") :])
        return float(found["wall"]), float(found["cpu"][0])

    os.sync()
    done = subprocess.run(command("alone"), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"serial pyprof alone failed: {done.stderr[-2000:]}")
    alone, cpu_alone = result(done.stdout)
    shutil.rmtree(work / "copy-alone.d", ignore_errors=True)
    os.sync()
    together_env = dict(env, PYPROF_BENCH_START_AT=str(time.time() + max(3.0, 0.25 * n)))
    running = [
        subprocess.Popen(command(str(i)), env=together_env, stdout=subprocess.PIPE, text=True)
        for i in range(n)
    ]
    outputs = [p.communicate()[0] for p in running]
    if any(p.returncode != 0 for p in running):
        raise SystemExit("a serial pyprof of the N copies at once failed")
    together = [result(text) for text in outputs]
    for i in range(n):
        shutil.rmtree(work / f"copy-{i}.d", ignore_errors=True)
    walls = [w for w, _ in together]
    cpu = sum(c for _, c in together) / n
    return "\n".join([
        f"copies: serial pyprof on the whole input, alone and {n} copies at once",
        "| copies | wall alone (s) | mean wall at once (s) | slowest wall at once (s) "
        "| CPU s at once / alone | bound |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {n} | {alone:.2f} | {sum(walls) / n:.2f} | {max(walls):.2f} | {cpu / cpu_alone:.2f} "
        f"| {alone / max(walls):.0%} |",
    ])  # fmt: skip


COUNTER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>
/* Bytes of the malloc, calloc and realloc calls of 4 KiB and more (arrays, not objects). */
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static unsigned long long counted;
static char early[1 << 16]; /* dlsym's own calloc, before the real one is known */
static size_t early_used;
static void find(void) {
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
}
static void count(size_t n) {
    if (n >= 4096) __atomic_fetch_add(&counted, n, __ATOMIC_RELAXED);
}
unsigned long long allocount_bytes(void) { return __atomic_load_n(&counted, __ATOMIC_RELAXED); }
void *malloc(size_t n) {
    if (!real_malloc) find();
    count(n);
    return real_malloc(n);
}
void *calloc(size_t a, size_t b) {
    if (!real_calloc) {
        size_t n = (a * b + 15) & ~(size_t)15;
        void *p = early + early_used;
        early_used += n;
        memset(p, 0, n);
        return p;
    }
    count(a * b);
    return real_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    if (!real_realloc) find();
    count(n);
    return real_realloc(p, n);
}
"""


def build_counter(work: Path) -> Path:
    """The malloc counter of ``--allocations``, compiled into ``work``."""
    source, library = work / "allocount.c", work / "allocount.so"
    source.write_text(COUNTER_C)
    compiler = os.environ.get("CC", "cc")
    try:
        subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(f"--allocations: cannot build the malloc counter: {error}") from error
    return library


def parse_bytes(text: str) -> int:
    """``512M`` -> bytes (the units of pyprof-mpi's --memory-limit)."""
    from pyhpctk.cli.pyprof import parse_size

    return parse_size(text)


if __name__ == "__main__":
    sys.exit(main())

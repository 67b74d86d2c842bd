"""pyrun against py-spy, austin and pyinstrument: overhead and attribution on CPU-bound programs.

Each workload does a fixed amount of work (sized once, by measuring a plain run, to about
``--seconds``) and measures its own truth: the CPU time (``time.thread_time``) spent in each of
its named functions, and the time its work took (``time.perf_counter`` around the work, so
start-up of an interpreter or of a profiler is left out). Every configuration (tool x rate) runs
once per round, the rounds interleave the plain run with the profiled ones in a rotated order
(load drifts on a shared machine hit all alike), and the report gives per configuration:

- overhead: the median over rounds of ``work time under the tool / plain work time`` of the same
  round; the same ratio of the process's CPU time during the work (signal handlers, pyrun's own
  threads; not a profiler's separate process), less sensitive to a shared machine's load; and of
  the whole command's wall time (start-up included);
- attribution error: the largest difference, in percentage points, between the share of each
  named function in the tool's profile (inclusive, over the named functions) and its share in the
  workload's own measurement, median over rounds; beside it, the same error for a perfect
  sampler that takes as many samples (rate x the work's CPU time) of the workload's true split,
  median over simulated draws: the floor that the sampling rate itself sets (at 200 Hz and 1 s
  of work about 3 points), so a tool's error is read against it.

Workloads: ``one-thread`` (three functions with 1:2:3 work), ``three-threads`` (three threads
doing 1:2:3), ``numpy`` (``np.sort``, a matrix product and a Python loop; one BLAS thread).
Tools: ``pyrun`` (the engine, native frames on: its default), ``pyrun-nonative`` (the engine with
``--no-native``), ``pyrun-thread`` (its Python sampler thread, the fallback), ``py-spy``
(``record -r``), ``py-spy-nb`` (``--nonblocking``), ``py-spy-native`` (``--native``: native
frames too, what pyrun's native frames compare with), ``austin`` (``-s``, CPU time;
-i), ``pyinstrument`` (``-i``; it follows the main thread only, so it has no number for
three-threads). Rates: pyrun ``CPUTIME@1e6/RATE``, py-spy ``-r RATE``, austin ``-i 1e6/RATE``,
pyinstrument ``-i 1/RATE``.

The peer profilers are never project dependencies: they are pip-installed on demand into a
throwaway virtual environment (``--peers-venv``, default ``$TMPDIR/pyhpctk-bench-peers``):
py-spy, pyinstrument and ``austin-dist<3.7`` (austin 3.7+ binaries need glibc 2.38). py-spy and
austin read the process from outside and need ptrace (root, or ``ptrace_scope`` 0). A peer that
cannot be installed (no network) is skipped with a message.

    python benchmarks/pyrun_cpu.py --rounds 5                  # everything, 200 and 1000 Hz
    python benchmarks/pyrun_cpu.py --tools pyrun --rates 1000   # no peers: nothing to install
    python benchmarks/pyrun_cpu.py --workloads numpy --rates 200 \
        --tools plain,pyrun,pyrun-nonative,py-spy-native         # the cost of native frames
    python benchmarks/pyrun_cpu.py --cpus 2-5 ...               # every run on the same cores
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOLS = (
    "plain", "pyrun", "pyrun-nonative", "pyrun-thread", "py-spy", "py-spy-nb", "py-spy-native",
    "austin", "pyinstrument",
)  # fmt: skip
PEERS = {"py-spy": "py-spy", "austin": "austin-dist<3.7", "pyinstrument": "pyinstrument"}

COMMON = """
import json, sys, threading, time
ROUNDS, TRUTH = int(sys.argv[1]), sys.argv[2]
cpu = {}

def spin(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total

def timed(name, function, *args):
    t0 = time.thread_time()
    function(*args)
    cpu[name] = cpu.get(name, 0.0) + time.thread_time() - t0

PROCESS_START = time.process_time()
MAIN_START = time.thread_time()

def thread_clocks():
    # every thread's CPU time by kernel name (pyrun's own: pyrun-drain, pyrun-monitor)
    import os
    clocks = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as stream:
                name = stream.read().strip()
            seconds = time.clock_gettime(((~int(task)) << 3) | 6)  # MAKE_THREAD_CPUCLOCK
        except (OSError, ValueError):
            continue
        clocks[name] = clocks.get(name, 0.0) + seconds
    return clocks

def done(work_seconds):
    with open(TRUTH, "w") as out:
        process_cpu = time.process_time() - PROCESS_START
        json.dump({"cpu": cpu, "work": work_seconds, "process_cpu": process_cpu,
                   "main_cpu": time.thread_time() - MAIN_START, "threads": thread_clocks()}, out)
"""

WORKLOADS = {
    "one-thread": COMMON
    + """
def part_a(): spin(10_000)
def part_b(): spin(20_000)
def part_c(): spin(30_000)

start = time.perf_counter()
for _ in range(ROUNDS):
    timed("part_a", part_a)
    timed("part_b", part_b)
    timed("part_c", part_c)
done(time.perf_counter() - start)
""",
    "three-threads": COMMON
    + """
lock = threading.Lock()

def part_a(): spin(10_000)
def part_b(): spin(20_000)
def part_c(): spin(30_000)

def run(name, function, rounds):
    local = 0.0
    for _ in range(rounds):
        t0 = time.thread_time()
        function()
        local += time.thread_time() - t0
    with lock:
        cpu[name] = cpu.get(name, 0.0) + local

start = time.perf_counter()
threads = [threading.Thread(target=run, args=(n, f, ROUNDS))
           for n, f in (("part_a", part_a), ("part_b", part_b), ("part_c", part_c))]
for t in threads: t.start()
for t in threads: t.join()
done(time.perf_counter() - start)
""",
    "numpy": COMMON
    + """
import numpy as np
rng = np.random.default_rng(0)
array = rng.standard_normal(200_000)
a, b = rng.standard_normal((200, 200)), rng.standard_normal((200, 200))

def np_sort(): np.sort(array)
def np_matmul(): a @ b
def py_loop(): spin(5_000)

start = time.perf_counter()
for _ in range(ROUNDS):
    timed("np_sort", np_sort)
    timed("np_matmul", np_matmul)
    timed("py_loop", py_loop)
done(time.perf_counter() - start)
""",
}


def _peer(tool: str) -> str:
    return tool.replace("-nb", "").replace("-native", "")


def ensure_peers(venv: Path, tools: list[str]) -> list[str]:
    """Create the throwaway venv holding the peer profilers, installing what it lacks; the tools
    that can run (a peer that cannot be installed is left out, with a message)."""
    wanted = {PEERS[_peer(t)] for t in tools if _peer(t) in PEERS}
    if not wanted:
        return tools
    python = venv / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    names = {"py-spy": "py-spy", "austin-dist<3.7": "austin", "pyinstrument": "pyinstrument"}
    for spec in wanted:  # a peer already on PATH (e.g. a wheel installed with --target) serves
        found, link = shutil.which(names[spec]), venv / "bin" / names[spec]
        if found and not link.exists() and names[spec] != "pyinstrument":  # a module, not a tool
            link.symlink_to(found)
    missing = [spec for spec in wanted if not (venv / "bin" / names[spec]).exists()]
    if missing:
        print(f"installing {', '.join(missing)} into {venv}", file=sys.stderr)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *missing], check=False)
    usable = []
    for tool in tools:
        spec = PEERS.get(_peer(tool))
        if spec is not None and not (venv / "bin" / names[spec]).exists():
            print(f"{tool}: {spec} could not be installed; skipped", file=sys.stderr)
            continue
        usable.append(tool)
    return usable


def command(
    tool: str, rate: int, script: Path, truth: Path, out: Path, venv: Path, rounds: int
) -> list[str]:
    python = sys.executable
    program = [python, str(script), str(rounds), str(truth)]
    if tool == "plain":
        return program
    if tool in ("pyrun", "pyrun-thread", "pyrun-nonative"):
        return [
            sys.executable,
            "-m",
            "pyhpctk.cli.pyrun",
            "--no-native" if tool == "pyrun-nonative" else "--native",
            "-e",
            f"CPUTIME@{1_000_000 // rate}",
            "-o",
            str(out),
            *program,
        ]
    if tool in ("py-spy", "py-spy-nb", "py-spy-native"):
        extra = {"py-spy-nb": ["--nonblocking"], "py-spy-native": ["--native"]}.get(tool, [])
        return [
            str(venv / "bin" / "py-spy"),
            "record",
            "-r",
            str(rate),
            *extra,
            "-f",
            "raw",
            "-o",
            str(out),
            "--",
            *program,
        ]
    if tool == "austin":
        return [
            str(venv / "bin" / "austin"),
            "-s",
            "-i",
            str(1_000_000 // rate),
            "-o",
            str(out),
            *program,
        ]
    if tool == "pyinstrument":
        return [
            python,
            "-m",
            "pyinstrument",
            "-i",
            str(1 / rate),
            "-r",
            "json",
            "-o",
            str(out),
            *program[1:],
        ]
    raise ValueError(tool)


def shares_from_stacks(stacks: list[tuple[list[str], float]], names: list[str]) -> dict[str, float]:
    """Inclusive weight of each named function over stacks (frames as function names)."""
    weight = collections.Counter[str]()
    for frames, value in stacks:
        for name in set(frames) & set(names):
            weight[name] += value
    total = sum(weight[name] for name in names)
    return {name: weight[name] / total for name in names} if total else {}


def read_pyrun(out: Path, names: list[str]) -> dict[str, float]:
    from pyhpctk.formats import hpcrun, logical

    stacks = []
    for path in out.glob("*.hpcrun"):
        profile = hpcrun.read(path)
        by_fid = {
            m.id: logical.read(out / m.path).by_fid()
            for m in profile.load_modules
            if m.path.startswith("logical/")
        }
        parent, label = {}, {}
        for record in profile.cct:
            node, lm, ip = int(record["id"]), int(record["lm_id"]), int(record["lm_ip"])
            parent[node] = int(record["parent_id"])
            label[node] = by_fid[lm][ip >> 32].funcname if lm in by_fid else ""
        ids, _, values = profile.decoded_values()
        for node, value in zip(ids, values, strict=True):
            frames, at = [], int(node)
            while at:
                frames.append(label[at])
                at = parent[at]
            stacks.append((frames, float(value)))
    return shares_from_stacks(stacks, names)


def read_collapsed(out: Path, names: list[str], separator: str, position: int) -> dict[str, float]:
    """py-spy raw / austin collapsed stacks: ``frame;frame;... count``."""
    stacks = []
    for line in out.read_text(errors="replace").splitlines():
        if not line or line.startswith("#") or " " not in line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = []
        for frame in stack.split(";"):
            parts = frame.split(separator)
            frames.append(parts[position].strip() if len(parts) > abs(position) else frame)
        try:
            stacks.append((frames, float(count)))
        except ValueError:
            continue
    return shares_from_stacks(stacks, names)


def read_pyinstrument(out: Path, names: list[str]) -> dict[str, float]:
    stacks = []

    def walk(frame: dict[str, object], path: list[str]) -> None:
        here = [*path, str(frame.get("function", ""))]
        children = frame.get("children") or []
        child_time = sum(float(c["time"]) for c in children)  # type: ignore[index,union-attr]
        stacks.append((here, float(frame["time"]) - child_time))  # type: ignore[arg-type]
        for child in children:  # type: ignore[union-attr]
            walk(child, here)

    data = json.loads(out.read_text())
    walk(data["root_frame"], [])
    return shares_from_stacks(stacks, names)


def attribution(tool: str, out: Path, names: list[str]) -> dict[str, float]:
    if tool.startswith("pyrun"):
        return read_pyrun(out, names)
    if tool.startswith("py-spy"):
        return read_collapsed(out, names, " (", 0)  # "function (file.py:line)"
    if tool == "austin":
        return read_collapsed(out, names, ":", 1)  # "file:function:line"
    if tool == "pyinstrument":
        return read_pyinstrument(out, names)
    return {}


def run_one(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - start


def pin_cpus(spec: str) -> None:
    """Pin this process (and the children it starts) to the processors ``spec`` names:
    ``2-5``, ``3,4``, ``0-1,6``."""
    chosen: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        chosen.update(range(int(low), int(high or low) + 1))
    os.sched_setaffinity(0, chosen)


def perfect_error(shares: dict[str, float], samples: list[int], trials: int = 400) -> str:
    """The attribution error (points, median over trials) of a sampler that makes no mistake
    but takes ``samples`` samples (the median over rounds) of work split as ``shares``: the
    floor that sampling itself sets at a rate, against which the tools' errors are read."""
    n = max(1, int(statistics.median(samples)))
    names, weights = list(shares), list(shares.values())
    draw = random.Random(16)
    worst = []
    for _ in range(trials):
        counts = collections.Counter(draw.choices(names, weights, k=n))
        worst.append(100 * max(abs(counts[name] / n - shares[name]) for name in names))
    return f"{statistics.median(worst):.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="plain work time per workload")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--rates", default="200,1000")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--peers-venv", type=Path, default=Path(tempfile.gettempdir()) / "pyhpctk-bench-peers"
    )
    parser.add_argument(
        "--cpus",
        default="",
        help="pin this script and every run to these processors (e.g. 2-5), so that plain and "
        "measured runs share cores (a many-core VM's cores differ); an outside profiler too",
    )
    args = parser.parse_args()
    if args.cpus:
        pin_cpus(args.cpus)  # children inherit it
    tools = args.tools.split(",")
    rates = [int(r) for r in args.rates.split(",")]
    workloads = args.workloads.split(",")
    tools = ensure_peers(args.peers_venv, tools)
    peers = (
        subprocess.run(
            [
                str(args.peers_venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if (args.peers_venv / "bin" / "python").exists()
        else ""
    )
    base = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    work_ratio: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
    wall_ratio: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
    cpu_ratio: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
    errors: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
    perfect: dict[tuple[str, int], tuple[dict[str, float], list[int]]] = {}
    plain_work: dict[str, list[float]] = collections.defaultdict(list)
    loads = []
    work = Path(tempfile.mkdtemp(prefix="pyrun-bench-"))
    try:
        scripts = {}
        for name in workloads:
            scripts[name] = work / f"bench_{name.replace('-', '_')}.py"
            scripts[name].write_text(WORKLOADS[name])
        sizes = {}  # rounds of each workload for about --seconds of plain work, measured
        for name in workloads:
            truth = work / "truth.json"
            run_one(
                command("plain", 0, scripts[name], truth, work / "x", args.peers_venv, 20), base
            )
            took = json.loads(truth.read_text())["work"]
            sizes[name] = max(20, int(20 * args.seconds / max(took, 1e-3)))
        configs = [
            (w, t, r)
            for w in workloads
            for t in tools
            for r in (rates if t != "plain" else rates[:1])
        ]
        for round_index in range(args.rounds + 1):  # round 0 warms caches, discarded
            shift = round_index % len(configs)
            measured: dict[
                tuple[str, str, int], tuple[float, float, float, dict[str, float], dict[str, float]]
            ] = {}
            for workload, tool, rate in configs[shift:] + configs[:shift]:
                if tool == "pyinstrument" and workload == "three-threads":
                    continue
                env = dict(base)
                if tool == "pyrun-thread":
                    env["PYHPCTK_PYRUN_SAMPLER"] = "thread"
                if tool == "pyinstrument":
                    env["PYTHONPATH"] = os.pathsep.join(
                        p for p in (peers, env.get("PYTHONPATH", "")) if p
                    )
                truth, out = work / "truth.json", work / f"out-{tool}-{rate}"
                shutil.rmtree(out, ignore_errors=True)
                wall = run_one(
                    command(
                        tool, rate, scripts[workload], truth, out, args.peers_venv, sizes[workload]
                    ),
                    env,
                )
                data = json.loads(truth.read_text())
                cpu: dict[str, float] = data["cpu"]
                total = sum(cpu.values())
                names = sorted(cpu)
                shares = attribution(tool, out, names) if tool != "plain" else {}
                measured[(workload, tool, rate)] = (
                    wall,
                    float(data["work"]),
                    float(data["process_cpu"]),
                    shares,
                    {n: cpu[n] / total for n in names},
                )
                shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(
                    missing_ok=True
                )
                print(
                    f"round {round_index} {workload:13} {tool:12} {rate:5} Hz {wall:6.2f} s",
                    file=sys.stderr,
                )
            loads.append(os.getloadavg()[0])
            if not round_index:
                continue
            for workload in workloads:
                plain_wall, plain_time, plain_cpu, _, _ = measured[(workload, "plain", rates[0])]
                plain_work[workload].append(plain_time)
                for (w, tool, rate), (
                    wall,
                    work_time,
                    work_cpu,
                    shares,
                    truth_shares,
                ) in measured.items():
                    if w != workload or tool == "plain":
                        continue
                    work_ratio[(w, tool, rate)].append(work_time / plain_time)
                    cpu_ratio[(w, tool, rate)].append(work_cpu / plain_cpu)
                    wall_ratio[(w, tool, rate)].append(wall / plain_wall)
                    if shares:
                        errors[(w, tool, rate)].append(
                            100 * max(abs(shares.get(n, 0.0) - s) for n, s in truth_shares.items())
                        )
                        # what a perfect sampler's error would be: the samples it would take
                        entry = perfect.setdefault((w, rate), (truth_shares, []))
                        entry[1].append(round(rate * work_cpu))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine = f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs"
    pinned = f"; pinned to {sorted(os.sched_getaffinity(0))}" if args.cpus else ""
    print(f"\nmachine: {machine}, Python {platform.python_version()}{pinned}")
    print(f"load average during the run: {min(loads):.2f} to {max(loads):.2f}")
    print(f"rounds: {args.rounds}; work sized to {args.seconds} s plain: {sizes}\n")
    columns = (
        "workload", "tool", "rate (Hz)", "plain work (s)", "work time ratio",
        "process CPU ratio", "command wall ratio", "attribution error (points)",
        "perfect sampler's error (points)",
    )  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    order = sorted(
        work_ratio,
        key=lambda key: (workloads.index(key[0]), key[2], tools.index(key[1])),
    )
    for key in order:
        workload, tool, rate = key
        error = errors.get(key)
        cells = (
            workload, tool, str(rate), f"{statistics.median(plain_work[workload]):.2f}",
            f"{statistics.median(work_ratio[key]):.3f}", f"{statistics.median(cpu_ratio[key]):.3f}",
            f"{statistics.median(wall_ratio[key]):.3f}",
            f"{statistics.median(error):.1f}" if error else "n/a",
            perfect_error(*perfect[(workload, rate)]) if (workload, rate) in perfect else "n/a",
        )  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""pyrun's overhead on CPU-bound Python programs, side by side with py-spy, pyinstrument, scalene.

For each workload (pure-Python, numpy-heavy, three threads) it runs the program plainly and under
each profiler at comparable sampling rates (200 samples/s: pyrun's default ``CPUTIME@5000``,
``py-spy record -r 200``, ``pyinstrument -i 0.005``, ``scalene --cpu-sampling-rate 0.005``), in
rounds (each round runs every configuration once, in a rotated order, so load drifts hit all
alike), and reports the median over rounds of ``wall(tool) / wall(plain)`` from the same round,
plus the same ratio of CPU time (the children's user + system time, the profiler's own included).

The peer profilers are never project dependencies: they are pip-installed into a throwaway
virtual environment that this script creates (``--peers-venv``, default
``$TMPDIR/pyhpctk-bench-peers``) or that it is pointed to, and reach the measured interpreter only
through ``PYTHONPATH`` for their own runs.

    python benchmarks/pyrun_cpu.py --rounds 5            # all workloads, all tools
    python benchmarks/pyrun_cpu.py --tools plain,pyrun    # no peers: nothing to install

Set-up notes: every configuration runs with ``PYTHONDONTWRITEBYTECODE`` unset (bytecode cached,
as users run) and ``OPENBLAS_NUM_THREADS=1``/``OMP_NUM_THREADS=1`` (BLAS thread pools would make
the numpy workload's timing depend on the machine's other load); one warm-up round is discarded.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("plain", "pyrun", "py-spy", "pyinstrument", "scalene")
PEERS = ("py-spy", "pyinstrument", "scalene")
RATE_HZ = 200

WORKLOADS = {
    "pure-python": """
import sys

def inner(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total

def middle(n):
    return inner(n)

def outer(rounds):
    return sum(middle(100_000) for _ in range(rounds))

outer(int(400 * float(sys.argv[1])))
""",
    "numpy": """
import sys
import numpy as np

def step(a, b):
    c = a @ b
    return np.fft.fft(c, axis=0).real / (1.0 + np.abs(c).max())

def run(rounds):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 256))
    b = rng.standard_normal((256, 256))
    for _ in range(rounds):
        a = np.sort(step(a, b), axis=1)
    return float(a.sum())

run(int(1000 * float(sys.argv[1])))
""",
    "three-threads": """
import sys
import threading

def inner(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total

def work(rounds):
    for _ in range(rounds):
        inner(100_000)

rounds = int(130 * float(sys.argv[1]))
threads = [threading.Thread(target=work, args=(rounds,)) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
""",
}


@dataclass
class Timing:
    wall: float
    cpu: float


def ensure_peers(venv: Path, tools: list[str]) -> None:
    """Create the throwaway venv holding the peer profilers, if it lacks any of them."""
    wanted = [t for t in tools if t in PEERS]
    if not wanted:
        return
    python = venv / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    missing = [
        tool
        for tool in wanted
        if not (venv / "bin" / tool).exists()
        and subprocess.run(
            [str(python), "-c", f"import {tool.replace('-', '_')}"], capture_output=True
        ).returncode
    ]
    if missing:
        print(f"installing {', '.join(missing)} into {venv}", file=sys.stderr)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *missing], check=True)


def site_packages(venv: Path) -> str:
    python = venv / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def command(tool: str, script: Path, scale: str, work: Path, venv: Path) -> list[str]:
    python = sys.executable
    program = [str(script), scale]
    out = str(work / f"{tool}-{script.stem}-{time.monotonic_ns()}")
    if tool == "plain":
        return [python, *program]
    if tool == "pyrun":
        pyrun = str(Path(python).parent / "pyrun")
        return [pyrun, "-o", out, python, *program]
    if tool == "py-spy":
        spy = str(venv / "bin" / "py-spy")
        return [spy, "record", "-r", str(RATE_HZ), "-f", "raw", "-o", out, "--", python, *program]
    if tool == "pyinstrument":
        interval = str(1 / RATE_HZ)
        return [python, "-m", "pyinstrument", "-i", interval, "-o", out, *program]
    if tool == "scalene":
        rate = str(1 / RATE_HZ)
        return [
            python, "-m", "scalene", "run", "--cpu-only", "--cpu-sampling-rate", rate,
            "-o", out + ".json", str(script), "---", scale,
        ]  # fmt: skip
    raise ValueError(tool)


def timed(argv: list[str], env: dict[str, str]) -> Timing:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timing(wall, cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", default="1.0", help="workload size factor (1.0: ~3-4 s of CPU)")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--peers-venv", type=Path, default=Path(tempfile.gettempdir()) / "pyhpctk-bench-peers"
    )
    args = parser.parse_args()
    tools = args.tools.split(",")
    workloads = args.workloads.split(",")
    ensure_peers(args.peers_venv, tools)
    peers_path = site_packages(args.peers_venv) if any(t in PEERS for t in tools) else ""
    base_env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    results: dict[tuple[str, str], list[Timing]] = {}
    work = Path(tempfile.mkdtemp(prefix="pyrun-bench-"))
    try:
        scripts = {}
        for name in workloads:
            scripts[name] = work / f"bench_{name.replace('-', '_')}.py"
            scripts[name].write_text(WORKLOADS[name])
        configs = [(w, t) for w in workloads for t in tools]
        for round_index in range(args.rounds + 1):  # round 0 warms caches, discarded
            shift = round_index % len(configs)
            for workload, tool in configs[shift:] + configs[:shift]:
                env = dict(base_env)
                if tool in ("pyinstrument", "scalene"):
                    env["PYTHONPATH"] = os.pathsep.join(
                        p for p in (peers_path, env.get("PYTHONPATH", "")) if p
                    )
                argv = command(tool, scripts[workload], args.scale, work, args.peers_venv)
                timing = timed(argv, env)
                if round_index:
                    results.setdefault((workload, tool), []).append(timing)
                print(f"round {round_index} {workload:14} {tool:13} {timing.wall:7.3f} s wall "
                      f"{timing.cpu:7.3f} s cpu", file=sys.stderr)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"rounds: {args.rounds}, scale {args.scale}, sampling rate {RATE_HZ}/s\n")
    print("| workload | tool | plain wall (s) | wall ratio (median) | wall ratio (min) | "
          "CPU ratio (median) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for workload in workloads:
        plain = results[(workload, "plain")]
        for tool in tools:
            if tool == "plain":
                continue
            runs = results[(workload, tool)]
            wall = [r.wall / p.wall for r, p in zip(runs, plain, strict=True)]
            cpu = [r.cpu / p.cpu for r, p in zip(runs, plain, strict=True)]
            print(f"| {workload} | {tool} | {statistics.median(p.wall for p in plain):.2f} | "
                  f"{statistics.median(wall):.3f} | {min(wall):.3f} | "
                  f"{statistics.median(cpu):.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

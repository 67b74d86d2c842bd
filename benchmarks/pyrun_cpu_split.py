"""Where pyrun's CPU overhead goes, split by thread, in CPU time (robust on a loaded machine).

Runs one of ``pyrun_cpu.py``'s workloads plain and under pyrun's engine at the given rates, the
plain run interleaved in rotated order with the profiled ones, and reports per configuration
(medians over rounds, ratios against the plain run of the same round):

- main CPU ratio: the CPU time of the program's main thread from the start of the workload to its
  end (signal handlers run on the sampled thread and count there), against the plain run's;
- process CPU ratio and work time ratio, as ``pyrun_cpu.py`` reports them;
- the CPU time of pyrun's own threads (``pyrun-drain``, ``pyrun-monitor``: their kernel names,
  read from their CPU clocks at the end of the workload), in milliseconds;
- samples taken and the drain's CPU per sample (``PYHPCTK_PYRUN_DEBUG=1``'s counts);
- main µs/sample: the main thread's extra CPU time over the plain run's, per sample the process
  took (its other threads' samples are few: pyrun's own are never sampled).

``--baseline-src DIR`` adds a configuration ``base`` for each rate: pyrun from another source
tree (``DIR/src``, with its engine built there, for example a ``git archive`` of an earlier
commit with its ``_engine*.so``), so a before/after comparison runs interleaved in one run.

    python benchmarks/pyrun_cpu_split.py --workload numpy --rates 200,1000 --rounds 10
    python benchmarks/pyrun_cpu_split.py --baseline-src /tmp/old --rounds 10
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("pyrun_cpu", HERE / "pyrun_cpu.py")
assert _spec is not None and _spec.loader is not None
pyrun_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pyrun_cpu)

COUNTS = re.compile(r"sampling engine in pid \d+: (.*)")


def run(argv: list[str], env: dict[str, str], truth: Path) -> dict[str, object]:
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed: {done.stderr.decode()[-2000:]}")
    data: dict[str, object] = json.loads(truth.read_text())
    counts: dict[str, int] = {}
    for match in COUNTS.finditer(done.stderr.decode()):
        for item in match.group(1).split(", "):
            name, _, value = item.rpartition(" ")
            counts[name] = counts.get(name, 0) + int(value)
    data["counts"] = counts
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="numpy", choices=sorted(pyrun_cpu.WORKLOADS))
    parser.add_argument("--rates", default="200,1000")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0, help="plain work time")
    parser.add_argument("--no-native", action="store_true", help="pyrun --no-native")
    parser.add_argument("--baseline-src", type=Path, help="a source tree to compare with")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    base_env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    base_env["PYHPCTK_PYRUN_DEBUG"] = "1"
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    work = Path(tempfile.mkdtemp(prefix="pyrun-split-"))
    script, truth, out = work / "bench.py", work / "truth.json", work / "out"
    script.write_text(pyrun_cpu.WORKLOADS[args.workload])
    program = [sys.executable, str(script)]
    run([*program, "20", str(truth)], base_env, truth)
    took = float(json.loads(truth.read_text())["work"])
    rounds_of_work = str(max(20, int(20 * args.seconds / max(took, 1e-3))))
    configs: list[tuple[str, list[str], dict[str, str]]] = [("plain", [], base_env)]
    native = "--no-native" if args.no_native else "--native"
    for rate in rates:
        event = f"CPUTIME@{10**6 // rate}"
        pyrun = [sys.executable, "-m", "pyhpctk.cli.pyrun", native, "-e", event]
        configs.append((f"pyrun {rate} Hz", pyrun, base_env))
        if args.baseline_src is not None:
            env = dict(base_env, PYTHONPATH=str(args.baseline_src.resolve() / "src"))
            configs.append((f"base {rate} Hz", pyrun, env))
    results: dict[str, list[dict[str, object]]] = collections.defaultdict(list)
    loads = []
    for round_index in range(args.rounds + 1):  # round 0 warms caches, discarded
        shift = round_index % len(configs)
        for name, prefix, env in configs[shift:] + configs[:shift]:
            subprocess.run(["rm", "-rf", str(out)], check=True)
            argv = [*prefix, "-o", str(out)] if prefix else []
            data = run([*argv, *program, rounds_of_work, str(truth)], env, truth)
            if round_index:
                results[name].append(data)
        loads.append(os.getloadavg()[0])
    subprocess.run(["rm", "-rf", str(work)], check=True)
    print(
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average {min(loads):.2f} to {max(loads):.2f}"
    )
    print(f"workload {args.workload}, {rounds_of_work} rounds of work, {args.rounds} rounds\n")
    columns = (
        "configuration", "main CPU ratio", "process CPU ratio", "work time ratio",
        "pyrun-drain CPU (ms)", "pyrun-monitor CPU (ms)", "samples", "drain µs/sample",
        "main µs/sample",
    )  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    plain = results["plain"]
    median = statistics.median
    for name, _, _ in configs[1:]:
        runs = results[name]

        def ratio(key: str, runs: list[dict[str, object]] = runs) -> float:
            return median(float(r[key]) / float(p[key]) for r, p in zip(runs, plain, strict=True))  # type: ignore[arg-type]

        def own(thread: str, runs: list[dict[str, object]] = runs) -> float:
            return median(float(r["threads"].get(thread, 0.0)) for r in runs) * 1e3  # type: ignore[attr-defined]

        samples = [int(r["counts"].get("samples", 0)) for r in runs]  # type: ignore[attr-defined]
        drain = [
            r["counts"].get("drain_cpu_us", 0) / max(1, n)  # type: ignore[attr-defined]
            for r, n in zip(runs, samples, strict=True)
        ]
        extra = [
            (float(r["main_cpu"]) - float(p["main_cpu"])) * 1e6 / max(1, n)  # type: ignore[arg-type]
            for r, p, n in zip(runs, plain, samples, strict=True)
        ]
        cells = (
            name, f"{ratio('main_cpu'):.3f}", f"{ratio('process_cpu'):.3f}", f"{ratio('work'):.3f}",
            f"{own('pyrun-drain'):.1f}", f"{own('pyrun-monitor'):.1f}", f"{median(samples):.0f}",
            f"{median(drain):.1f}", f"{median(extra):.0f}",
        )  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

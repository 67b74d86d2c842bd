"""Overhead of instruction-level GPU measurement on a real GPU (issue #7, item 5).

    PYTHONPATH=src python3 benchmarks/pyrun_gpu_fine.py [--ncu PATH] [--out results.json]
                                                        [--workload gt|stencil]

Workloads: ``gt`` (default), the ground-truth kernel of ``tests/data/gpu/record_pc.py`` (a
chain of noinline device functions and loops), ``--launches`` launches after a warm-up; and
``stencil``, a CuPy Jacobi stencil (``benchmarks/gpu_stencil.py``, ``--launches`` steps of a
``--n`` x ``--n`` grid), the real workload, for which ``pc`` and ``inst`` (the recorder's own
modes) do not apply. Modes, each in its own process (CUPTI allows one PC sampling session per
context):

- ``plain``: no measurement (``record_pc.py --no-sampling``);
- ``pc``: CUPTI PC sampling through :class:`pyhpctk.measure.gpu.cupti.pcsampling.PcSampler`
  (kernel-serialized, period 2^N cycles) — what ``pyrun -e gpu=nvidia,pc`` collects;
- ``inst``: CUPTI SASS metrics through :class:`pyhpctk.measure.gpu.cupti.sassmetrics.SassCounter`
  (exact per-instruction counts: CUPTI's one counting window over the launches, one flush;
  region = the counted launches, the first one patching the kernel) — what
  ``pyrun -e gpu=nvidia,inst`` collects;
- ``pyrun`` / ``pyrun_pc`` / ``pyrun_inst``: the plain script under ``pyrun -e gpu=nvidia``,
  ``pyrun -e gpu=nvidia,pc,period=N`` and ``pyrun -e gpu=nvidia,inst`` (whole measurement,
  files written);
- ``ncu``: Nsight Compute collecting its instruction-level sampling sections
  (``SourceCounters`` + ``WarpStateStats``) for the same kernel, on the plain script;
  ``ncu_inst``: Nsight Compute collecting per-instruction execution counts (``SourceCounters``
  + ``InstructionStats``, SASS patching like ``inst``).

A mode that fails (e.g. ``pyrun_inst`` before the backend drives SassCounter) is reported with
its error and the others still run; ``--modes`` picks a subset.

Reported: the process wall time (best of ``--repeat``; ``--ncu-repeat`` for the ncu modes, which
take about 0.3 s per profiled launch). Also reported, where the program prints it: the timed
region, i.e. the launches + synchronize (+ reading the samples for ``pc``), and the GPU time of
the launches. The stencil prints its region under ncu as well. For the pyrun modes, the end of
pyrun's stderr is printed: what it measured, e.g. the instruction total it counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDER = os.path.join(HERE, "..", "tests", "data", "gpu", "record_pc.py")
STENCIL = os.path.join(HERE, "gpu_stencil.py")


def _run(command: list[str]) -> tuple[float, str, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done.stdout, done.stderr


def _program_line(stdout: str) -> dict[str, float]:
    for line in stdout.splitlines():
        if line.startswith('{"sampled_wall_s"'):
            return dict(json.loads(line))
    return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ncu", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--ncu-repeat", type=int, default=0, help="runs of the ncu modes (default: --repeat)"
    )
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--period", type=int, default=12)
    parser.add_argument("--reps", type=int, default=1, help="record_pc.py --reps")
    parser.add_argument("--modes", default="", help="comma-separated subset of the modes")
    parser.add_argument("--workload", default="gt", choices=("gt", "stencil"))
    parser.add_argument("--n", type=int, default=4096, help="stencil: grid points per side")
    args = parser.parse_args(argv)
    common = ["--launches", str(args.launches), "--iters", str(args.iters)]
    common += ["--reps", str(args.reps)]
    kernel_name = "gt_kernel"
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        target = os.path.join(scratch, "r.json")
        if args.workload == "stencil":
            stencil = [sys.executable, STENCIL, "--n", str(args.n), "--steps", str(args.launches)]
            modes = {"plain": stencil}
            kernel_name = "jacobi"
        else:
            modes = {
                "plain": [sys.executable, RECORDER, target, "--no-sampling", *common],
                "pc": [sys.executable, RECORDER, target, "--period", str(args.period), *common],
                "inst": [sys.executable, RECORDER, target, "--inst", *common],
            }
        pyrun = [sys.executable, "-m", "pyhpctk.cli.pyrun", "-o"]
        for mode, event in (
            ("pyrun", "gpu=nvidia"),
            ("pyrun_pc", f"gpu=nvidia,pc,period={args.period}"),
            ("pyrun_inst", "gpu=nvidia,inst"),
        ):
            program = [*modes["plain"], *(["--profiler-start"] if mode == "pyrun_inst" else [])]
            modes[mode] = [*pyrun, os.path.join(scratch, mode), "-e", event, *program]
        if args.ncu:
            modes["ncu"] = [
                args.ncu,
                "--section",
                "SourceCounters",
                "--section",
                "WarpStateStats",
                "-k",
                kernel_name,
                *modes["plain"],
            ]
            modes["ncu_inst"] = [
                args.ncu,
                "--section",
                "SourceCounters",
                "--section",
                "InstructionStats",
                "-k",
                kernel_name,
                *modes["plain"],
            ]
        wanted = {m for m in args.modes.split(",") if m} | {"plain"}
        failed: dict[str, str] = {}
        for mode, command in modes.items():
            if args.modes and mode not in wanted:
                continue
            best: dict[str, float] = {}
            runs = args.ncu_repeat if mode.startswith("ncu") and args.ncu_repeat else args.repeat
            for _ in range(runs):
                try:
                    wall, stdout, stderr = _run(command)
                except RuntimeError as error:
                    if mode == "plain":
                        raise
                    failed[mode] = str(error)[-600:]
                    print(mode, "FAILED", failed[mode], flush=True)
                    break
                row: dict[str, float] = {"process_s": wall}
                if mode.startswith("pyrun"):  # what pyrun said it measured, for the record
                    print(mode, "stderr:", stderr.strip()[-400:], flush=True)
                if mode in ("plain", "pyrun", "pyrun_pc", "pyrun_inst"):
                    row.update(json.loads(stdout.strip().splitlines()[-1]))
                    subprocess.run(["rm", "-rf", os.path.join(scratch, mode)], check=False)
                elif mode.startswith("ncu"):
                    # ncu prints its report after the program's output: the stencil's own line
                    # (its timed region under ncu) is the one JSON object among them.
                    row.update(_program_line(stdout))
                elif mode in ("pc", "inst"):
                    with open(target, encoding="utf-8") as stream:
                        row.update(json.load(stream)["timings"])
                if not best or row["process_s"] < best["process_s"]:
                    best = row
            if best:
                results[mode] = best
                print(mode, json.dumps(best), flush=True)
    plain = results["plain"]
    for row in results.values():
        row["process_ratio"] = row["process_s"] / plain["process_s"]
        region = row.get("sampled_wall_s", row.get("counted_wall_s"))
        if region is not None:
            row["region_ratio"] = region / plain["sampled_wall_s"]
    text = json.dumps({**results, "failed": failed} if failed else results, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as stream:
            stream.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

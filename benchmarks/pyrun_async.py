"""What ``pyrun --async-aware`` costs beside plain ``pyrun`` (issue #37, item 4), and what a job
measured ``--start-paused`` and never started costs beside no pyrun at all (item 3).

An asyncio workload: ``--tasks`` worker tasks, gathered by parent tasks in groups of ten under
one main task (chains three tasks deep), each calling a short Python function between
``await asyncio.sleep(0)`` (thousands of task switches a second: each engine drain resolves
its samples' tasks and rebuilds their paths). The workload times itself (the process's CPU time,
``time.process_time``, around the ``asyncio.run``: pyrun's drain thread included, start-up and
the files' writing left out; CPU time rather than wall time, which a loaded shared machine
stretches at random) and prints it. Each round
runs the configurations one after another in an order that alternates (a drift of the shared
machine's speed hits each alike); the table gives each configuration's median time and its
median ratio to its baseline of the same round.

    PYTHONPATH=src python3 benchmarks/pyrun_async.py --rounds 7 --rate 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = """
import asyncio, sys, time

def step(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

async def worker(rounds):
    for _ in range(rounds):
        step(300)
        await asyncio.sleep(0)

async def parent(count, rounds):
    await asyncio.gather(*(asyncio.create_task(worker(rounds)) for _ in range(count)))

async def main(tasks, rounds):
    parents = [asyncio.create_task(parent(10, rounds)) for _ in range(max(1, tasks // 10))]
    await asyncio.gather(*parents)

began = time.process_time()
asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
print(time.process_time() - began)
"""

#: name -> (pyrun's options, or None for no pyrun; the configuration it is compared with)
CONFIGURATIONS = {
    "python": (None, "python"),
    "pyrun paused": (["--start-paused"], "python"),
    "pyrun": ([], "pyrun"),
    "pyrun --async-aware": (["--async-aware"], "pyrun"),
}


def run_once(options: list[str] | None, rate: int, tasks: int, rounds: int, tmp: Path) -> float:
    script = tmp / "workload.py"
    script.write_text(WORKLOAD)
    command = [sys.executable, str(script), str(tasks), str(rounds)]
    if options is not None:
        pyrun = [sys.executable, "-m", "pyhpctk.cli.pyrun", "-e", f"CPUTIME@{10**6 // rate}"]
        out = tempfile.mkdtemp(dir=tmp)
        os.rmdir(out)
        command = [*pyrun, *options, "-o", out, *command]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rate", type=int, default=1000, help="samples per second")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=300, help="awaits per worker")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    ratios: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    with tempfile.TemporaryDirectory() as directory:
        for round_ in range(args.rounds):
            order = list(CONFIGURATIONS)
            if round_ % 2:
                order.reverse()
            this = {
                name: run_once(CONFIGURATIONS[name][0], args.rate, args.tasks, args.steps,
                               Path(directory))
                for name in order
            }  # fmt: skip
            for name, seconds in this.items():
                times[name].append(seconds)
                ratios[name].append(seconds / this[CONFIGURATIONS[name][1]])
    print(f"{args.tasks} tasks x {args.steps} awaits, {args.rate} Hz, {args.rounds} rounds")
    print(f"{'configuration':24} {'CPU s':>9} {'ratio':>7}  against")
    for name, (_, base) in CONFIGURATIONS.items():
        ratio = statistics.median(ratios[name])
        print(f"{name:24} {statistics.median(times[name]):9.3f} {ratio:7.3f}  {base}")


if __name__ == "__main__":
    main()

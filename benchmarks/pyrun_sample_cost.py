"""The CPU cost of one sample of pyrun's engine: handler, ring and drain, per sample taken.

A fixed pure-Python workload (a loop calling a function three frames deep, sized once by a
plain run to about ``--seconds``) runs plainly and under ``pyrun -e CPUTIME@PERIOD`` at a high
rate, interleaved over ``--rounds``. The workload reports the CPU time of its work
(``time.process_time``: every thread of the process, so the drain and the monitor thread are
in it); pyrun reports the samples it took (``PYHPCTK_PYRUN_DEBUG=1``). The cost per sample is
the median over rounds of ``(CPU under pyrun - CPU plain) / samples``.

For scale, the same rounds time a C loop with and without a POSIX timer on CLOCK_MONOTONIC
delivering a realtime signal to an empty handler at the same rate (built with ``cc``): the
machine's own price of one timer signal, which any in-process sampler pays (on a VM each
interrupt and each signal frame can cost tens of microseconds).

    python benchmarks/pyrun_sample_cost.py --rounds 7 --period 100
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = """
import sys, time
def leaf(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total
def middle(n): return leaf(n)
def top(n): return middle(n)
rounds = int(sys.argv[1])
start = time.process_time()
for _ in range(rounds):
    top(1000)
print(time.process_time() - start)
"""


BARE_SIGNAL = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static volatile long count;
static void handler(int s, siginfo_t *i, void *c) { count++; }
static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
    long period = atol(argv[1]), loops = atol(argv[2]);
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = handler;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGRTMIN + 9, &action, 0);
    if (period) {
        timer_t timer;
        struct sigevent event;
        memset(&event, 0, sizeof(event));
        event.sigev_notify = SIGEV_THREAD_ID;
        event.sigev_signo = SIGRTMIN + 9;
        event._sigev_un._tid = syscall(SYS_gettid);
        timer_create(CLOCK_MONOTONIC, &event, &timer);
        struct itimerspec spec = {{0, period * 1000}, {0, period * 1000}};
        timer_settime(timer, 0, &spec, 0);
    }
    double start = cpu();
    volatile double x = 0;
    for (long i = 0; i < loops; i++) x += i * 0.5;
    printf("%f %ld\n", cpu() - start, count);
    return 0;
}
"""


def run(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    cpu = float(done.stdout.split()[-1])
    found = re.search(r"samples (\d+)", done.stderr)
    return cpu, int(found.group(1)) if found else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--period", type=int, default=100, help="CPUTIME period (microseconds)")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    env = dict(os.environ, PYHPCTK_PYRUN_DEBUG="1")
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "workload.py"
        script.write_text(WORKLOAD)
        probe, _ = run([sys.executable, str(script), "200"], env)
        rounds = max(200, int(200 * args.seconds / max(probe, 1e-3)))
        bare = Path(work) / "bare"
        (Path(work) / "bare.c").write_text(BARE_SIGNAL)
        subprocess.run(
            ["cc", "-O1", "-o", str(bare), str(Path(work) / "bare.c"), "-lrt"], check=True
        )
        costs, rates, signal_costs = [], [], []
        for index in range(args.rounds):
            quiet = subprocess.run([str(bare), "0", "300000000"], capture_output=True, text=True)
            ticked = subprocess.run(
                [str(bare), str(args.period), "300000000"], capture_output=True, text=True
            )
            (quiet_cpu, _), (ticked_cpu, signals) = (
                (float(a), int(b)) for a, b in (quiet.stdout.split(), ticked.stdout.split())
            )
            signal_costs.append((ticked_cpu - quiet_cpu) / max(signals, 1) * 1e6)
            plain, _ = run([sys.executable, str(script), str(rounds)], env)
            out = Path(work) / f"m{index}"
            pyrun = [sys.executable, "-m", "pyhpctk.cli.pyrun", "-o", str(out)]
            measured, samples = run(
                [*pyrun, "-e", f"CPUTIME@{args.period}", sys.executable, str(script), str(rounds)],
                env,
            )
            costs.append((measured - plain) / max(samples, 1) * 1e6)
            rates.append(samples / measured)
            print(f"round {index}: plain {plain:.3f} s, pyrun {measured:.3f} s, {samples} samples")
    print(f"\nmedian cost per sample: {statistics.median(costs):.2f} us "
          f"(rounds: {', '.join(f'{c:.2f}' for c in costs)}); "
          f"median rate {statistics.median(rates):.0f} samples per CPU second")  # fmt: skip
    print(f"median cost of a bare timer signal (C, empty handler): "
          f"{statistics.median(signal_costs):.2f} us "
          f"(rounds: {', '.join(f'{c:.2f}' for c in signal_costs)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

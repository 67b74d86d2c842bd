"""The short version of pyrun's engine stress (benchmarks/engine_stress.py, 1,000 runs by hand).

Six runs of a program that starts 25 short threads while others dlopen/dlclose a C library in a
loop, throw C++ exceptions through native frames, import fresh extension modules, fork measured
children and signal the process, sampled at 1 kHz on both clocks with native frames on (each
sample unwinds the native stack): each must exit 0, within its timeout, with profiles that
``pyhpctk verify`` accepts. The full run's command and outcome are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "engine_stress.py"


def test_the_engine_survives_threads_fork_dlopen_and_signals() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "6", "--threads", "25", "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 runs, 0 failed" in done.stdout

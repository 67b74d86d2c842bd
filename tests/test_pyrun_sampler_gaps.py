"""The Python sampler keeps sampling while pyrun writes a checkpoint.

A checkpoint is written on the sampling thread, and each write gives the GIL up. Taking it back
waits a whole switch interval (5 ms) where the program has a second thread, a thread blocked in
a queue included: a checkpoint of ten threads' files took a third of a second, and no thread was
sampled meanwhile (the CPU time of that gap went to wherever the next sample found each thread).
The trace of a thread that spins shows the gaps between its samples.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.formats import hpctrace

#: Timing-sensitive (the samplers' accuracy, memory peaks): run alone, after the parallel tests
#: (Makefile: unit), so that the other worker's load does not decide them.
pytestmark = pytest.mark.timing

SPIN_WITH_IDLE_THREADS = """
import queue, threading, time
waiting = queue.Queue()
for _ in range(8):  # blocked in the queue: they never take the GIL
    threading.Thread(target=waiting.get, daemon=True).start()
began = time.thread_time()
while time.thread_time() - began < 1.5:
    pass
"""


@pytest.mark.skipif(sys.platform != "linux", reason="pyrun measures on Linux")
def test_the_python_sampler_samples_on_while_a_checkpoint_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program, out = tmp_path / "spin.py", tmp_path / "m"
    program.write_text(SPIN_WITH_IDLE_THREADS)
    monkeypatch.setenv("PYHPCTK_PYRUN_SAMPLER", "thread")
    options = ["-t", "-e", "CPUTIME@1000", "-o", str(out)]
    assert pyrun_main([*options, sys.executable, str(program)]) == 0
    main_thread = [name for name in os.listdir(out) if name.endswith(".hpctrace")]
    main_thread = [name for name in main_thread if name.split("-")[2] == "000"]
    assert len(main_thread) == 1, os.listdir(out)
    stamps = hpctrace.read(out / main_thread[0]).records["time"].astype(np.int64)
    # the spin's samples: the main thread's last 1.4 s (the threads start before it)
    spin = stamps[stamps >= stamps[-1] - 1_400_000_000]
    gaps = np.diff(spin) / 1e9
    # Each sample waits for the GIL (a switch interval, 5 ms: the program has other threads);
    # checkpoints came at 0.25 s, 0.3 s, 0.4 s and 0.55 s, each a gap of 0.1-0.4 s before.
    assert len(spin) > 100 and gaps.max() < 0.1, (len(spin), sorted(gaps)[-5:])

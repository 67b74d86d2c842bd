"""The test guard of tests/conftest.py: a test that leaves pyrun's threads running fails.

pyrun's own threads are raw threads (``_thread``, the engine's pthreads) that
``threading.enumerate`` never lists; each gets a kernel name beginning ``pyrun-`` so that the
guard (and top, ``ps -L``, py-spy) can find them.
"""

from __future__ import annotations

from pathlib import Path

from conftest import left_running, measurement_threads
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.launch import runtime
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session


def test_the_guard_sees_a_gpu_monitor_left_running_and_not_once_it_is_closed(
    tmp_path: Path,
) -> None:
    session = Session(MeasureOptions(str(tmp_path), checkpoint_s=0))
    before = measurement_threads()
    monitor = GpuMonitor(session, session.add_metric_kind(gm.gpu_metric_kind()))
    try:
        left = left_running(before, grace_s=0.2)
    finally:
        monitor.close(write=False)
    assert {name.split()[0] for name in left} == {"pyrun-gpumon", "pyrun-gputrace"}
    assert left_running(before) == []


def test_the_guard_sees_a_sampler_left_running_and_not_once_it_is_stopped(
    tmp_path: Path,
) -> None:
    before = measurement_threads()
    session = runtime.start(str(tmp_path), install_hooks=False)
    try:
        left = left_running(before, grace_s=0.2)
    finally:
        runtime.stop(session)
    assert left, "a running session's sampler, drain or monitor thread was not seen"
    assert all(name.startswith("pyrun-") for name in left)
    assert left_running(before) == []

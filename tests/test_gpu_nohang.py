"""No hang at a flush: CUPTI's buffer thread holds its own lock while it completes a buffer.

``cuptiActivityFlushAll`` takes the lock CUPTI's thread holds while it calls the
bufferCompleted callback. A completion callback that needs the GIL (ctypes, cupti-python)
and a flush that keeps the GIL while it waits deadlock: the likely cause of the ``pyrun -e
gpu=nvidia -t`` ResNet-18 run that never ended (issue #18). ``tests/data/gpu/fake_cupti.c``
reproduces that threading without a GPU: its worker takes the lock, waits, then completes a
buffer through the callback the backend registered, while the program's thread flushes.

Each scenario runs in a child process with a timeout, so a regression fails instead of
hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_helpers import build_fake_cupti

SCENARIO = textwrap.dedent(
    """\
    import ctypes, sys, tempfile, threading, types
    lib_path, hook_name = sys.argv[1], sys.argv[2]
    fake = ctypes.CDLL(lib_path)  # loaded: the backend finds it as "libcupti"
    from pyhpctk.measure.launch.config import MeasureOptions
    from pyhpctk.measure.gpu import metrics as gm
    from pyhpctk.measure.gpu.cupti.backend import CuptiBackend, load_hook
    from pyhpctk.measure.gpu.monitor import GpuMonitor
    from pyhpctk.measure.session import Session

    session = Session(MeasureOptions(tempfile.mkdtemp(), checkpoint_s=0))
    session.register_thread(threading.current_thread(), main=True)
    monitor = GpuMonitor(session, session.add_metric_kind(gm.gpu_metric_kind()))
    backend = CuptiBackend(buffer_bytes=1 << 16).buffers
    backend.monitor = monitor
    if hook_name == "c":
        hook = load_hook()
        hook.reset()
        backend.native = hook
    # cupti-python's flush, as a binding that keeps the GIL while libcupti waits would call it
    flush = ctypes.PyDLL(lib_path).cuptiActivityFlushAll
    backend._cupti = types.SimpleNamespace(activity_flush_all=flush)
    backend._register_raw(types.SimpleNamespace())
    fake.fake_complete_async(300)  # CUPTI's thread: takes its lock, completes in 0.3 s
    while not fake.fake_inside():
        pass
    backend.flush()  # the program's thread, with the GIL, while CUPTI's thread is inside
    print("flushed", fake.fake_completions(), fake.fake_flushes(), flush=True)
    backend.stop = lambda: None
    stop = getattr(backend, "_stop_buffer_thread", None)
    if stop is not None:
        stop()
    monitor.close(write=False)
    """
)


@pytest.fixture(scope="module")
def fake_cupti(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_cupti(tmp_path_factory.mktemp("fake"))


@pytest.mark.parametrize("hook", ["c", "ctypes"])
def test_a_flush_while_cuptis_thread_completes_a_buffer_returns(
    fake_cupti: Path, tmp_path: Path, hook: str
) -> None:
    """With the C hook CUPTI's callbacks need no GIL; without it the flush releases the GIL."""
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(fake_cupti), hook],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the flush deadlocked with CUPTI's buffer thread (the issue #18 hang)")
    assert done.returncode == 0, done.stderr
    assert "flushed 1 1" in done.stdout, (done.stdout, done.stderr)

"""Shared fixtures: where HPCToolkit's reference data lives (``../shared`` beside the checkout)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO.parent / "shared" / "reference" / "hpctoolkit-testdata"

# A suite started as a background job (`make test &`, nohup) starts with SIGINT ignored, and the
# programs the tests start would inherit that: tests that end a program with SIGINT need the
# disposition an interactive shell gives (SIGHUP and SIGQUIT: tests/test_pyrun_faults.py).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def reference() -> Path:
    """The reference data directory; a missing one is an error, never a skip."""
    if not REFERENCE.is_dir():
        raise FileNotFoundError(
            f"HPCToolkit reference data not found at {REFERENCE}: "
            "check out the shared folder beside the repository"
        )
    return REFERENCE


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (issue #15: writers on a full disk), mounted for the test and removed after.

    Mounting needs root (CI runs as root); elsewhere the test is skipped and says why.
    """
    where = tmp_path / "small-disk"
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)]
    try:
        done = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command here: cannot make a small file system to fill")
    if done.returncode != 0:
        reason = done.stderr.strip() or f"exit status {done.returncode}"
        pytest.skip(f"cannot mount a 64k tmpfs here ({reason}); CI runs as root")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=30)


@pytest.fixture(autouse=True)
def private_struct_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Each test gets its own pyhpctk cache (``$PYHPCTK_CACHE_DIR``): pystruct's shared cache
    never leaks between tests, nor into the home directory of whoever runs them. (Not
    ``$XDG_CACHE_HOME``: other libraries the measured programs import read that one.)"""
    home = tmp_path_factory.mktemp("pyhpctk-cache")
    monkeypatch.setenv("PYHPCTK_CACHE_DIR", str(home))
    return home / "structs"


#: pyrun's own threads begin their names so (pyhpctk.measure.thread_names.OWN_THREAD_PREFIX):
#: the sampler and drain thread, the engine's monitor, the GPU monitor, tracer and buffer threads.
OWN_THREAD_PREFIX = "pyrun-"


def measurement_threads() -> set[str]:
    """pyrun's threads alive in this process: raw ones (``_thread``, pthreads: invisible to
    ``threading.enumerate``) by their kernel name, threading's by their name."""
    found = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as comm:
                name = comm.read().strip()
        except OSError:  # ended meanwhile
            continue
        if name.startswith(OWN_THREAD_PREFIX):
            found.add(f"{name} (tid {tid})")
    found.update(
        f"{thread.name} (threading)"
        for thread in threading.enumerate()
        if thread.name.startswith(OWN_THREAD_PREFIX)
    )
    return found


def left_running(before: set[str], grace_s: float = 5.0) -> list[str]:
    """The measurement threads not in ``before`` still alive after ``grace_s`` seconds."""
    deadline = time.monotonic() + grace_s
    while (left := measurement_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.02)
    return sorted(left)


@pytest.fixture(autouse=True)
def no_measurement_thread_left() -> Iterator[None]:
    """Fail a test that leaves a sampler, monitor or drain thread running (pyinstrument's
    ``check_sampler_state``): stop the session, the engine and the GPU monitor it started."""
    before = measurement_threads()
    yield
    left = left_running(before)
    if left:
        pytest.fail(
            "the test left pyrun's measurement threads running (stop what it started): "
            + ", ".join(left)
        )


# -- the two roads of each pair (issue #33): every low-level test that names one runs on both ---
#: Which sampler measures: the C engine, or the Python sampler thread (``PYHPCTK_PYRUN_SAMPLER``).
SAMPLERS = ("engine", "thread")
#: How GPU API calls are seen: the C CUPTI hook, or Python callbacks (``gpu=...,hook=``).
GPU_HOOKS = ("python", "c")


#: The modules whose every test measures through pyrun's samplers and runs on both roads (a test
#: that names ``sampler`` picks its own road; the engine's own tests are in modules of their own).
BOTH_ROADS = frozenset(
    {
        "test_pyrun",
        "test_pyrun_environment",
        "test_pyrun_faults",
        "test_pyrun_limits",
        "test_pyrun_units",
        "test_pyrun_unsampled",
        "test_thread_names",
        "test_hostile_names",
    }
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of a both-roads module runs once per sampler (the ``road`` fixture)."""
    module = metafunc.module.__name__.rpartition(".")[2]
    if module not in BOTH_ROADS or "sampler" in metafunc.fixturenames:
        return
    metafunc.parametrize("road", SAMPLERS, indirect=True)


@pytest.fixture(autouse=True)
def road(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The sampler a both-roads module's test measures with (None elsewhere: pyrun's default)."""
    chosen: str | None = getattr(request, "param", None)
    if chosen is not None:
        from pyhpctk.measure.sampling.engine import ENV_SAMPLER

        monkeypatch.setenv(ENV_SAMPLER, chosen)
    return chosen


@pytest.fixture(params=SAMPLERS)
def sampler(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs once per sampler; pyrun and sessions started in it use that one."""
    from pyhpctk.measure.sampling.engine import ENV_SAMPLER

    monkeypatch.setenv(ENV_SAMPLER, request.param)
    return str(request.param)


@pytest.fixture(params=GPU_HOOKS)
def gpu_hook(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs once per GPU hook; ``gpu=`` events without ``hook=`` use that one."""
    from pyhpctk.measure.settings import ENV_HOOK

    monkeypatch.setenv(ENV_HOOK, request.param)
    return str(request.param)

"""Shared fixtures: where HPCToolkit's reference data lives (``../shared`` beside the checkout)."""

from __future__ import annotations

import signal
import subprocess
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

"""Guards for tests that feed tools hostile input: a time budget (a hang fails instead of
blocking CI), an address-space cap (a giant allocation fails at once instead of swapping the
machine to death) and a snapshot of a directory (to prove nothing was written)."""

from __future__ import annotations

import contextlib
import hashlib
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

HEADROOM = 2 << 30  # address space allowed above what the process maps already


class Hang(Exception):
    """An example ran past its time budget.

    An Exception (not a BaseException) so that hypothesis reports and shrinks the example; in
    case the code under test swallows it, :func:`time_budget` also fails once the block is over.
    """


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    expired: list[float] = []

    def expire(signum: int, frame: FrameType | None) -> None:
        expired.append(seconds)
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if expired:
        raise Hang(f"no answer within {seconds} s (and the code under test caught the alarm)")


def mapped_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextlib.contextmanager
def memory_cap(headroom: int = HEADROOM) -> Iterator[None]:
    """Cap the address space ``headroom`` above today's, so a giant allocation is a MemoryError
    at once (which fails the test) rather than a machine swapping to death."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped_bytes() + headroom
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a digest of its content (directories as ``dir``)."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        found[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found

"""Helpers that turn a hang into a test failure (code before a fix may block or crawl)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail the test when the block runs longer than ``seconds``.

    SIGALRM interrupts even a blocking ``open`` of a FIFO (PEP 475 runs the handler, whose
    exception ends the call). Main thread only, as pytest and its xdist workers run tests.
    """

    def expire(signum: int, frame: object) -> None:
        raise AssertionError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)

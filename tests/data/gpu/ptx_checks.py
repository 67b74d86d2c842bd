"""What the PTX pass's device scripts (device_ptx.py, device_ptx_hooks.py) share: one line per
check, the results they write, and the thread executions of instructions from derived counts."""

from __future__ import annotations

from typing import Any

from pyhpctk.instrument.ptx import Counts, build
from pyhpctk.instrument.ptx import parse as parse_ptx

RESULTS: list[dict[str, Any]] = []
FAILURES: list[str] = []


def check(what: str, got: object, expected: object) -> None:
    ok = got == expected
    print(f"{'ok ' if ok else 'ERR'} {what}: {got}{'' if ok else f' expected {expected}'}")
    RESULTS.append({"check": what, "got": str(got), "expected": str(expected), "ok": ok})
    if not ok:
        FAILURES.append(what)


def executed(counts: Counts, ptx: str, kernel: str, prefix: str) -> int:
    """Thread executions of the instructions whose opcode starts with ``prefix``."""
    cfg = build(parse_ptx(ptx).function(kernel))
    total = 0
    for block, threads in zip(cfg.blocks, counts.block_threads, strict=True):
        n = sum(1 for i in block.instructions if cfg.statement(i).opcode.startswith(prefix))
        total += n * threads
    return total

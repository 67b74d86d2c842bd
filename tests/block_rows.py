"""Per-line block counts: what the PTX and each block's count imply, and what pyview shows
(issue #34, item 3). The CI tests (test_gpu_blocks.py) and the device script
(data/gpu/blocks_device.py) compare the two; no pytest here (the device has none)."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence

from pyhpctk.instrument.ptx import build, find_loops, parse
from pyhpctk.instrument.ptx.lines import Location, instruction_locations

#: pyview's block-count metrics, in the order a row lists them.
METRICS = ("GPTX:BLK", "GPTX:BLK_WARP", "GPTX:INST", "GPTX:INST_WARP")
Rows = dict[tuple[bool, int | None], list[int]]


def outermost_line(location: Location | None) -> int | None:
    """The source line of a location's outermost call (its own line when not inlined)."""
    if location is None:
        return None
    line = location.inlined[-1].line if location.inlined else location.line
    return line or None


def expected_rows(
    ptx: str, threads: Sequence[int], warps: Sequence[int] | None, kernel: str = ""
) -> Rows:
    """(in a loop, source line of the outermost call) → [block executions by threads, by
    warps, instructions by threads, by warps], from each block's count and its ``.loc``s."""
    module = parse(ptx)
    cfg = build(module.function(kernel) if kernel else module.kernels[0])
    loops = find_loops(cfg)
    where = instruction_locations(module, cfg)
    out: Rows = defaultdict(lambda: [0, 0, 0, 0])
    for block in cfg.blocks:
        in_loop = loops.depth(block.index) > 0
        warp = warps[block.index] if warps is not None else 0
        for i in block.instructions:
            row = out[(in_loop, outermost_line(where.get(i)))]
            row[2] += threads[block.index]
            row[3] += warp
            if i == block.instructions[0]:
                row[0] += threads[block.index]
                row[1] += warp
    return dict(out)


def pyview_argv(database: str) -> list[str]:
    """pyview's arguments for a CSV of every context with the block metrics."""
    argv = [database, "--full", "--csv", "-"]
    for metric in (*METRICS, "GPTX:COUNT", "GKER:COUNT"):
        argv += ["-m", metric]
    return argv


def rows_below(text: str, kernel: str) -> list[dict[str, str]]:
    """The rows of pyview's CSV ``text`` from the kernel's row down (metrics inclusive)."""
    table = list(csv.DictReader(io.StringIO(text)))
    top = next(r for r in table if r["scope"] == kernel and r["kind"] == "function")
    below, parents = [top], {top["id"]}
    for row in table:
        if row["parent"] in parents:
            below.append(row)
            parents.add(row["id"])
    return below


def shown_rows(below: list[dict[str, str]]) -> Rows:
    """The line rows below the kernel keyed as :func:`expected_rows` keys them."""
    kinds = {row["id"]: row["kind"] for row in below}
    out = {}
    for row in below[1:]:
        if row["kind"] != "line" or kinds.get(row["parent"]) not in ("function", "loop"):
            continue
        if kinds[row["parent"]] == "function" and row["parent"] != below[0]["id"]:
            continue  # a line of inlined code: its call site's row holds it
        key = (kinds[row["parent"]] == "loop", int(row["line"]) if row["line"] else None)
        out[key] = [int(float(row[f"{m} (I)"])) for m in METRICS]
    return out


def scaled(rows: Rows, factor: int) -> Rows:
    return {key: [v * factor for v in values] for key, values in rows.items()}


def summed(*many: Rows) -> Rows:
    out: Rows = defaultdict(lambda: [0, 0, 0, 0])
    for rows in many:
        for key, values in rows.items():
            out[key] = [a + b for a, b in zip(out[key], values, strict=True)]
    return dict(out)

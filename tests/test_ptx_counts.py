"""From counters to counts (issue #34 item 3): random control-flow graphs written as PTX, random
executions of them, counters read only on the edges the spanning tree leaves; the derived block
and edge counts must equal the executions' exactly. No GPU and no PTX interpreter: an execution
is a walk from the entry to EXIT, which is what one thread's run is to its counts."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ptx_helpers import NVCC_PTX, SHAPES_PTX
from pyhpctk.instrument.ptx import (
    Cfg,
    Mode,
    PtxError,
    assemble,
    block_lines,
    build,
    derive,
    find_loops,
    instrument,
    make_plan,
    parse,
)

TERMINATORS = ("fall", "bra", "guarded", "ret", "guarded-ret", "switch")


@st.composite
def random_ptx(draw: st.DrawFn) -> str:
    """A kernel of 1-10 blocks, each with a random ending and random targets."""
    n = draw(st.integers(1, 10))
    lines = [
        ".version 8.0", ".target sm_80", ".address_size 64",
        ".visible .entry k(.param .u32 k_n)", "{", "\t.reg .pred %p<2>;", "\t.reg .b32 %r<3>;",
        "\tld.param.u32 %r1, [k_n];", "\tsetp.eq.u32 %p1, %r1, 0;",
    ]  # fmt: skip
    for b in range(n):
        lines.append(f"B{b}:")
        lines.extend(["\tadd.u32 %r2, %r2, 1;"] * draw(st.integers(0, 3)))
        end = draw(st.sampled_from(TERMINATORS))
        target = f"B{draw(st.integers(0, n - 1))}"
        if end == "bra":
            lines.append(f"\tbra.uni {target};")
        elif end == "guarded":
            lines.append(f"\t@%p1 bra {target};")
        elif end == "ret":
            lines.append("\tret;")
        elif end == "guarded-ret":
            lines.append("\t@%p1 ret;")
        elif end == "switch":
            targets = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))
            lines.append(f"\tt{b}: .branchtargets {', '.join(f'B{t}' for t in targets)};")
            lines.append(f"\tbrx.idx %r1, t{b};")
    lines.extend(["\tret;", "}"])
    if draw(st.booleans()):  # the whole body in a nested scope: its labels are local to it
        lines[8:-1] = ["\t{", *lines[8:-1], "\t}"]
    return "\n".join(lines) + "\n"


def _walks(cfg: Cfg, rng: random.Random, count: int) -> tuple[Counter[int], int]:
    """PtxEdge counts of ``count`` random walks from the entry to EXIT (each a thread's run) and
    how many walks there were; walks stay on blocks that can still reach EXIT."""
    exit_ = cfg.exit
    reaches = {exit_}
    changed = True
    while changed:
        changed = False
        for e in cfg.edges:
            if e.dst in reaches and e.src not in reaches:
                reaches.add(e.src)
                changed = True
    if 0 not in reaches:
        return Counter(), 0
    out_edges: dict[int, list[int]] = {}
    for i, e in enumerate(cfg.edges):
        if e.dst in reaches and e.src != exit_:
            out_edges.setdefault(e.src, []).append(i)
    virtual = len(cfg.edges) - 1
    counts: Counter[int] = Counter()
    for _ in range(count):
        node = 0
        counts[virtual] += 1
        for _step in range(10_000):
            i = rng.choice(out_edges[node])
            counts[i] += 1
            node = cfg.edges[i].dst
            if node == exit_:
                break
        else:
            raise AssertionError("a walk that never ends")
    return counts, count


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_ptx(), st.integers(0, 2**32 - 1), st.integers(0, 30))
def test_derived_counts_equal_the_executions(ptx: str, seed: int, threads: int) -> None:
    cfg = build(parse(ptx).kernels[0])
    truth, runs = _walks(cfg, random.Random(seed), threads)
    assume(runs or threads == 0)
    plan = make_plan(cfg, find_loops(cfg))
    counters = np.zeros((plan.counters, 2), dtype=np.uint64)
    for k, edge in enumerate(plan.probed):
        counters[k] = (min(truth[edge], 1), truth[edge])  # warps: any value; not derived
    counts = derive(plan, counters)
    assert counts.edge_threads == tuple(truth[i] for i in range(len(cfg.edges)))
    for b in range(len(cfg.blocks)):
        entered = sum(truth[i] for i, e in enumerate(cfg.edges) if e.dst == b)
        left = sum(truth[i] for i, e in enumerate(cfg.edges) if e.src == b)
        assert counts.block_threads[b] == entered == left
    assert counts.block_threads[0] >= runs


@settings(max_examples=40, deadline=None)
@given(random_ptx())
def test_random_kernels_instrument_and_assemble(ptx: str) -> None:
    """Every shape the generator draws (self-loops, switches with repeated targets, guarded
    returns, dead blocks) is rewritten into PTX that ptxas accepts."""
    for mode in Mode:
        try:
            result = instrument(ptx, mode)
        except PtxError as e:  # a cycle of switch edges into a scope (the one refusal)
            assert "brx.idx" in ptx and "into the nested scope" in str(e)
            continue
        assemble(result.ptx, "sm_80")


def test_counts_past_two_to_the_63_stay_exact() -> None:
    """A flow scaled until its counters pass 2**63 (uint64, as the device writes them) derives
    to the scaled truth exactly, tree edges past 2**64 included."""
    cfg = build(parse(SHAPES_PTX.read_text()).function("shapes"))
    plan = make_plan(cfg, find_loops(cfg))
    truth = _walks(cfg, random.Random(7), 50)[0]
    scale = (2**64 - 1) // max(truth[e] for e in plan.probed)
    counters = np.array([(0, truth[e] * scale) for e in plan.probed], dtype=np.uint64)
    assert int(counters[:, 1].max()) > 2**63
    counts = derive(plan, counters)
    assert counts.edge_threads == tuple(truth[i] * scale for i in range(len(cfg.edges)))


def test_counters_that_are_no_flow_are_refused() -> None:
    """stencil's two probes read from a broken buffer: more threads leave the kernel than
    entered it."""
    cfg = build(parse(NVCC_PTX.read_text()).function("stencil"))
    plan = make_plan(cfg, find_loops(cfg))
    kinds = [cfg.edges[i].kind.value for i in plan.probed]
    counters = [(1, 5) if kind == "virtual" else (1, 9) for kind in kinds]
    with pytest.raises(PtxError, match=r"^PTX: stencil: the counters are no flow \(edge "):
        derive(plan, counters)
    with pytest.raises(PtxError, match=r"^PTX: stencil: 3 counters read, the plan has 2$"):
        derive(plan, [(0, 0)] * 3)


def test_blocks_mode_reads_warps_and_threads_of_every_block() -> None:
    cfg = build(parse(SHAPES_PTX.read_text()).function("shapes"))
    plan = make_plan(cfg, find_loops(cfg), Mode.BLOCKS)
    counters = [(b + 1, 32 * (b + 1)) for b in range(len(cfg.blocks))]
    counts = derive(plan, counters)
    assert counts.block_warps == tuple(range(1, len(cfg.blocks) + 1))
    assert counts.block_threads == tuple(32 * w for w in counts.block_warps)
    sizes = [len(b.instructions) for b in cfg.blocks]
    assert counts.warp_instructions == sum(
        s * w for s, w in zip(sizes, counts.block_warps, strict=True)
    )
    assert counts.thread_instructions == 32 * counts.warp_instructions


def test_instructions_per_source_line_sum_to_the_lines_instructions() -> None:
    """histogram's PTX instructions executed per kernels.cu line: each block's instructions on
    a line times the block's thread count, summed; a line's share sums to the whole."""
    module = parse(NVCC_PTX.read_text())
    cfg = build(module.function("histogram"))
    plan = make_plan(cfg, find_loops(cfg))
    truth = _walks(cfg, random.Random(3), 64)[0]
    counts = derive(plan, [(1, truth[e]) for e in plan.probed])
    lines = block_lines(module, cfg)
    per_line = counts.per_line(lines)
    with_line = sum(n * counts.block_threads[b] for b, c in enumerate(lines) for n in c.values())
    assert sum(per_line.values()) == with_line <= counts.thread_instructions
    expected: Counter[tuple[str, int]] = Counter()
    for b, counter in enumerate(lines):
        for location, n in counter.items():
            expected[location.key] += n * counts.block_threads[b]
    assert per_line == dict(expected)

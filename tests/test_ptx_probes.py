"""The PTX pass's counting probes (issue #34 items 1 and 3): where they go, the n − 1 reduction,
what the rewritten PTX keeps, and that ptxas (the nvidia-cuda-nvcc wheel's) assembles it."""

from __future__ import annotations

import pytest

from ptx_helpers import NVCC_PTX, SHAPES_PTX, TRITON_KERNELS, triton_ptx
from pyhpctk.instrument.ptx import (
    AssemblerError,
    Mode,
    PtxError,
    assemble,
    build,
    find_ptxas,
    instrument,
    parse,
)
from pyhpctk.instrument.ptx.parse import Kind

HANDWRITTEN = [("nvcc", NVCC_PTX, ("sm_80", "sm_90")), ("shapes", SHAPES_PTX, ("sm_80", "sm_90"))]
TRITON = [(f"triton-{k}", triton_ptx(k), ("sm_90a",)) for k in (*TRITON_KERNELS, "checked")]
ALL = [pytest.param(path, archs, id=name) for name, path, archs in HANDWRITTEN + TRITON]


def _components(nodes: int, edges: list[tuple[int, int]]) -> int:
    parent = list(range(nodes))

    def root(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in edges:
        parent[root(a)] = root(b)
    return len({root(x) for x in range(nodes)})


def test_ptxas_comes_from_the_nvcc_wheel() -> None:
    ptxas = find_ptxas()
    assert ptxas is not None and ptxas.match("nvidia/cu*/bin/ptxas")


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize(("path", "archs"), ALL)
def test_instrumented_ptx_assembles(path, archs, mode: Mode) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text()
    result = instrument(text, mode)
    assert set(result.plans) == {k.name for k in parse(text).kernels}
    for arch in archs:
        plain = assemble(text, arch)
        counted = assemble(result.ptx, arch)
        assert set(counted.registers) == set(plain.registers)
        assert counted.cubin.startswith(b"\x7fELF")


@pytest.mark.parametrize(("path", "archs"), ALL)
def test_edge_probes_number_edges_minus_nodes_plus_one(path, archs) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text()
    module = parse(text)
    plans = instrument(text).plans
    for kernel in module.kernels:
        cfg = build(kernel)
        plan = plans[kernel.name]
        edges, nodes = len(cfg.edges), len(cfg.blocks) + 1  # the virtual edge and EXIT included
        forest = _components(nodes, [(e.src, e.dst) for e in cfg.edges])
        assert plan.counters == edges - nodes + forest
        assert len(plan.tree) == nodes - forest
        assert set(plan.tree) | set(plan.probed) == set(range(edges))
    blocks = instrument(text, Mode.BLOCKS).plans
    assert all(blocks[k.name].counters == len(build(k).blocks) for k in module.kernels)


def _kernel_instructions(text: str, kernel: str) -> list[str]:
    """The instructions of ``kernel`` outside probe scopes (a `{` whose first `.reg` names a
    __pyhpctk register, to its `}`)."""
    out, in_probe = [], False
    for s in parse(text).function(kernel).body:
        if s.kind is Kind.DIRECTIVE and s.opcode == ".reg" and "%__pyhpctk" in s.text:
            in_probe = True
        elif s.kind is Kind.CLOSE:
            in_probe = False
        elif s.kind is Kind.INSTRUCTION and not in_probe:
            out.append(s.text)
    return out


@pytest.mark.parametrize(("path", "archs"), ALL)
def test_instrumenting_keeps_every_instruction_in_order(path, archs) -> None:  # type: ignore[no-untyped-def]
    """Outside the probes, the kernel's instructions are the same and in the same order, but
    for branches pointed at a split block; after them come only the split blocks' branches on
    (and a `ret` where the last block fell off the end)."""
    text = path.read_text()
    for mode in Mode:
        result = instrument(text, mode)
        for kernel in result.plans:
            before = _kernel_instructions(text, kernel)
            after = _kernel_instructions(result.ptx, kernel)
            head, tail = after[: len(before)], after[len(before) :]
            for old, new in zip(before, head, strict=True):
                if "_split" in new:
                    old_op, new_op = old.rsplit(None, 1)[0], new.rsplit(None, 1)[0]
                    leaves = old.split()[-1] in ("exit", "ret", "trap")
                    assert new_op == old_op or (leaves and new_op == f"{old.split()[0]} bra")
                else:
                    assert new == old
            assert all(t.split()[0] in ("bra", "exit", "ret", "trap") for t in tail), tail


def test_critical_edges_get_a_block_of_their_own() -> None:
    text = SHAPES_PTX.read_text()
    result = instrument(text)
    plan = result.plans["shapes"]
    cfg = build(parse(text).function("shapes"))
    new = build(parse(result.ptx).function("shapes"))
    splits = [b for b in new.blocks if any("_split" in label for label in b.labels)]
    critical = [
        i for i in plan.probed
        if len(cfg.successors[cfg.edges[i].src]) > 1
        and cfg.edges[i].kind.value != "fall"
        and (len(cfg.predecessors[cfg.edges[i].dst]) > 1 or cfg.edges[i].dst == cfg.exit)
    ]  # fmt: skip
    assert critical and len(splits) == len(critical)
    for block in splits:  # each: one probe, then the branch (or exit) it stands in for
        last = new.statement(block.instructions[-1])
        assert last.base_opcode in ("bra", "exit") and not last.guard
        probes = [i for i in block.instructions if ".global.add.u64" in new.statement(i).text]
        assert len(probes) == 1  # its thread slot (edges mode adds no warp count)

    # two switches over the same targets: one switch edge is counted through a copy of its table
    plan = result.plans["twoswitch"]
    cfg = build(parse(text).function("twoswitch"))
    assert [cfg.edges[i].kind.value for i in plan.probed].count("indirect") == 1
    body = parse(result.ptx).function("twoswitch").body
    tables = [s for s in body if s.opcode == ".branchtargets"]
    assert len(tables) == 3 and any("_split" in " ".join(t.operands) for t in tables)
    (copy,) = [t for t in tables if "_split" in " ".join(t.operands)]
    names = [s.operands[-1] for s in body if s.base_opcode == "brx"]
    assert copy.label in names and len({"tx", "ty"} & set(names)) == 1


def test_the_counter_buffer_is_the_last_parameter_and_names_are_fresh() -> None:
    text = SHAPES_PTX.read_text().replace("case0", "case0_x__pyhpctk")  # a clash to dodge
    result = instrument(text)
    module = parse(result.ptx)
    shapes, empty = module.function("shapes"), module.function("empty")
    assert shapes.params == ("shapes_out", "shapes_n", "shapes___pyhpctk1_counters")
    assert empty.params == ("empty___pyhpctk1_counters",)
    assert result.counter_params["empty"] == "empty___pyhpctk1_counters"
    assert module.function("twice").params == parse(text).function("twice").params


def test_only_the_kernels_asked_for_are_instrumented() -> None:
    text = SHAPES_PTX.read_text()
    result = instrument(text, kernels={"empty"})
    assert set(result.plans) == {"empty"}
    assert parse(result.ptx).function("shapes").body == parse(text).function("shapes").body


def test_probes_take_the_lowest_active_lane_and_the_mask_population() -> None:
    result = instrument(SHAPES_PTX.read_text(), Mode.BLOCKS)
    body = [s.text for s in parse(result.ptx).function("empty").body]
    ops = [t.split()[0] if not t.startswith("@") else t.split()[1] for t in body]
    assert ops[:1] == ["{"] and "activemask.b32" in ops and "popc.b32" in ops
    assert any("%lanemask_lt" in t for t in body)
    warp, threads = [t for t in body if "red.global.add.u64" in t]
    assert warp.endswith("+0], 1") and threads.endswith("+8], %__pyhpctk_0_n")


def test_ptx_older_than_activemask_is_refused() -> None:
    old = SHAPES_PTX.read_text().replace(".version 8.0", ".version 6.0")
    with pytest.raises(PtxError, match=r"^PTX: PTX ISA 6.0 is older than 6.2, which activemask"):
        instrument(old)


def test_ptxas_refusal_is_one_line_naming_the_error() -> None:
    broken = SHAPES_PTX.read_text().replace("add.u32 %r4, %r4, 10;", "add.u32 %r4, %r99, 10;")
    with pytest.raises(AssemblerError) as caught:
        assemble(broken, "sm_80")
    (line,) = [i for i, t in enumerate(broken.splitlines(), 1) if "%r99" in t]
    assert str(caught.value) == (
        f"ptxas -arch=sm_80 failed (255): line {line}; error   : "
        "Arguments mismatch for instruction 'add'"
    )


SCOPED_LOOP = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry scoped(.param .u64 out, .param .u32 n)
{
	.reg .pred %p<3>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<3>;
	ld.param.u32 %r1, [n];
	mov.u32 %r2, 0;
	{
	.reg .b32 %s;
	mov.u32 %s, 0;
again:
	add.u32 %s, %s, %r2;
	add.u32 %r2, %r2, 1;
	setp.gt.u32 %p2, %s, 50;
	@%p2 bra over;
	setp.lt.u32 %p1, %r2, %r1;
	@%p1 bra again;
over:
	mov.u32 %r3, %s;
	}
	ld.param.u64 %rd1, [out];
	st.global.u32 [%rd1], %r3;
	ret;
}
.visible .entry selfloop(.param .u32 n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<3>;
	ld.param.u32 %r1, [n];
	{
	mov.u32 %r2, 0;
spin:
	add.u32 %r2, %r2, 1;
	setp.lt.u32 %p1, %r2, %r1;
	@!%p1 bra spin;
	}
	ret;
}
"""


def test_edges_into_a_nested_scope_stay_in_the_tree() -> None:
    """Labels in a nested scope are local to it: no counting block outside can branch to them,
    so the critical edges into `over` and `again` are left to the spanning tree."""
    cfg = build(parse(SCOPED_LOOP).kernels[0])
    assert [b.depth for b in cfg.blocks] == [0, 1, 1, 1]
    result = instrument(SCOPED_LOOP, kernels={"scoped"})
    assert "_split" not in result.ptx and "vote.sync" not in result.ptx
    assemble(result.ptx, "sm_80")


def test_a_self_loop_in_a_nested_scope_is_counted_at_its_branch() -> None:
    """A one-block loop's back edge is never in the tree and, in a nested scope, can have no
    block of its own: the threads for which the branch's guard holds count themselves, just
    before it (a ballot of the guard; the lowest of them adds)."""
    result = instrument(SCOPED_LOOP, kernels={"selfloop"})
    body = [s.text for s in parse(result.ptx).function("selfloop").body]
    branch = body.index("@!%p1 bra spin")
    ballot = next(i for i, t in enumerate(body) if t.startswith("vote.sync.ballot.b32"))
    assert body[ballot].split(", ")[1] == "!%p1" and ballot < branch
    assert body[branch - 1] == "}" and "_split" not in result.ptx
    for arch in ("sm_80", "sm_90"):
        assemble(result.ptx, arch)


def test_a_cycle_of_edges_into_a_nested_scope_is_refused_in_one_line() -> None:
    """twoswitch with its whole body in a scope: its four switch edges form a cycle of edges
    that each need a counting block, and none can have one."""
    text = SHAPES_PTX.read_text()
    head, rest = text.split("\tld.param.u64 %rd1, [twoswitch_out];\n", 1)
    body, tail = rest.split("\tret;\n}", 1)
    scoped = f"{head}\t{{\n\tld.param.u64 %rd1, [twoswitch_out];\n{body}\tret;\n\t}}\n}}{tail}"
    assemble(scoped, "sm_80")  # valid PTX as written
    brx = [i for i, t in enumerate(scoped.splitlines(), 1) if "brx.idx %r2, t" in t]
    even = [i for i, t in enumerate(scoped.splitlines(), 1) if t.startswith("even:")]
    with pytest.raises(PtxError) as caught:
        instrument(scoped, kernels={"twoswitch"})
    assert str(caught.value) in {
        f"PTX line {line}: twoswitch: this branch's edge into the nested scope at line "
        f"{even[0] + k} must be counted, but a counting block cannot branch into that scope"
        for line in brx
        for k in (0, 3)
    }

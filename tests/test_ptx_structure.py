"""The PTX pass's reading side (issue #34 item 1): PTX parsed into kernels, blocks, a CFG with
its natural loops, and each block's source lines, checked against what each kernel's source says.
"""

from __future__ import annotations

import pytest

from ptx_helpers import (
    CUDA_SOURCE,
    NVCC_PTX,
    PTX_DIR,
    SHAPES_PTX,
    cuda_kernel_names,
    cuda_kernel_span,
    source_lines,
    triton_ptx,
)
from pyhpctk.instrument.ptx import EdgeKind, PtxError, block_lines, build, find_loops, parse
from pyhpctk.instrument.ptx.parse import Kind


def _loop_lines(name: str) -> list[set[int]]:
    """For each loop of nvcc's ``name``, the kernels.cu lines its blocks' instructions come from."""
    module = parse(NVCC_PTX.read_text())
    cfg = build(module.function(name))
    lines = block_lines(module, cfg)
    return [
        {loc.line for b in lp.blocks for loc in lines[b] if loc.file.endswith("kernels.cu")}
        for lp in find_loops(cfg).loops
    ]


def test_parse_finds_every_kernel_of_the_source_with_its_parameters_and_files() -> None:
    module = parse(NVCC_PTX.read_text())
    assert [k.name for k in module.kernels] == cuda_kernel_names()
    assert module.target == "sm_80"
    assert module.function("wavefront").params == tuple(f"wavefront_param_{i}" for i in range(5))
    assert module.files[1] == "tests/data/ptx/kernels.cu"
    atomic = [s for s in module.strings.values() if "atomicAdd" in s]
    assert atomic, "the .debug_str name of the inlined atomicAdd"


def test_parse_keeps_guards_vectors_scopes_and_labelled_directives() -> None:
    module = parse(SHAPES_PTX.read_text())
    assert [(f.name, f.is_entry) for f in module.functions] == [
        ("twice", False),
        ("shapes", True),
        ("twoswitch", True),
        ("empty", True),
    ]
    body = module.function("shapes").body
    kinds = [s.kind for s in body]
    assert kinds.count(Kind.OPEN) == kinds.count(Kind.CLOSE) == 1
    (table,) = [s for s in body if s.opcode == ".branchtargets"]
    assert (table.label, table.operands) == ("ts", ("case0", "case1", "case2", "case3"))
    exit_ = next(s for s in body if s.base_opcode == "exit")
    assert (exit_.guard, exit_.line) == ("@%p1", source_lines(SHAPES_PTX, r"@%p1 exit")[0])
    assert any(s.opcode == ".pragma" and s.operands == ('"nounroll"',) for s in body)
    # Triton's inline assembly writes vector operands in braces inside an instruction
    triton = parse(triton_ptx("softmax").read_text()).kernels[0]
    loads = [s for s in triton.body if s.opcode.startswith("ld.global")]
    assert loads and all(s.operands[0].startswith("{") for s in loads)


def test_cfg_of_the_handwritten_kernel_is_the_one_its_text_draws() -> None:
    cfg = build(parse(SHAPES_PTX.read_text()).function("shapes"))
    labels = [b.labels[0] if b.labels else "" for b in cfg.blocks]
    assert labels == ["", "", "case0", "case1", "case2", "case3", "join", "loop", "", "", "done"]
    x = cfg.exit
    got = {
        (labels[e.src] or e.src, labels[e.dst] if e.dst < x else "EXIT", e.kind)
        for e in cfg.edges[:-1]
    }
    assert got == {
        (0, "EXIT", EdgeKind.EXIT),  # @%p1 exit
        (0, "", EdgeKind.FALL),
        *((1, f"case{i}", EdgeKind.INDIRECT) for i in range(4)),  # brx.idx
        ("case0", "join", EdgeKind.TAKEN),
        ("case1", "case2", EdgeKind.FALL),
        ("case2", "join", EdgeKind.TAKEN),
        ("case3", "join", EdgeKind.FALL),
        ("join", "loop", EdgeKind.FALL),
        ("loop", "done", EdgeKind.TAKEN),
        ("loop", "", EdgeKind.FALL),
        (8, "done", EdgeKind.TAKEN),
        (8, "", EdgeKind.FALL),
        (9, "loop", EdgeKind.TAKEN),
        ("done", "EXIT", EdgeKind.EXIT),
    }
    assert (cfg.edges[-1].src, cfg.edges[-1].dst, cfg.edges[-1].kind) == (x, 0, EdgeKind.VIRTUAL)
    assert cfg.blocks[5].calls  # the call stays inside its block
    (loop,) = find_loops(cfg).loops
    assert (loop.header, sorted(loop.blocks), loop.back_edges) == (7, [7, 8, 9], ((9, 7),))


SCALED = "triton_kernels_$__scaled__i32"  # Triton's name for the kept-apart .func


def test_calls_printf_and_assertions_stay_inside_their_blocks() -> None:
    """Triton's debug build: a call to a .func kept apart, vprintf and __assertfail (declared
    .extern, no body), each call inside a `{ }` call sequence; an assertion ends in trap."""
    module = parse(triton_ptx("checked").read_text())
    assert sorted((f.name, f.is_entry) for f in module.functions) == [
        ("checked", True),
        (SCALED, False),
    ]
    cfg = build(module.function("checked"))
    called = [cfg.statement(c).operands for b in cfg.blocks for c in b.calls]
    names = {ops[1] if ops[0].startswith("(") else ops[0] for ops in called}
    assert names == {SCALED, "vprintf", "__assertfail"}
    traps = [b for b in cfg.blocks if b.terminator and cfg.statement(b.terminator).opcode == "trap"]
    text = triton_ptx("checked").read_text()
    kernel = module.function("checked")
    written = text[kernel.start : kernel.end].count("\ttrap;")
    assert len(traps) == written >= 1
    assert all(cfg.successors[b.index] == (cfg.exit,) for b in traps)
    assert all(b.calls for b in traps)  # __assertfail is called in the block trap ends


def test_debug_labels_start_no_block() -> None:
    """Triton's softmax is straight-line code full of $L__tmp labels: one block."""
    cfg = build(parse(triton_ptx("softmax").read_text()).kernels[0])
    assert len(cfg.blocks) == 1
    assert [e.kind for e in cfg.edges] == [EdgeKind.EXIT, EdgeKind.VIRTUAL]


@pytest.mark.parametrize(
    ("kernel", "loops"),
    [
        ("stencil", []),
        ("wavefront", []),
        ("reduce", [r"for \(int stride"]),
        ("bfs", [r"for \(int e = row"]),
        ("histogram", [r"local\[b\] = 0", r"i < n; i \+=", r"b < nbins; b \+= blockDim.x\)$"]),
        ("softmax", [r"m = fmaxf\(m, in\[c\]\)", r"s \+= expf", r"out\[c\] ="]),
    ],
)
def test_nvcc_loops_sit_on_the_source_loops(kernel: str, loops: list[str]) -> None:
    span = cuda_kernel_span(kernel)
    expected = [set(source_lines(CUDA_SOURCE, p)) & set(span) for p in loops]
    assert all(len(e) == 1 for e in expected), expected
    found = _loop_lines(kernel)
    # every source loop has a PTX loop; every PTX loop lies on one source loop (nvcc unrolls the
    # strided loops of softmax by 4, a remainder loop beside each)
    heads = {min(e) for e in expected}
    for lines in found:
        assert lines & heads, (kernel, lines)
    assert {h for h in heads if any(h in lines for lines in found)} == heads


def test_nvcc_matmul_has_its_tile_loop_holding_the_inner_loop() -> None:
    module = parse(NVCC_PTX.read_text())
    loops = find_loops(build(module.function("matmul")))
    outer, inner = loops.loops
    assert (outer.depth, inner.depth, inner.parent) == (1, 2, 0)
    assert inner.blocks < outer.blocks
    (k_line,) = source_lines(CUDA_SOURCE, r"for \(int k = 0")
    (k0_line,) = source_lines(CUDA_SOURCE, r"for \(int k0 = 0")
    outer_lines, inner_lines = _loop_lines("matmul")
    assert inner_lines == {k_line}
    assert k0_line in outer_lines and k_line in outer_lines


@pytest.mark.parametrize(
    ("kernel", "loop_pattern"),
    [(k, None) for k in ("stencil", "reduce", "histogram", "softmax")]
    + [("matmul", r"for k0 in range"), ("bfs", r"while e < end"), ("wavefront", r"for diag in")],
)
def test_triton_loops_sit_on_the_source_loops(kernel: str, loop_pattern: str | None) -> None:
    module = parse(triton_ptx(kernel).read_text())
    cfg = build(module.kernels[0])
    loops = find_loops(cfg).loops
    if loop_pattern is None:
        assert loops == ()
        return
    (loop,) = loops
    lines = block_lines(module, cfg)
    where = {loc.line for b in loop.blocks for loc in lines[b] if loc.file.endswith(".py")}
    (head,) = source_lines(PTX_DIR / "triton_kernels.py", loop_pattern)
    body_end = head + 12
    assert where and all(head <= w <= body_end for w in where), (where, head)


def test_triton_reduce_branches_on_the_program_id() -> None:
    module = parse(triton_ptx("reduce").read_text())
    cfg = build(module.kernels[0])
    (branch_line,) = source_lines(PTX_DIR / "triton_kernels.py", r"if pid % 2 == 0")
    lines = block_lines(module, cfg)
    forks = [b.index for b in cfg.blocks if len(cfg.successors[b.index]) == 2]
    assert forks and any(branch_line in {loc.line for loc in lines[f]} for f in forks)


def test_inlined_locations_keep_their_call_sites() -> None:
    module = parse(NVCC_PTX.read_text())
    cfg = build(module.function("histogram"))
    locations = {loc for counter in block_lines(module, cfg) for loc in counter}
    inlined = [loc for loc in locations if loc.inlined]
    assert inlined and all(loc.file.endswith("device_atomic_functions.hpp") for loc in inlined)
    atomic_lines = set(source_lines(CUDA_SOURCE, r"atomicAdd\("))
    assert {loc.inlined[0].line for loc in inlined} <= atomic_lines
    assert all("atomicAdd" in loc.inlined[0].function for loc in inlined)
    # Triton nests them: tl.max's reduce combines inside tl.max, inside softmax's line
    module = parse(triton_ptx("softmax").read_text())
    cfg = build(module.kernels[0])
    deep = [loc for c in block_lines(module, cfg) for loc in c if len(loc.inlined) == 2]
    (max_line,) = source_lines(PTX_DIR / "triton_kernels.py", r"tl.exp\(x - tl.max")
    assert deep and {loc.inlined[-1].line for loc in deep} >= {max_line}
    assert all(loc.inlined[0].file.endswith("standard.py") for loc in deep)


IRREDUCIBLE = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry twoway(.param .u32 n)
{
	.reg .pred %p<3>;
	.reg .b32 %r<3>;
	ld.param.u32 %r1, [n];
	setp.eq.u32 %p1, %r1, 0;
	@%p1 bra B;
A:
	add.u32 %r1, %r1, 1;
B:
	setp.lt.u32 %p2, %r1, 9;
	@%p2 bra A;
	ret;
}
"""


def test_an_irreducible_cycle_is_reported_not_made_a_loop() -> None:
    cfg = build(parse(IRREDUCIBLE).kernels[0])
    loops = find_loops(cfg)
    assert loops.loops == ()
    (edge,) = loops.irreducible  # A <-> B is entered at both: whichever edge the walk met last
    assert edge in {(1, 2), (2, 1)}


@pytest.mark.parametrize(
    ("ptx", "message"),
    [
        (".target sm_80\n", "PTX: no .version directive: this is not PTX"),
        (".version 8.0\n.entry k()\n{\n\tadd.u32 %r1, %r1, 1\n}\n",
         "PTX line 4: statement not ended by ';': 'add.u32 %r1, %r1, 1'"),
        (".version 8.0\n.entry k()\n{\n\tret;\n",
         "PTX line 2: the body of 'k' is not closed by '}'"),
    ],
)  # fmt: skip
def test_unreadable_ptx_is_refused_with_its_line(ptx: str, message: str) -> None:
    with pytest.raises(PtxError) as caught:
        parse(ptx)
    assert str(caught.value) == message


def test_a_branch_to_a_missing_label_names_the_label_and_line() -> None:
    ptx = ".version 8.0\n.entry k()\n{\n\tbra.uni nowhere;\n}\n"
    with pytest.raises(PtxError, match=r"^PTX line 4: branch to an unknown label 'nowhere'$"):
        build(parse(ptx).kernels[0])

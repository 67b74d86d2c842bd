"""The PTX pass's tracing probes (issue #34 item 4): where events are recorded, the control
block's words the probes read, the kernel's code kept, and ptxas (the nvcc wheel's) assembling
every fixture in both buffer strategies. Whether the traced kernels compute bit-identical
outputs is the device's to check (tests/data/gpu/traces_device.py)."""

from __future__ import annotations

import re

import pytest

from ptx_helpers import CUDA_SOURCE, NVCC_PTX, SHAPES_PTX, TRITON_KERNELS, source_lines, triton_ptx
from pyhpctk.instrument.ptx import (
    CONTROL,
    EVENT_DTYPE,
    EdgeKind,
    PtxError,
    SiteKind,
    Sites,
    Strategy,
    assemble,
    build,
    find_loops,
    instrument_traces,
    line_filter,
    parse,
)
from pyhpctk.instrument.ptx.parse import Kind

FIXTURES = [
    pytest.param(NVCC_PTX, "sm_90", id="nvcc"),
    pytest.param(SHAPES_PTX, "sm_90", id="shapes"),
    *(
        pytest.param(triton_ptx(k), "sm_90a", id=f"triton-{k}")
        for k in (*TRITON_KERNELS, "checked")
    ),
]


def _smem(log: str, kernel: str) -> int:
    part = log.split(f"Compiling entry function '{kernel}'", 1)[1]
    m = re.search(r"Used \d+ registers.*?(?:(\d+) bytes smem|$)", part.split("Compile time")[0])
    return int(m.group(1)) if m and m.group(1) else 0


@pytest.mark.parametrize("sites", [Sites.BLOCKS, Sites.LOOPS], ids=lambda s: s.value)
@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
@pytest.mark.parametrize(("path", "arch"), FIXTURES)
def test_traced_ptx_assembles_with_its_control_block_and_warp_state(
    path, arch, strategy: Strategy, sites: Sites
) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text()
    traced = instrument_traces(text, strategy, sites)
    assert set(traced.plans) == {k.name for k in parse(text).kernels}
    plain, done = assemble(text, arch), assemble(traced.ptx, arch)
    assert set(done.registers) == set(plain.registers)
    for kernel, plan in traced.plans.items():
        # 16 bytes of shared state per warp of a CTA (32 warps at most), declared as 1024: the
        # kernel's dynamic shared memory, placed after the static, keeps its 1024-byte
        # alignment (with 512, Triton's matmul read its swizzled wgmma tiles from a shifted
        # base and its traced output was wrong on the H100)
        grown = _smem(done.log, kernel) - _smem(plain.log, kernel)
        assert grown >= 512 and grown % 1024 == 0, grown
        assert plan.control.encode() in done.cubin  # the host finds it by name
        assert parse(traced.ptx).function(kernel).params == parse(text).function(kernel).params


def _probe_scopes(text: str, kernel: str) -> list[list[str]]:
    """The statements of each probe scope of ``kernel`` (a `{` whose `.reg`s name __pyhpctk)."""
    scopes: list[list[str]] = []
    current: list[str] | None = None
    for s in parse(text).function(kernel).body:
        if s.kind is Kind.DIRECTIVE and s.opcode == ".reg" and "%__pyhpctk" in s.text:
            if current is None:
                current = []
                scopes.append(current)
        elif s.kind is Kind.CLOSE:
            current = None
        elif current is not None and s.kind in (Kind.INSTRUCTION, Kind.LABEL):
            current.append(s.text)
    return scopes


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
def test_blocks_mode_records_every_block_entry_and_every_exit(strategy: Strategy) -> None:
    text = NVCC_PTX.read_text()
    traced = instrument_traces(text, strategy, Sites.BLOCKS)
    for kernel in parse(text).kernels:
        cfg, plan = build(kernel), traced.plans[kernel.name]
        heads = [b.index for b in cfg.blocks if b.instructions]
        exits = [i for i, e in enumerate(cfg.edges) if e.kind is EdgeKind.EXIT]
        assert [s.block for s in plan.sites if s.kind is not SiteKind.EXIT] == heads
        assert [s.kind for s in plan.sites][:1] == [SiteKind.ENTRY]
        assert [s.edge for s in plan.sites if s.kind is SiteKind.EXIT] == exits
        assert [s.id for s in plan.sites] == list(range(len(plan.sites)))
        scopes = _probe_scopes(traced.ptx, kernel.name)
        events = [sc for sc in scopes if any("%globaltimer" in t for t in sc)]
        assert len(events) == len(plan.sites) and len(scopes) == len(plan.sites) + 1  # prologue
        written = sorted(int(t.rsplit(",", 1)[1]) for sc in events for t in sc
                         if re.match(r"or\.b32 %\w+_j, %\w+_j, \d+$", t))  # fmt: skip
        assert written == [s.id for s in plan.sites]  # each probe writes its own site id


def test_loops_mode_records_each_iteration_at_the_loop_headers() -> None:
    text = NVCC_PTX.read_text()
    traced = instrument_traces(text, Strategy.CHUNKS, Sites.LOOPS)
    looped = 0
    for kernel in parse(text).kernels:
        cfg, plan = build(kernel), traced.plans[kernel.name]
        headers = sorted({lp.header for lp in find_loops(cfg).loops} - {0})
        assert [s.block for s in plan.sites if s.kind is SiteKind.LOOP] == headers
        looped += bool(headers)
    assert looped >= 4  # matmul, bfs, wavefront, histogram, softmax have loops


def test_lines_mode_records_where_a_named_line_starts_and_stops() -> None:
    text = NVCC_PTX.read_text()
    (line,) = source_lines(CUDA_SOURCE, r"frontier\[e\]|for \(int e = row\[v\]")[:1]
    named = line_filter([f"kernels.cu:{line}"])
    traced = instrument_traces(text, Strategy.EXACT, Sites.LINES, named, kernels={"bfs"})
    plan = traced.plans["bfs"]
    kinds = [s.kind for s in plan.sites]
    assert kinds[0] is SiteKind.ENTRY and kinds[-1] is SiteKind.EXIT
    lines = [s for s in plan.sites if s.kind is SiteKind.LINE]
    others = [s for s in plan.sites if s.kind is SiteKind.OTHER]
    assert lines and all(s.location is not None and s.location.line == line for s in lines)
    assert others and all(s.location is None or s.location.line != line for s in others)
    assemble(traced.ptx, "sm_90")


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["kernels.cu"], "bad line filter 'kernels.cu': say FILE:LINE or FILE:FIRST-LAST"),
        (["kernels.cu:9-3"], "bad line filter 'kernels.cu:9-3': the range runs backwards"),
    ],
)
def test_a_bad_line_filter_is_one_line(specs: list[str], message: str) -> None:
    with pytest.raises(PtxError, match=f"^PTX: {re.escape(message)}$"):
        line_filter(specs)


def test_lines_mode_without_a_filter_and_old_ptx_are_refused_in_one_line() -> None:
    text = SHAPES_PTX.read_text()
    with pytest.raises(PtxError, match=r"^PTX: lines mode needs a filter naming the lines"):
        instrument_traces(text, sites=Sites.LINES)
    with pytest.raises(PtxError, match=r"^PTX: PTX ISA 6.0 is older than 6.2"):
        instrument_traces(text.replace(".version 8.0", ".version 6.0"))


def test_line_filter_matches_file_suffixes_and_ranges() -> None:
    from pyhpctk.instrument.ptx.lines import Location

    named = line_filter(["kernels.cu:10-12", "other.py:5"])
    assert named(Location("/src/tests/kernels.cu", 11, 0))
    assert not named(Location("/src/tests/kernels.cu", 13, 0))
    assert named(Location("a/other.py", 5, 0)) and not named(Location("a/other.py", 6, 0))


def _short(text: str) -> str:
    """A probe's statement with its registers by their short names (``%__pyhpctk_t0_a``: a)."""
    return re.sub(r"%__pyhpctk\d*_t\w*?_(\w+)", r"\1", text)


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
def test_probes_read_the_control_words_the_host_writes(strategy: Strategy) -> None:
    """The offsets into the control block in the PTX are :data:`CONTROL`'s, the table's entries
    8 bytes a warp and the warp state 16 bytes; an event is two stores, 16 bytes apart, of the
    timer and clock, then the mask, ctaid.x, ctaid.y|z and the site word (EVENT_DTYPE)."""
    traced = instrument_traces(SHAPES_PTX.read_text(), strategy, kernels={"shapes"})
    plan = traced.plans["shapes"]
    prologue, first, *_ = _probe_scopes(traced.ptx, "shapes")
    offsets = {int(m) for sc in (prologue, first) for t in sc
               for m in re.findall(r"_b\+(\d+)\]", t)}  # fmt: skip
    if strategy is Strategy.EXACT:
        used = {CONTROL.TABLE, CONTROL.EVENTS, CONTROL.TALLIES, CONTROL.LOST}
        assert any("mad.wide.u32" in t and ", 8, " in t for t in prologue)  # table: 8 B a warp
    else:
        used = {CONTROL.CHUNK_EVENTS, CONTROL.NEXT_CHUNK, CONTROL.CHUNKS, CONTROL.EVENTS,
                CONTROL.LOST}  # fmt: skip
    assert offsets == {8 * c for c in used}
    assert any(t.startswith("mov.u64 %") and t.endswith(plan.control) for t in first)
    assert any(re.match(rf"mov.u32 %\w+_s, {plan.state}$", t) for t in first)
    stores = [t for t in first if "st.global.cs" in t]
    assert [_short(t.split(" ", 1)[1]) for t in stores] == [
        "st.global.cs.v2.u64 [a], {t, c}",
        "st.global.cs.v4.u32 [a+16], {m, k, i, j}",
    ]
    assert EVENT_DTYPE.names == ("time", "clock", "mask", "cta_x", "cta_yz", "where")
    moves = [re.match(r"mov.u(?:64|32) (\w+), (%[\w.]+)$", t) for t in map(_short, first)]
    reads = {m.group(2): m.group(1) for m in moves if m}
    assert reads["%globaltimer"] == "t" and reads["%clock64"] == "c"
    assert reads["%ctaid.x"] == "k" and reads["%smid"] == "j" and reads["%warpid"] == "l"


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
@pytest.mark.parametrize(("path", "arch"), FIXTURES[:2])
def test_probes_write_only_registers_of_their_own(path, arch, strategy: Strategy) -> None:  # type: ignore[no-untyped-def]
    """Every register a probe writes is declared in its scope: the kernel's values are intact."""
    text = path.read_text()
    traced = instrument_traces(text, strategy, Sites.BLOCKS)
    for kernel in traced.plans:
        for scope in _probe_scopes(traced.ptx, kernel):
            for t in scope:
                if t.endswith(":"):
                    continue
                op = t.split(" ", 1)[0] if not t.startswith("@") else t.split(" ", 2)[1]
                if op.startswith(("st.", "red.", "bar.", "bra")):
                    continue
                operands = t.split(" ", 1)[1] if not t.startswith("@") else t.split(" ", 2)[2]
                first = operands.split("}")[0] if operands.startswith("{") else operands
                written = re.findall(r"%[\w.]+", first.split(",")[0] if "{" not in first else first)
                assert written and all(r.startswith("%__pyhpctk") for r in written), t


_ACCESS = re.compile(r"^(?:@\S+ )?((?:ld|st|atom|red)\.\S+) .*\[(%\w+)(?:\+(\d+))?\]")


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
@pytest.mark.parametrize(("path", "arch"), FIXTURES)
def test_every_probe_access_is_aligned_to_its_width(path, arch, strategy: Strategy) -> None:  # type: ignore[no-untyped-def]
    """A vector access needs an address aligned to its whole width (a ``.v2.u32`` to 8 bytes,
    a ``.v4.u32`` to 16); the bases are (the warp state 16 bytes a warp, the buffers the
    driver's allocations, the control block ``.align 8``), so every offset must be a multiple
    of its access's width. A ``ld.shared.v2.u32`` at the state's +4 faulted on the H100
    (CUDA_ERROR_MISALIGNED_ADDRESS, traces_device.py)."""
    traced = instrument_traces(path.read_text(), strategy, Sites.BLOCKS)
    checked = 0
    for kernel in traced.plans:
        for scope in _probe_scopes(traced.ptx, kernel):
            for t in scope:
                m = _ACCESS.match(t)
                if m is None:
                    continue
                parts = m.group(1).split(".")
                lanes = int(next((p[1:] for p in parts if p in ("v2", "v4")), "1"))
                width = lanes * int(re.sub(r"\D", "", parts[-1])) // 8
                assert int(m.group(3) or 0) % width == 0, t
                checked += 1
    assert checked > 0


def test_the_exact_probe_reads_the_end_and_warp_index_the_prologue_stored() -> None:
    """The prologue stores each warp's state as four u32 (its cursor, its end, its grid-wide
    index, its end again); every event reads its end and index from where they are."""
    traced = instrument_traces(SHAPES_PTX.read_text(), Strategy.EXACT, kernels={"shapes"})
    prologue, *events = _probe_scopes(traced.ptx, "shapes")
    (stored,) = [re.search(r"st\.shared\.v4\.u32 \[s\], \{(.*)\}", _short(t)) for t in prologue
                 if "st.shared" in t]  # fmt: skip
    assert stored is not None
    state = dict(enumerate(x.strip() for x in stored.group(1).split(",")))  # u32 index: name
    assert state == {0: "e", 1: "k", 2: "g", 3: "k"}  # k: the end, g: the warp's index
    for event in events:
        (load,) = [re.search(r"ld\.shared\.v2\.u32 \{(\w+), (\w+)\}, \[s(?:\+(\d+))?\]",
                             _short(t)) for t in event if "ld.shared" in t]  # fmt: skip
        assert load is not None
        at = int(load.group(3) or 0) // 4
        got = {load.group(1): state[at], load.group(2): state[at + 1]}
        assert got == {"n": "k", "g": "g"}  # the event's end is the warp's end, g its index

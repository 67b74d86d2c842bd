"""Unit tests of pystruct's pieces: ELF opening, DWARF, CFGs and loops, inline trees, the metric."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcstruct_model import Scope, StructureFile
from pyhpctk.structure.cfg import Block, Decoder, Flow, Instruction, build_cfg, find_loops
from pyhpctk.structure.compare import compare, facts
from pyhpctk.structure.cubin import maxwell_instructions
from pyhpctk.structure.dwarf import InlineNode, demangle, read_debug_info
from pyhpctk.structure.elfimage import EM_AARCH64, EM_X86_64, CodeRegion, ElfImage, open_image
from pyhpctk.structure.inline_tree import (
    ExitCondition,
    Stmt,
    TreeNode,
    find_loop_header,
    tree_scopes,
)
from pyhpctk.structure.jumptables import JumpTableResolver

HOST = "inlines+loops-x86_64-gcc10-dr"


def _bytes(reference: Path, name: str = HOST) -> bytes:
    return (reference / "bin" / name).read_bytes()


# --------------------------------------------------------------------------- ELF errors


def test_not_an_elf_names_the_file_and_the_header(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, world\n")
    with pytest.raises(FormatError, match=r"notes.txt: ELF header: not an ELF file"):
        open_image(path)


def test_truncated_elf_is_reported_not_a_traceback(reference: Path, tmp_path: Path) -> None:
    path = tmp_path / "truncated"
    path.write_bytes(_bytes(reference)[:200])
    with pytest.raises(FormatError, match=r"truncated"):
        open_image(path)


def test_unknown_architecture_is_refused(reference: Path) -> None:
    data = bytearray(_bytes(reference))
    struct.pack_into("<H", data, 18, 2)  # EM_SPARC
    with pytest.raises(FormatError, match=r"unsupported architecture \(e_machine 2\)"):
        open_image(bytes(data), name="sparc-binary")


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"no such file"):
        open_image(tmp_path / "absent")


def test_corrupt_dwarf_raises_format_error_naming_dwarf(reference: Path) -> None:
    data = bytearray(_bytes(reference))
    section = ELFFile(io.BytesIO(bytes(data))).get_section_by_name(".debug_info")
    offset, size = section["sh_offset"], section["sh_size"]
    data[offset + 11 : offset + size] = b"\xff" * (size - 11)
    image = open_image(bytes(data), name="corrupt-dwarf")
    with pytest.raises(FormatError, match=r"corrupt-dwarf: DWARF: corrupt debug information"):
        read_debug_info(image)


def test_functions_and_plt_stubs_come_from_symbols_and_relocations(reference: Path) -> None:
    image = open_image(reference / "bin" / HOST)
    assert image.machine == EM_X86_64 and image.is_shared
    names = {f.link_name for f in image.functions}
    assert {"f1", "f2", "f3_1", "f4_2", "_init", "_fini"} <= names
    assert image.plt_names == {0x1030: "printf"}


def test_line_map_gives_file_and_line_of_an_address(reference: Path) -> None:
    info = read_debug_info(open_image(reference / "bin" / HOST))
    hit = info.line_map.lookup(0x1150)  # f3_1's loop body, line 25 (struct/…-dr.hpcstruct)
    assert hit is not None and hit[0] == "/src/inlines+loops.c" and hit[1] == 25
    assert info.line_map.lookup(0x1000) is None  # _init has no line information


def test_inline_chain_names_call_site_and_callee(reference: Path) -> None:
    info = read_debug_info(open_image(reference / "bin" / HOST))
    node = info.inlines.nodes_for(np.array([0x12A0], dtype=np.uint64), 0x1280, 0x12E9)[0]
    assert info.inlines.chain(int(node)) == (InlineNode("/src/inlines+loops.c", 54, "f4_inline"),)


def test_demangle_uses_cxxfilt_and_passes_c_names_through() -> None:
    assert demangle("_Z4f3_1v") == "f3_1()"
    assert demangle("f3_1") == "f3_1"


# --------------------------------------------------------------------------- CFG and loops


def _graph(edges: dict[int, list[int]], n: int) -> list[Block]:
    blocks = [Block(i, 16 * i, 16 * i + 16, [Instruction(16 * i, 16, Flow.NEXT)]) for i in range(n)]
    for src, dsts in edges.items():
        blocks[src].succs = list(dsts)
        for d in dsts:
            blocks[d].preds.append(src)
    return blocks


def test_simple_loop_has_its_header_and_body() -> None:
    loops = find_loops(_graph({0: [1], 1: [2], 2: [1, 3]}, 4), 0)
    assert len(loops) == 1
    assert loops[0].header == 1 and loops[0].blocks == {1, 2} and not loops[0].irreducible


def test_nested_loops_form_a_tree() -> None:
    blocks = _graph({0: [1], 1: [2, 4], 2: [3], 3: [2, 1]}, 5)
    (outer,) = find_loops(blocks, 0)
    assert outer.header == 1 and outer.blocks == {1, 2, 3}
    (inner,) = outer.children
    assert inner.header == 2 and inner.blocks == {2, 3}


def test_irreducible_region_is_one_loop_with_two_entries() -> None:
    blocks = _graph({0: [1, 2], 1: [2], 2: [1, 3]}, 4)
    (loop,) = find_loops(blocks, 0)
    assert loop.irreducible
    assert sorted(loop.entries) == [1, 2] and loop.blocks == {1, 2}


def test_self_loop_is_a_loop() -> None:
    (loop,) = find_loops(_graph({0: [1], 1: [1, 2]}, 3), 0)
    assert loop.header == 1 and loop.blocks == {1}


def test_capstone_cfg_finds_the_loop_of_real_machine_code() -> None:
    # xor eax,eax ; L: inc eax ; cmp eax,10 ; jne L ; ret
    code = bytes.fromhex("31c0ffc083f80a75f9c3")
    instructions = Decoder(EM_X86_64).decode(code, 0x400)
    assert [i.flow for i in instructions] == [
        Flow.NEXT,
        Flow.NEXT,
        Flow.NEXT,
        Flow.BRANCH,
        Flow.RETURN,
    ]
    cfg = build_cfg(instructions, 0x400, 0x400, 0x400 + len(code))
    (loop,) = cfg.loops
    assert cfg.blocks[loop.header].start == 0x402


def test_aarch64_conditional_branch_closes_a_loop() -> None:
    # mov w0,#0 ; L: add w0,w0,#1 ; cmp w0,#10 ; b.ne L ; ret
    code = bytes.fromhex("00008052000400111f280071c1ffff54c0035fd6")
    instructions = Decoder(EM_AARCH64).decode(code, 0x1000)
    assert instructions[3].flow == Flow.BRANCH and instructions[3].target == 0x1004
    assert instructions[4].flow == Flow.RETURN
    (loop,) = build_cfg(instructions, 0x1000, 0x1000, 0x1000 + len(code)).loops
    assert loop.blocks == {1}


# gcc 12 -O2 -fPIC of: int f(int k, int n) { int s = 0; for (int i = 0; i < n; i++)
# switch ((k + i) & 7) { case 0: ... case 6: ...; default: ... } return s; }  (7-entry table)
_SWITCH_CODE = bytes.fromhex(
    "85f67e7431d231c94c8d05f10e0000908d041783e00783f8067751496304804c01c0ffe00f1f400029d1"
    "660f1f44000083c20139d675d989c8c3660f1f44000001d1ebec0f1f40008d0cc9ebe30f1f0083e907eb"
    "db0f1f0083f105ebd30f1f0083c103ebcb0f1f0031d1ebc48d4c4901ebbe660f1f44000031c989c8c3"
)
_SWITCH_TABLE = bytes.fromhex("60f1ffff58f1ffff50f1ffff48f1ffff40f1ffff28f1ffff68f1ffff")


def test_switch_cases_reached_through_a_jump_table_are_inside_the_loop() -> None:
    raw = _SWITCH_CODE + _SWITCH_TABLE
    end = 0x1100 + len(_SWITCH_CODE)
    image = ElfImage(
        "libsw.so",
        EM_X86_64,
        True,
        [CodeRegion(".text", 0x1100, end, _SWITCH_CODE)],
        [],
        None,
        raw=raw,
        loaded=[(0x1100, end, 0), (0x2000, 0x201C, len(_SWITCH_CODE))],
    )
    instructions = Decoder(EM_X86_64).decode(_SWITCH_CODE, 0x1100)
    tables = JumpTableResolver(image).resolve(instructions, 0x1100, end)
    assert tables == {0x1122: [0x1128, 0x1140, 0x1148, 0x1150, 0x1158, 0x1160, 0x1168]}
    cfg = build_cfg(instructions, 0x1100, 0x1100, end, jump_tables=tables)
    (loop,) = cfg.loops
    starts = {cfg.blocks[b].start for b in loop.blocks}
    assert {0x1110, 0x1128, 0x1140, 0x1168, 0x116C} <= starts
    # Without the table the cases are unreachable and the loop holds only the default path.
    (bare,) = build_cfg(instructions, 0x1100, 0x1100, end).loops
    assert len(bare.blocks) < len(loop.blocks)


def test_pascal_branches_are_decoded_without_nvdisasm(reference: Path) -> None:
    image = open_image(reference / "bin" / "inlines+loops-sm_62-nvcc102-r")
    by_address = {i.address: i for i in maxwell_instructions(image)}
    # f3_1: "@!P0 BRA" back to the loop header 0x1f50 (struct/…-r+gpucfg.hpcstruct), EXIT.
    assert by_address[0x1FB8].flow == Flow.BRANCH and by_address[0x1FB8].target == 0x1F50
    assert by_address[0x1FC8].flow == Flow.RETURN
    assert by_address[0x1FC0].flow == Flow.NEXT  # a control word


# --------------------------------------------------------------------------- inline tree


def test_statements_earlier_than_the_procedure_line_go_in_a_guard_alien() -> None:
    root = TreeNode()
    root.add_stmt((), Stmt(0x10, 4, "/a.c", 10))
    root.add_stmt((), Stmt(0x14, 4, "/a.c", 7))
    root.add_stmt((), Stmt(0x18, 4, "/b.h", 3))
    scopes = tree_scopes(root, "/a.c", 10, call_tags=False)
    assert [(s.tag, s.attrs.get("n"), s.attrs.get("f")) for s in scopes] == [
        ("S", None, None),
        ("A", "<inline>", "/a.c"),
        ("A", "<inline>", "/b.h"),
    ]
    assert scopes[1].children[0].attrs["v"] == "{[0x14-0x18)}"


def test_inlined_code_becomes_a_call_site_and_callee_pair() -> None:
    root = TreeNode()
    call = InlineNode("/a.c", 19, "f_inlined")
    root.add_stmt((call,), Stmt(0x20, 4, "/a.c", 9))
    root.add_stmt((call,), Stmt(0x24, 4, "/a.c", 9))
    (outer,) = tree_scopes(root, "/a.c", 18, call_tags=False)
    assert (outer.tag, outer.attrs["n"], outer.attrs["l"]) == ("A", "", "19")
    (inner,) = outer.children
    assert (inner.attrs["n"], inner.attrs["l"]) == ("f_inlined", "9")
    assert inner.children[0].attrs == {"i": "0", "l": "9", "v": "{[0x20-0x28)}"}


def test_loop_header_is_the_lowest_exit_condition_line() -> None:
    raw = TreeNode()
    for vma, line in ((0x50, 25), (0x55, 24), (0x5D, 24)):
        raw.add_stmt((), Stmt(vma, 5, "/a.c", line))
    conditions = [
        ExitCondition(0x5D, "/a.c", 24, ()),
        ExitCondition(0x55, "/a.c", 26, ()),
    ]
    info = find_loop_header(raw, conditions, "/a.c", 0x50, False)
    assert (info.file, info.line, info.entry_vma) == ("/a.c", 24, 0x50)


# --------------------------------------------------------------------------- metric


def _structure(*procs: Scope) -> StructureFile:
    lm = Scope("LM", {"i": "2", "n": "x", "has-calls": "0", "v": "{}"})
    lm.children.append(Scope("F", {"i": "3", "n": "/a.c"}, list(procs)))
    return StructureFile(modules=[lm])


def _proc(*children: Scope) -> Scope:
    return Scope("P", {"n": "f", "l": "1", "v": "{[0x10-0x11)}"}, list(children))


def _stmt(line: int) -> Scope:
    return Scope("S", {"l": str(line), "v": "{[0x10-0x14)}"})


def test_identical_files_score_one() -> None:
    a = _structure(_proc(_stmt(1), _stmt(2)))
    scores = compare(a, a)
    assert all(s.precision == 1.0 and s.recall == 1.0 for s in scores.values())


def test_missing_and_extra_statements_lower_recall_and_precision() -> None:
    ours = _structure(_proc(_stmt(1), _stmt(3)))
    theirs = _structure(_proc(_stmt(1), _stmt(2)))
    score = compare(ours, theirs)["statements"]
    assert (score.matched, score.ours, score.theirs) == (1, 2, 2)
    assert score.precision == 0.5 and score.recall == 0.5


def test_inline_pairs_count_but_guard_aliens_do_not() -> None:
    pair = Scope(
        "A",
        {"n": "", "f": "/a.c", "l": "19"},
        [
            Scope("A", {"n": "g", "f": "/g.h", "l": "3"}, [_stmt(3)]),
        ],
    )
    guard = Scope("A", {"n": "<inline>", "f": "/a.c", "l": "0"}, [_stmt(0)])
    loop = Scope("L", {"l": "5", "f": "/a.c"}, [Scope("L", {"l": "6", "f": "/a.c"})])
    found = facts(_structure(_proc(pair, guard, loop)))
    assert list(found["inlines"]) == [("f", "/a.c", 19, "g")]
    assert ("f", "/g.h", 3) in found["statements"]
    assert set(found["loops"]) == {
        ("f", (("/a.c", 5),)),
        ("f", (("/a.c", 5), ("/a.c", 6))),
    }


def test_aliases_rewrite_our_paths_only() -> None:
    ours = _structure(_proc(Scope("A", {"n": "<inline>", "f": "/old/x.h", "l": "1"}, [_stmt(1)])))
    theirs = _structure(_proc(Scope("A", {"n": "<inline>", "f": "/new/x.h", "l": "1"}, [_stmt(1)])))
    assert compare(ours, theirs)["statements"].recall == 0.0
    assert compare(ours, theirs, {"/old/": "/new/"})["statements"].recall == 1.0

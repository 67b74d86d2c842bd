"""Context expansion from real hpcstruct files: procedures, loops, inlined calls, guard aliens."""

from __future__ import annotations

from pathlib import Path

from pyhpctk.analysis.context import LexicalType, Relation
from pyhpctk.analysis.expand import struct_steps
from pyhpctk.analysis.structmap import index_structure
from pyhpctk.formats import hpcstruct

STRUCT = "struct/inlines+loops-x86_64-gcc8-dr.hpcstruct"
SOURCE = "/src/inlines+loops.c"


def _steps(reference: Path, address: int) -> list[tuple[str, str, object, object]]:
    (index,) = index_structure(hpcstruct.read(reference / STRUCT))
    chain = index.lookup(address)
    assert chain is not None
    return [
        (
            k.relation.name,
            k.lexical_type.name,
            k.function.name if k.function is not None else None,
            k.line if k.file is not None else None,
        )
        for k in struct_steps("bin", chain, address)
    ]


def test_inlined_call_inside_a_loop(reference: Path) -> None:
    # P f4_1 > L 53 > A(call site l=54) > A f4_inline l=48 > L 48 > S 49
    assert _steps(reference, 0x12C0) == [
        ("CALL", "FUNCTION", "f4_1 [inlines+loops-x86_64-gcc8-dr]", None),
        ("LEXICAL", "LOOP", None, 53),
        ("LEXICAL", "LINE", None, 54),
        ("INLINED", "FUNCTION", "f4_inline", None),
        ("LEXICAL", "LOOP", None, 48),
        ("LEXICAL", "LINE", None, 49),
        ("LEXICAL", "INSTRUCTION", None, None),
    ]


def test_guard_alien_only_switches_the_file(reference: Path) -> None:
    steps = _steps(reference, 0x11F1)  # S l=35 inside <A n="<inline>">
    assert [s[1] for s in steps] == ["FUNCTION", "LINE", "INSTRUCTION"]
    assert steps[1][3] == 35


def test_instruction_is_elided_and_payloads_are_set(reference: Path) -> None:
    (index,) = index_structure(hpcstruct.read(reference / STRUCT))
    chain = index.lookup(0x12C0)
    assert chain is not None
    keys = struct_steps("bin", chain, 0x12C0)
    assert keys[-1].is_elided and keys[-1].module == "bin" and keys[-1].offset == 0x12C0
    loop = keys[1]
    assert loop.relation is Relation.LEXICAL and loop.lexical_type is LexicalType.LOOP
    assert (loop.file, loop.line, loop.module, loop.offset) == (SOURCE, 53, "bin", 0x12B0)
    inlined = keys[3].function
    assert inlined is not None and (inlined.offset, inlined.file, inlined.line) == (0, SOURCE, 48)


def test_addresses_outside_every_statement_are_not_found(reference: Path) -> None:
    (index,) = index_structure(hpcstruct.read(reference / STRUCT))
    assert index.lookup(0) is None
    assert index.lookup(0xFFFFFFFF) is None

"""Tests of structure recovery for Python sources (pystruct on .py files)."""

from __future__ import annotations

import argparse
import json.decoder
import sys
import textwrap
import types
from pathlib import Path

import pytest

from pyhpctk.errors import PyhpctkError
from pyhpctk.formats import hpcstruct
from pyhpctk.formats.hpcstruct import AddressMap
from pyhpctk.formats.hpcstruct_model import Scope
from pyhpctk.structure.python_source import (
    PythonStructureOptions,
    PythonSyntaxError,
    find_procedures,
    frame_line,
    line_address_set,
    recover_module,
    recover_structure,
)

SAMPLE = textwrap.dedent(
    """\
    import functools


    def outer(n):
        total = 0
        for i in range(n):
            j = 0
            while j < i:
                total += j
                j += 1
        else:
            total = -total
        return total


    @functools.lru_cache(maxsize=None)
    @staticmethod
    def decorated(x,
                  y=[k for k in range(3)]):
        def inner():
            return x
        return [a * b
                for a in range(x)
                for b in range(a) if b]


    class Shape:
        scale = lambda self, f: f * 2

        def area(self, sides):
            return sum(s for s in sides)


    async def fetch(items):
        async for item in items:
            yield {item: item}


    squares = {c: c * c for c in range(4)}
    """
)

# Worked out by hand from SAMPLE's line numbers (see python_source's docstring for the rules).
# One line per P or L: tag, name, @line, ln=qualname when it differs, S=its own statement lines.
EXPECTED_CODE_OBJECTS = """\
LM sample.py
 F sample.py
  P <module> @1 S=1,4,16,17,18,19,27,34,39
   P outer @4 S=5,6,12,13
    L @6 S=6,7
     L @8 S=8,9,10
   P decorated @16 S=20,22,23
    P inner @20 ln=decorated.<locals>.inner S=21
    P <listcomp> @22 ln=decorated.<locals>.<listcomp> S=22
     L @22 S=22,23,24
      L @22 S=22,24
   P <listcomp> @19 S=19
    L @19 S=19
   P Shape @27 S=28,30
    P <lambda> @28 ln=Shape.<lambda> S=28
    P area @30 ln=Shape.area S=31
     P <genexpr> @31 ln=Shape.area.<locals>.<genexpr> S=31
      L @31 S=31
   P fetch @34 S=35
    L @35 S=35,36
   P <dictcomp> @39 S=39
    L @39 S=39
"""

EXPECTED_INLINED = """\
LM sample.py
 F sample.py
  P <module> @1 S=1,4,16,17,18,19,27,34,39
   P outer @4 S=5,6,12,13
    L @6 S=6,7
     L @8 S=8,9,10
   P decorated @16 S=20,22,23
    P inner @20 ln=decorated.<locals>.inner S=21
    L @22 S=22,23,24
     L @22 S=22,24
   L @19 S=19
   P Shape @27 S=28,30
    P <lambda> @28 ln=Shape.<lambda> S=28
    P area @30 ln=Shape.area S=31
     P <genexpr> @31 ln=Shape.area.<locals>.<genexpr> S=31
      L @31 S=31
   P fetch @34 S=35
    L @35 S=35,36
   L @39 S=39
"""

CODE_OBJECTS = PythonStructureOptions(inline_comprehensions=False)
INLINED = PythonStructureOptions(inline_comprehensions=True)


def render(scope: Scope, depth: int = 0) -> str:
    """A compact outline: every non-S scope on its own line with its own S lines."""
    head = f"{scope.tag} {scope.name}".rstrip() if scope.tag in ("LM", "F", "P") else scope.tag
    if "l" in scope.attrs and scope.tag != "LM":
        head += f" @{scope.line}"
    if "ln" in scope.attrs:
        head += f" ln={scope.attrs['ln']}"
    lines = [s.line for s in scope.children if s.tag == "S"]
    if lines:
        head += " S=" + ",".join(map(str, lines))
    text = " " * depth + head + "\n"
    return text + "".join(render(c, depth + 1) for c in scope.children if c.tag != "S")


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    found = [code]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found += _code_objects(constant)
    return found


# ------------------------------------------------------------------------------------------
# tree shape


def test_sample_tree_with_code_object_comprehensions() -> None:
    module = recover_module("sample.py", SAMPLE.encode(), CODE_OBJECTS)
    assert render(module) == EXPECTED_CODE_OBJECTS


def test_sample_tree_with_inlined_comprehensions() -> None:
    module = recover_module("sample.py", SAMPLE.encode(), INLINED)
    assert render(module) == EXPECTED_INLINED


def test_default_options_follow_the_running_interpreter() -> None:
    assert PythonStructureOptions().inline_comprehensions == (sys.version_info >= (3, 12))


def test_attributes_follow_hpcstructs_layout_and_line_address_convention() -> None:
    structure = recover_structure("sample.py", SAMPLE.encode(), CODE_OBJECTS)
    (module,) = structure.modules
    assert list(module.attrs.items()) == [
        ("i", "2"),
        ("n", "sample.py"),
        ("has-calls", "0"),
        ("v", "{}"),
    ]
    procedure = find_procedures(module, "area", 30)[0]
    assert list(procedure.attrs.items()) == [
        ("i", procedure.attrs["i"]),
        ("n", "area"),
        ("ln", "Shape.area"),
        ("l", "30"),
        ("v", "{[0x1e-0x1f)}"),
    ]
    loop = next(s for s in module.walk() if s.tag == "L" and s.line == 35)
    assert list(loop.attrs)[1:] == ["l", "f", "v"]
    assert loop.attrs["f"] == "sample.py" and loop.ranges == [(35, 36)]
    for scope in module.walk():
        if scope.tag == "S":
            assert scope.ranges == [(scope.line, scope.line + 1)]
    assert line_address_set(7) == "{[0x7-0x8)}"


def test_round_trip_through_writer_and_reader() -> None:
    structure = recover_structure("sample.py", SAMPLE.encode(), CODE_OBJECTS)
    assert hpcstruct.verify(structure) == []
    data = hpcstruct.to_bytes(structure)
    assert data.startswith(b'<?xml version="1.0"?>\n<!DOCTYPE HPCToolkitStructure [')
    again = hpcstruct.read(data)
    assert again == structure
    assert render(again.modules[0]) == EXPECTED_CODE_OBJECTS
    assert hpcstruct.to_bytes(again) == data


def test_recover_structure_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sample.py"
    path.write_text(SAMPLE)
    structure = recover_structure(path, options=CODE_OBJECTS)
    assert structure.modules[0].name == str(path)
    assert render(structure.modules[0]).replace(str(path), "sample.py") == EXPECTED_CODE_OBJECTS


# ------------------------------------------------------------------------------------------
# agreement with CPython's own code objects (the interpreter is the oracle)


def _check_against_compiler(path: str, source: bytes) -> None:
    """Every code object is a P with its co_name, co_firstlineno and co_qualname, and every line
    its bytecode can report resolves, inside that P, to a statement or marker."""
    module = recover_module(path, source)
    for code in _code_objects(compile(source, path, "exec")):
        procedures = find_procedures(module, code.co_name, code.co_firstlineno)
        assert procedures, (code.co_name, code.co_firstlineno)
        assert code.co_qualname in [p.attrs.get("ln", p.name) for p in procedures]
        lines = sorted({line for _, _, line in code.co_lines() if line})
        resolved: set[int] = set()
        for procedure in procedures:
            found = AddressMap(procedure, nested_procedures=False).lookup(lines)
            resolved |= {line for line, index in zip(lines, found, strict=True) if index >= 0}
        assert resolved == set(lines), (code.co_qualname, sorted(set(lines) - resolved))


def test_sample_matches_the_compilers_code_objects() -> None:
    _check_against_compiler("sample.py", SAMPLE.encode())


@pytest.mark.parametrize("module", [json.decoder, argparse, textwrap])
def test_stdlib_modules_match_the_compilers_code_objects(module: types.ModuleType) -> None:
    path = module.__file__
    assert path is not None
    _check_against_compiler(path, Path(path).read_bytes())


def test_co_firstlineno_is_the_first_decorator_line() -> None:
    source = b"@a\n@b\n\ndef f():\n    pass\n\n@c\nclass K:\n    pass\n"
    module = recover_module("d.py", source)
    namespace: dict[str, object] = {"a": lambda f: f, "b": lambda f: f, "c": lambda k: k}
    exec(compile(source, "d.py", "exec"), namespace)
    function, klass = namespace["f"], namespace["K"]
    assert isinstance(function, types.FunctionType) and isinstance(klass, type)
    assert function.__code__.co_firstlineno == 1
    assert [p.line for p in find_procedures(module, "f", 1)] == [1]
    assert [p.line for p in find_procedures(module, "K", 7)] == [7]


# ------------------------------------------------------------------------------------------
# address lookups as pyprof does them


def test_logical_frame_lookup_finds_loop_nests() -> None:
    module = recover_module("sample.py", SAMPLE.encode(), CODE_OBJECTS)
    (outer,) = find_procedures(module, "outer", 4)
    amap = AddressMap(outer, nested_procedures=False)
    fid = 7
    frames = [(fid << 32) | line for line in (5, 6, 9, 12)]
    paths = amap.paths([frame_line(ip) for ip in frames])
    assert [[(s.tag, s.line) for s in path] for path in paths] == [
        [("P", 4), ("S", 5)],
        [("P", 4), ("L", 6), ("S", 6)],  # the header line resolves to the loop, not the init
        [("P", 4), ("L", 6), ("L", 8), ("S", 9)],
        [("P", 4), ("S", 12)],  # for-else runs once, outside the loop
    ]


def test_a_line_shared_by_two_functions_resolves_per_function() -> None:
    module = recover_module("sample.py", SAMPLE.encode(), CODE_OBJECTS)
    (shape,) = find_procedures(module, "Shape", 27)
    (lam,) = find_procedures(module, "<lambda>", 28)
    in_class = AddressMap(shape, nested_procedures=False).paths([28])[0]
    in_lambda = AddressMap(lam, nested_procedures=False).paths([28])[0]
    assert [s.tag for s in in_class] == ["P", "S"] and in_class[0] is shape
    assert [s.tag for s in in_lambda] == ["P", "S"] and in_lambda[0] is lam


def test_two_genexprs_on_one_line_are_both_found() -> None:
    # Same co_name and co_firstlineno: a measurement cannot tell them apart.
    source = b"x = [sum(a for a in r), sum(b for b in r)]\n"
    module = recover_module("g.py", source)
    found = find_procedures(module, "<genexpr>", 1)
    assert len(found) == 2 and found[0] is not found[1]
    assert find_procedures(module, "<genexpr>", 2) == []


# ------------------------------------------------------------------------------------------
# input handling


def test_syntax_error_names_file_line_and_column() -> None:
    with pytest.raises(PythonSyntaxError) as caught:
        recover_module("bad.py", b"def f():\n    return (1,\n\nx = ]\n")
    error = caught.value
    assert isinstance(error, PyhpctkError)
    assert str(error).startswith(f"bad.py:{error.line}:{error.column}: ")
    assert error.line >= 2 and error.column >= 1


def test_syntax_error_position_is_exact() -> None:
    with pytest.raises(PythonSyntaxError, match=r"^bad\.py:3:5: "):
        recover_module("bad.py", b"a = 1\nb = 2\nc = = 3\n")


def test_null_bytes_are_a_syntax_error() -> None:
    with pytest.raises(PythonSyntaxError, match=r"^nul\.py:"):
        recover_module("nul.py", b"x = 1\x00\n")


def test_coding_declaration_is_honoured() -> None:
    source = "# -*- coding: latin-1 -*-\ndef café():\n    return 'é'\n".encode("latin-1")
    module = recover_module("latin.py", source)
    assert [p.name for p in module.walk() if p.tag == "P"] == ["<module>", "café"]
    # Without the declaration the latin-1 byte is invalid UTF-8.
    with pytest.raises(PythonSyntaxError, match=r"^utf8\.py:\d+:\d+: "):
        recover_module("utf8.py", source.split(b"\n", 1)[1])


def test_utf8_bom_is_accepted() -> None:
    module = recover_module("bom.py", b"\xef\xbb\xbfdef f():\n    pass\n")
    assert [p.name for p in module.walk() if p.tag == "P"] == ["<module>", "f"]


def test_missing_file_is_a_pyhpctk_error(tmp_path: Path) -> None:
    with pytest.raises(PyhpctkError, match="cannot read"):
        recover_module(tmp_path / "absent.py")


def test_very_long_expressions_do_not_hit_the_recursion_limit() -> None:
    # 2500 nested BinOps: deeper than Python's recursion limit, within the parser's.
    source = ("total = " + " + ".join(["1"] * 2500) + "\n").encode()
    module = recover_module("long.py", source)
    (procedure,) = find_procedures(module, "<module>", 1)
    assert [s.line for s in procedure.children] == [1]


def test_expressions_too_deep_for_the_parser_are_a_syntax_error() -> None:
    source = ("total = " + " + ".join(["1"] * 20000) + "\n").encode()
    with pytest.raises(PythonSyntaxError, match=r"^long\.py:0:0: .*recursion"):
        recover_module("long.py", source)


def test_loop_else_and_multiline_headers() -> None:
    source = textwrap.dedent(
        """\
        def f(a):
            for x in (
                a):
                pass
            else:
                y = 1
            while (a >
                   1):
                a -= 1
        """
    ).encode()
    (function,) = find_procedures(recover_module("m.py", source), "f", 1)
    assert render(function) == "P f @1 S=2,3,6\n L @2 S=2,4\n L @7 S=7,8,9\n"

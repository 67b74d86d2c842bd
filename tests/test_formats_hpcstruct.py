"""Tests of the hpcstruct XML reader/writer, checker, dumper and AddressMap (formats.md §4)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import hpcstruct
from pyhpctk.formats.hpcstruct import (
    ALLOWED_CHILDREN,
    ATTRIBUTE_ORDER,
    DTD_4_9,
    DTD_4_9_SPDX,
    AddressMap,
)
from pyhpctk.formats.hpcstruct_model import Scope, StructureFile, parse_ranges

GCC10_D = "struct/inlines+loops-x86_64-gcc10-d.hpcstruct"
SMALL = "meas/small.m/structs/testmeas-small.hpcstruct"
LIBC = "meas/loops-cputime-t.m/structs/libc-2.31.so.hpcstruct"
RECURSION_GPUCFG = "struct/recursion-sm_75-nvcc112-0+gpucfg.hpcstruct"
CUDA_HOST = "meas/loops-cuda-nvidia-t.m/structs/testmeas-loops-cuda.hpcstruct"

Shape = tuple[str, list[tuple[str, str]], list["Shape"]]


def shape(scope: Scope) -> Shape:
    """Everything a Scope holds, attribute order included (dict equality ignores order)."""
    return (scope.tag, list(scope.attrs.items()), [shape(child) for child in scope.children])


def file_shape(structure: StructureFile) -> object:
    return (
        structure.version,
        list(structure.root_attrs.items()),
        structure.doctype,
        [shape(module) for module in structure.modules],
    )


def all_struct_files(reference: Path) -> list[Path]:
    files = sorted(reference.glob("**/*.hpcstruct"))
    assert len(files) >= 60
    return files


def minimal(body: str, version: str = "4.9", root: str = "HPCToolkitStructure") -> bytes:
    """A small hand-written file; line 3 is the first element after the root's line 2."""
    return (
        f'<?xml version="1.0"?>\n<{root} i="0" version="{version}" n="">\n{body}</{root}>\n'
    ).encode()


# ------------------------------------------------------------------------------------------
# sniff


def test_sniff_accepts_every_reference_file_head(reference: Path) -> None:
    for path in all_struct_files(reference):
        assert hpcstruct.sniff(path.read_bytes()[:64]), path


@pytest.mark.parametrize(
    "head",
    [
        b"HPCRUN-profile____04.00b",
        b"HPCTOOLKITtrce",
        b'<?xml version="1.0"?>\n<!DOCTYPE HPCToolkitExperiment [',
        b'<?xml version="1.0"?>\n<html>',
        b"",
    ],
)
def test_sniff_rejects_other_formats(head: bytes) -> None:
    assert not hpcstruct.sniff(head)


def test_sniff_accepts_a_file_without_doctype() -> None:
    assert hpcstruct.sniff(minimal("")[:64])


# ------------------------------------------------------------------------------------------
# byte-exact round trips on real files


def test_write_reproduces_every_reference_file_byte_for_byte(reference: Path) -> None:
    mismatched = [
        path.name
        for path in all_struct_files(reference)
        if hpcstruct.to_bytes(hpcstruct.read(path)) != path.read_bytes()
    ]
    assert mismatched == []


def test_reference_files_verify_clean(reference: Path) -> None:
    problems = {
        path.name: hpcstruct.verify(hpcstruct.read(path)) for path in all_struct_files(reference)
    }
    assert {name: found for name, found in problems.items() if found} == {}


def test_both_dtd_constants_are_hpcstructs_text(reference: Path) -> None:
    doctypes = {hpcstruct.read(path).doctype for path in all_struct_files(reference)}
    assert doctypes == {DTD_4_9, DTD_4_9_SPDX}


def test_empty_doctype_writes_the_default_dtd(reference: Path) -> None:
    structure = hpcstruct.read(reference / SMALL)
    assert structure.doctype == DTD_4_9
    structure.doctype = ""
    assert hpcstruct.to_bytes(structure) == (reference / SMALL).read_bytes()


def test_renumber_restores_hpcstructs_ids(reference: Path) -> None:
    for name in (GCC10_D, LIBC, RECURSION_GPUCFG):
        original = (reference / name).read_bytes()
        structure = hpcstruct.read(reference / name)
        for module in structure.modules:
            for scope in module.walk():
                del scope.attrs["i"]
        structure.root_attrs["i"] = "17"
        hpcstruct.renumber(structure)
        assert hpcstruct.to_bytes(structure) == original, name


def test_read_keeps_attribute_order_and_unescapes(reference: Path) -> None:
    structure = hpcstruct.read(reference / GCC10_D)
    assert list(structure.root_attrs.items()) == [("i", "0"), ("version", "4.9"), ("n", "")]
    (module,) = structure.modules
    assert list(module.attrs) == ["i", "n", "has-calls", "v"]
    first = module.children[0].children[0]
    assert list(first.attrs.items()) == [
        ("i", "4"),
        ("n", "f1 [inlines+loops-x86_64-gcc10-d]"),
        ("ln", "f1"),
        ("l", "13"),
        ("v", "{[0x1105-0x1106)}"),
    ]
    cuda = hpcstruct.read(reference / CUDA_HOST)
    names = {scope.name for scope in cuda.modules[0].walk()}
    assert (
        "std::operator<< <std::char_traits<char> >(std::basic_ostream<char, "
        "std::char_traits<char> >&, char const*)"
    ) in names


def test_read_accepts_path_bytes_memoryview_and_stream(reference: Path) -> None:
    path = reference / SMALL
    data = path.read_bytes()
    expected = file_shape(hpcstruct.read(path))
    assert file_shape(hpcstruct.read(str(path))) == expected
    assert file_shape(hpcstruct.read(data)) == expected
    assert file_shape(hpcstruct.read(memoryview(data))) == expected
    with path.open("rb") as stream:
        assert file_shape(hpcstruct.read(stream)) == expected


def test_write_to_path_and_stream(reference: Path, tmp_path: Path) -> None:
    structure = hpcstruct.read(reference / SMALL)
    out = tmp_path / "copy.hpcstruct"
    hpcstruct.write(structure, out)
    assert out.read_bytes() == (reference / SMALL).read_bytes()
    stream = io.BytesIO()
    hpcstruct.write(structure, stream)
    assert stream.getvalue() == (reference / SMALL).read_bytes()


def test_empty_procedure_keeps_its_closing_tag(reference: Path) -> None:
    # libc's malloc_get_state has no children and hpcstruct still writes <P ...> then </P>.
    structure = hpcstruct.read(reference / LIBC)
    empty = [s for s in structure.modules[0].walk() if s.tag == "P" and not s.children]
    assert [s.attrs["ln"] for s in empty] == ["malloc_get_state"]
    text = hpcstruct.to_bytes(structure).decode()
    line = text[text.index('ln="malloc_get_state"') :].split("\n")
    assert line[0].endswith('}">') and line[1] == "</P>"


# ------------------------------------------------------------------------------------------
# property: read(write(x)) == x

_XML_CHAR = st.characters(codec="utf-8").filter(
    lambda c: c in "\t\n\r" or (c >= " " and c not in "\ufffe\uffff")
)
_ATTR_TEXT = st.text(st.one_of(st.sampled_from("<>&\"' \t\n\r;#x"), _XML_CHAR), max_size=12)
_RANGES = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=3).map(
    lambda pairs: "{" + " ".join(f"[{lo:#x}-{hi:#x})" for lo, hi in pairs) + "}"
)

# What the reader reads as numbers (it refuses anything else): addresses, lines, call targets.
_NUMBERS = {
    "v": _RANGES,
    "l": st.integers(0, 2**32 - 1).map(str),
    "t": st.integers(0, 2**64 - 1).map(hex),
}


def _attrs(tag: str) -> st.SearchStrategy[dict[str, str]]:
    names = ATTRIBUTE_ORDER[tag]

    def values(order: list[str]) -> st.SearchStrategy[dict[str, str]]:
        return st.tuples(*[_NUMBERS.get(n, _ATTR_TEXT) for n in order]).map(
            lambda vals: dict(zip(order, vals, strict=True))
        )

    return (
        st.permutations(names)
        .flatmap(lambda perm: st.integers(0, len(perm)).map(lambda k: list(perm[:k])))
        .flatmap(values)
    )


def _scopes(tag: str, depth: int) -> st.SearchStrategy[Scope]:
    allowed = sorted(ALLOWED_CHILDREN[tag])
    if depth == 0 or not allowed:
        children: st.SearchStrategy[list[Scope]] = st.just([])
    else:
        children = st.lists(
            st.sampled_from(allowed).flatmap(lambda t: _scopes(t, depth - 1)), max_size=3
        )
    return st.builds(lambda a, c: Scope(tag, a, c), _attrs(tag), children)


_STRUCTURES = st.builds(
    lambda modules, minor, n, doctype: StructureFile(
        modules=modules,
        version=f"4.{minor}",
        root_attrs={"i": "0", "version": f"4.{minor}", "n": n},
        doctype=doctype,
    ),
    st.lists(_scopes("LM", 3), max_size=2),
    st.integers(0, 9),
    _ATTR_TEXT,
    st.sampled_from([DTD_4_9, DTD_4_9_SPDX]),
)


@settings(max_examples=60, deadline=None)
@given(_STRUCTURES)
def test_read_write_round_trip_on_random_trees(structure: StructureFile) -> None:
    data = hpcstruct.to_bytes(structure)
    again = hpcstruct.read(data)
    assert file_shape(again) == file_shape(structure)
    assert again == structure
    assert hpcstruct.to_bytes(again) == data


@settings(max_examples=15, deadline=None)
@given(_STRUCTURES)
def test_renumber_gives_unique_ids_in_document_order(structure: StructureFile) -> None:
    hpcstruct.renumber(structure)
    ids = [int(s.attrs["i"]) for m in structure.modules for s in m.walk()]
    assert ids == list(range(2, 2 + len(ids)))
    assert structure.root_attrs["i"] == "0"
    assert all(next(iter(s.attrs)) == "i" for m in structure.modules for s in m.walk())


def test_writer_escapes_like_hpcstruct() -> None:
    structure = StructureFile(
        modules=[Scope("LM", {"i": "2", "n": "a<b>&\"c'\td", "has-calls": "0", "v": "{}"})]
    )
    text = hpcstruct.to_bytes(structure).decode()
    assert '<LM i="2" n="a&lt;b&gt;&amp;&quot;c\'&#9;d" has-calls="0" v="{}">\n</LM>\n' in text


def test_writer_refuses_characters_xml_cannot_hold() -> None:
    structure = StructureFile(modules=[Scope("LM", {"i": "2", "n": "bad\x01name"})])
    with pytest.raises(FormatError, match=r"<LM n>: character U\+0001"):
        hpcstruct.to_bytes(structure)


# ------------------------------------------------------------------------------------------
# bad input


def test_malformed_xml_names_the_line() -> None:
    data = minimal('<LM i="2" n="x" has-calls="0">\n<F i="3" n="y">\n</LM>\n')
    with pytest.raises(FormatError, match=r"<buffer>: line 5, column \d+: malformed XML"):
        hpcstruct.read(data)


def test_error_message_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.hpcstruct"
    path.write_bytes(minimal('<LM i="2" n="x" has-calls="0">\n<Q i="3"/>\n</LM>\n'))
    with pytest.raises(FormatError) as caught:
        hpcstruct.read(path)
    assert str(caught.value) == f"{path}: line 4: <Q>: unknown element <Q>"


def test_wrong_root_element() -> None:
    with pytest.raises(FormatError, match=r"line 2: <HPCToolkitExperiment>: wrong root element"):
        hpcstruct.read(minimal("", root="HPCToolkitExperiment"))


def test_unknown_element_inside_a_procedure() -> None:
    body = '<LM i="2" n="x" has-calls="0">\n<P i="3" n="f">\n<X/>\n</P>\n</LM>\n'
    with pytest.raises(FormatError, match=r"line 5: <X>: unknown element"):
        hpcstruct.read(minimal(body))


@pytest.mark.parametrize(
    "ranges",
    ["{[0x10-0x20]}", "{[16-32)}", "[0x10-0x20)", "{[0x10-0x20)[0x30-0x40)}", "{ }", "{[0xg-0x1)}"],
)
def test_bad_address_set_syntax(ranges: str) -> None:
    body = f'<LM i="2" n="x" has-calls="0">\n<S i="3" l="1" v="{ranges}"/>\n</LM>\n'
    with pytest.raises(FormatError, match=r"line 4: <S>: bad address set"):
        hpcstruct.read(minimal(body))


@pytest.mark.parametrize("version", ["5.0", "3.9", "4", "four"])
def test_unsupported_or_bad_version_is_an_error(version: str) -> None:
    with pytest.raises(FormatError, match=r"line 2: <HPCToolkitStructure>: .*version"):
        hpcstruct.read(minimal("", version=version))


def test_newer_minor_version_warns_and_reads() -> None:
    with pytest.warns(FormatWarning, match=r"version 4\.10 is newer than 4\.9"):
        structure = hpcstruct.read(minimal('<LM i="2" n="x" has-calls="0">\n</LM>\n', "4.10"))
    assert structure.version == "4.10"
    assert [m.name for m in structure.modules] == ["x"]


def test_older_minor_version_reads_silently() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hpcstruct.read(minimal("", version="4.0")).version == "4.0"


def test_text_between_elements_is_an_error() -> None:
    with pytest.raises(FormatError, match=r"line 3: unexpected text 'hello'"):
        hpcstruct.read(minimal("hello\n"))


def test_entity_declarations_are_refused() -> None:
    data = (
        b'<?xml version="1.0"?>\n<!DOCTYPE HPCToolkitStructure [\n<!ENTITY a "aaaa">\n]>\n'
        b'<HPCToolkitStructure i="0" version="4.9" n="&a;">\n</HPCToolkitStructure>\n'
    )
    with pytest.raises(FormatError, match=r"entity declaration 'a'"):
        hpcstruct.read(data)


@pytest.mark.parametrize(
    "name",
    ["struct/recursion-x86_64-gcc8-r.hpcstruct", "struct/inlines+loops-sm_75-nvcc112-r.hpcstruct"],
)
def test_truncated_files_always_raise_format_error(reference: Path, name: str) -> None:
    data = (reference / name).read_bytes()
    # Every prefix that stops before the root's closing tag ends is incomplete; only dropping the
    # final newline leaves a complete document.
    offsets = sorted(set(range(0, len(data) - 1, 5)) | set(range(len(data) - 40, len(data) - 1)))
    for offset in offsets:
        with pytest.raises(FormatError):
            hpcstruct.read(data[:offset])
    assert hpcstruct.to_bytes(hpcstruct.read(data[:-1])) == data


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from([SMALL, RECURSION_GPUCFG]),
)
def test_corrupted_bytes_raise_only_format_errors(
    reference: Path, edits: list[tuple[int, int]], name: str
) -> None:
    data = bytearray((reference / name).read_bytes())
    for position, value in edits:
        data[position % len(data)] = value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FormatWarning)
        try:
            structure = hpcstruct.read(bytes(data))
        except FormatError:
            return
    hpcstruct.verify(structure)  # must not raise either


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"absent\.hpcstruct: file: "):
        hpcstruct.read(tmp_path / "absent.hpcstruct")


def test_format_registry_detects_and_reads_structure_files(reference: Path) -> None:
    from pyhpctk import formats

    assert formats.detect_file(reference / SMALL) == "hpcstruct"
    structure = formats.read(reference / SMALL)
    assert isinstance(structure, StructureFile)
    assert formats.format_of(structure) == "hpcstruct"


def test_empty_input_is_a_format_error() -> None:
    with pytest.raises(FormatError, match="no element found"):
        hpcstruct.read(b"")


# ------------------------------------------------------------------------------------------
# verify


def _scope(tag: str, children: list[Scope] | None = None, **attrs: str) -> Scope:
    return Scope(tag, dict(attrs), children or [])


def test_verify_reports_nesting_ranges_ids_and_attributes() -> None:
    structure = StructureFile(
        modules=[
            _scope(
                "LM",
                [
                    _scope("S", i="3", l="1", v="{}"),  # S directly in LM: not allowed
                    _scope(
                        "F",
                        [
                            _scope(
                                "P",
                                [
                                    _scope("S", i="6", l="x", v="{[0x20-0x10)}"),
                                    _scope("F", i="7", n="g"),  # F in P: not allowed
                                    _scope("C", i="8", l="1", v="{[0x1-0x3) [0x2-0x4)}", t="99"),
                                ],
                                i="5",
                                n="f",
                            ),
                            _scope("L", i="5", v="{}"),  # duplicate id, missing l
                        ],
                        i="4",
                        n="a.c",
                    ),
                ],
                i="2",
                n="lm",
                **{"has-calls": "0"},
            )
        ]
    )
    problems = hpcstruct.verify(structure)
    assert problems == [
        "<S i=3>: not allowed inside <LM>",
        "<S i=6>: line 'x' is not a non-negative integer",
        "<S i=6>: empty or reversed range [0x20-0x10)",
        "<F i=7>: not allowed inside <P>",
        "<C i=8>: call target '99' is not a 0x hex address",
        "<C i=8>: ranges not sorted and disjoint in '{[0x1-0x3) [0x2-0x4)}'",
        "<L i=5>: missing attribute l",
        "<L i=5>: id 5 already used by <P i=5>",
    ]


def test_verify_is_clean_for_a_renumbered_built_tree() -> None:
    structure = StructureFile(
        modules=[
            _scope(
                "LM",
                [_scope("F", [_scope("P", [_scope("S", l="3", v="{[0x3-0x4)}")], n="f")], n="a")],
                n="lm",
                **{"has-calls": "0", "v": "{}"},
            )
        ]
    )
    assert any("missing attribute i" in p for p in hpcstruct.verify(structure))
    hpcstruct.renumber(structure)
    assert hpcstruct.verify(structure) == []


def test_verify_reports_a_bad_version() -> None:
    assert hpcstruct.verify(StructureFile(version="5.1", root_attrs={"i": "0"})) == [
        "<HPCToolkitStructure>: unsupported version '5.1'"
    ]


# ------------------------------------------------------------------------------------------
# dump


def test_dump_is_an_indented_tree_with_every_attribute(reference: Path) -> None:
    out = io.StringIO()
    hpcstruct.dump(hpcstruct.read(reference / SMALL), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == 'HPCToolkitStructure version="4.9" n=""'
    assert lines[1].startswith('LM "/builds/') and lines[1].endswith('{} has-calls="0"')
    assert lines[2] == '  F "/builds/hpctoolkit/hpctoolkit/tests/data/meas/small.c"'
    assert lines[3] == '    P "spinsleep" [1] {[0x1129-0x112a)}'
    assert lines[4] == "      S [1] {[0x1129-0x1131)}"
    assert lines[8] == (
        "      L [/builds/hpctoolkit/hpctoolkit/tests/data/meas/small.c:3] {[0x1169-0x116a)}"
    )
    assert lines[9] == "        S [3] {[0x1147-0x1172)}"
    # one line per scope, plus the header
    structure = hpcstruct.read(reference / SMALL)
    assert len(lines) == 1 + sum(1 for m in structure.modules for _ in m.walk())


def test_dump_shows_call_attributes_and_optional_ids(reference: Path) -> None:
    out = io.StringIO()
    hpcstruct.dump(hpcstruct.read(reference / RECURSION_GPUCFG), out, ids=True)
    assert '    C [32] {[0x13520-0x13530)} t="0x14000" d="NVIDIA sm_75" #9\n' in out.getvalue()


def test_dumps_differ_when_files_differ(reference: Path) -> None:
    def dumped(structure: StructureFile) -> str:
        out = io.StringIO()
        hpcstruct.dump(structure, out)
        return out.getvalue()

    structure = hpcstruct.read(reference / GCC10_D)
    before = dumped(structure)
    alien = next(s for s in structure.modules[0].walk() if s.tag == "A" and s.name)
    alien.attrs["l"] = "10"
    assert dumped(structure) != before


# ------------------------------------------------------------------------------------------
# AddressMap


def _tags(path: tuple[Scope, ...]) -> list[str]:
    return [scope.tag for scope in path]


def test_address_map_hand_checked_addresses(reference: Path) -> None:
    structure = hpcstruct.read(reference / GCC10_D)
    amap = AddressMap(structure.modules[0])
    # Hand-read from the XML:
    #   0x1105: <P f1 l=13> <S i=5 l=13 v={[0x1105-0x1109)}>
    #   0x1125: <P f2> <A l=19 n=""> <A l=9 n=f_inlined> <S i=13 l=9 v={[0x1123-0x1134)}>
    #   0x1155: <P f3_1> <L i=18 l=24 v={[0x1155-0x1156)}> <S i=19 l=24 v={[0x1152-0x1162)}>
    #   0x1141: <P f3_1> <L i=18> <S i=20 l=25 v={[0x1141-0x1152)}>
    #   0x1000: <F [inlines+loops-x86_64-gcc10-d]> <P _init> <S i=73 v={[0x1000-0x1017)}>
    #   0xfff: before any function
    addresses = np.array([0xFFF, 0x1105, 0x1125, 0x1141, 0x1155], dtype=np.uint64)
    paths = amap.paths(addresses)
    assert paths[0] == ()
    assert _tags(paths[1]) == ["LM", "F", "P", "S"] and paths[1][-1].attrs["i"] == "5"
    assert _tags(paths[2]) == ["LM", "F", "P", "A", "A", "S"]
    assert [paths[2][3].line, paths[2][4].name, paths[2][5].attrs["i"]] == [19, "f_inlined", "13"]
    assert _tags(paths[3]) == ["LM", "F", "P", "L", "S"] and paths[3][-1].attrs["i"] == "20"
    assert paths[4][-1].attrs["i"] == "19" and paths[4][2].attrs["ln"] == "f3_1"
    index = amap.lookup(addresses)
    assert index[0] == -1
    (init,) = amap.paths([0x1000])
    assert _tags(init) == ["LM", "F", "P", "S"] and init[-1].attrs["i"] == "73"
    procedure = amap.enclosing(int(index[2]), "P")
    assert procedure is not None and procedure.attrs["ln"] == "f2"
    assert amap.enclosing(int(index[1]), "L") is None


def test_address_map_gpu_call_sites(reference: Path) -> None:
    amap = AddressMap(hpcstruct.read(reference / RECURSION_GPUCFG).modules[0])
    # <C i=9 l=32 v={[0x13520-0x13530)} t=0x14000> inside <P top1 l=30>
    (path,) = amap.paths([0x1352F])
    assert _tags(path) == ["LM", "F", "P", "C"]
    assert path[-1].call_target == 0x14000 and path[-1].line == 32


def test_address_map_overlaps_prefer_the_shortest_range(reference: Path) -> None:
    amap = AddressMap(hpcstruct.read(reference / LIBC).modules[0])
    # <S i=105 v={[0x2263c-0x2272e)}> in targ2263c overlaps
    # <S i=123 v={[0x226c2-0x2271a) [0x243a0-0x243fb)}> in "<unknown procedure> 0x243a0",
    # <S i=435 v={[0x2271a-0x22729) ...}> and <S i=597 v={[0x22729-0x227bb) ...}>: each shorter
    # than i=105 where they overlap it (ranges found by grepping every S's v for the address).
    got = [
        amap.path(int(k))[-1].attrs["i"] for k in amap.lookup([0x2263C, 0x226C2, 0x2271A, 0x22729])
    ]
    assert got == ["105", "123", "435", "597"]


def test_address_map_falls_back_to_entry_and_header_markers() -> None:
    lm = _scope(
        "LM",
        [
            _scope(
                "P",
                [
                    _scope(
                        "L",
                        [_scope("S", i="5", l="2", v="{[0x20-0x30)}")],
                        i="4",
                        v="{[0x40-0x41)}",
                    ),
                    _scope("S", i="6", l="1", v="{[0x10-0x20)}"),
                ],
                i="3",
                v="{[0x8-0x9)}",
            )
        ],
        i="2",
    )
    amap = AddressMap(lm)
    ids = [
        amap.path(int(k))[-1].attrs["i"] if k >= 0 else None
        for k in amap.lookup([8, 0x25, 0x40, 0x41])
    ]
    assert ids == ["3", "5", "4", None]


def test_address_map_without_nested_procedures() -> None:
    inner = _scope("P", [_scope("S", i="5", l="3", v="{[0x3-0x4)}")], i="4", v="{[0x3-0x4)}")
    outer = _scope("P", [_scope("S", i="3", l="3", v="{[0x3-0x4)}"), inner], i="2")
    assert AddressMap(outer).path(int(AddressMap(outer).lookup([3])[0]))[-1].attrs["i"] == "5"
    flat = AddressMap(outer, nested_procedures=False)
    assert flat.path(int(flat.lookup([3])[0]))[-1].attrs["i"] == "3"


def _oracle(root: Scope, addresses: npt.NDArray[np.uint64]) -> list[str | None]:
    """Slow reference: test every range against every address; among the S/C ranges holding
    it keep the shortest, then deepest, then last; only if none, the same among the others."""
    rows: list[tuple[int, int, int, int, bool]] = []
    ids: list[str] = []
    stack = [(root, 0)]
    while stack:
        scope, level = stack.pop()
        for start, end in parse_ranges(scope.attrs.get("v", "{}")):
            rows.append((start, end, level, len(rows), scope.tag in ("S", "C")))
            ids.append(scope.attrs["i"])
        stack.extend((c, level + 1) for c in reversed(scope.children))
    lo, hi, depth, order, leaf = (np.array([r[k] for r in rows]) for k in range(5))
    answers: list[str | None] = []
    for address in addresses.tolist():
        answer = None
        for wanted in (True, False):
            hits = np.flatnonzero((lo <= address) & (address < hi) & (leaf == wanted))
            if hits.size:
                keys = [(-(hi[k] - lo[k]), depth[k], order[k]) for k in hits.tolist()]
                answer = ids[int(hits[keys.index(max(keys))])]
                break
        answers.append(answer)
    return answers


def test_address_map_matches_a_brute_force_oracle_on_libc(reference: Path) -> None:
    module = hpcstruct.read(reference / LIBC).modules[0]
    amap = AddressMap(module)
    starts = [lo for s in module.walk() for lo, _ in s.ranges]
    rng = np.random.default_rng(7)
    near = rng.choice(np.asarray(starts, dtype=np.int64), 200) + rng.integers(-3, 40, 200)
    picks = np.concatenate([near, [0, 2**40]]).astype(np.uint64)
    got = [amap.path(int(k))[-1].attrs["i"] if k >= 0 else None for k in amap.lookup(picks)]
    assert got == _oracle(module, picks)
    assert None in got and len(set(got)) > 20


def test_address_map_is_fast_on_libc(reference: Path) -> None:
    module = hpcstruct.read(reference / LIBC).modules[0]
    amap = AddressMap(module)
    addresses = np.sort(np.random.default_rng(1).integers(0, 0x200000, 200_000)).astype(np.uint64)
    result = amap.lookup(addresses)
    assert result.shape == addresses.shape and result.dtype == np.int64
    assert 0 < int((result >= 0).sum()) < result.size


def test_address_map_refuses_negative_addresses(reference: Path) -> None:
    amap = AddressMap(hpcstruct.read(reference / SMALL).modules[0])
    with pytest.raises(ValueError, match="non-negative"):
        amap.lookup(np.array([-1]))


def test_address_map_refuses_malformed_address_sets() -> None:
    with pytest.raises(ValueError, match=r"bad address set '\{\[0x1\)\}'"):
        AddressMap(_scope("P", [_scope("S", i="3", l="1", v="{[0x1)}")], i="2"))

"""Reader and writer of hpcstruct XML structure files (DTD 4.9, formats.md §4).

pystruct writes these files and pyprof reads them to turn (load module, offset) pairs into
procedure, inlined-call, loop and line contexts. This module owns the bytes: parsing (streaming,
through expat, so a 100 MB file costs one pass and no DOM), writing exactly what HPCToolkit's
``hpcstruct`` writes (``write(read(f)) == f`` for every reference file), checking, dumping as
indented text, and the :class:`AddressMap` that answers "which scopes contain this address" for
whole arrays of addresses at once. It must never guess: a malformed file raises
:class:`~pyhpctk.errors.FormatError` naming the file, the line and the problem.

Writer conventions taken from the reference files (``struct/``, ``meas/*.m/structs/``) [V]:

- ``<?xml version="1.0"?>``, the inline DTD, then
  ``<HPCToolkitStructure i="0" version="4.9" n="">``;
- one element per line, no indentation; ``S`` and ``C`` without children are written
  ``<S .../>``, every other element as an opening and a closing tag even when empty (libc's
  ``malloc_get_state`` is an empty ``<P ...>`` / ``</P>`` pair);
- attribute values escaped like HPCToolkit's ``xml::EscapeStr``: ``< > & "`` become
  ``&lt; &gt; &amp; &quot;``. hpcstruct writes tab, newline and carriage return raw, which an XML
  parser would turn into spaces, so this writer writes them as ``&#9; &#10; &#13;`` instead;
  characters XML 1.0 cannot carry at all are refused.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import pyexpat
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import BinaryIO, TextIO

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats.hpcstruct_addresses import ADDRESS, ADDRESS_SET, AddressMap
from pyhpctk.formats.hpcstruct_model import (
    ALIEN,
    CALL,
    FILE,
    LOAD_MODULE,
    LOOP,
    PROCEDURE,
    SCOPE_TAGS,
    STATEMENT,
    Scope,
    StructureFile,
    parse_ranges,
)
from pyhpctk.formats.whole import open_regular

__all__ = [
    "ALLOWED_CHILDREN",
    "ATTRIBUTE_ORDER",
    "DTD_4_9",
    "DTD_4_9_SPDX",
    "REQUIRED_ATTRIBUTES",
    "ROOT_TAG",
    "AddressMap",
    "dump",
    "read",
    "renumber",
    "sniff",
    "to_bytes",
    "verify",
    "write",
]

ROOT_TAG = "HPCToolkitStructure"
XML_DECLARATION = '<?xml version="1.0"?>'
#: The DTD version this module implements; a newer minor version only warns (formats.md §4).
SUPPORTED_MAJOR, SUPPORTED_MINOR = 4, 9

# The inline DTD exactly as hpcstruct writes it [V]. Two texts occur in the reference data: the
# measurement directories' structs (``meas/*.m/structs/``) carry this one, which the writer uses
# when a StructureFile has no ``doctype`` of its own ...
DTD_4_9 = """\
<!DOCTYPE HPCToolkitStructure [
<!-- ******************************************************************** -->
<!-- HPCToolkit Structure DTD                                             -->
<!-- Version 4.9                                                          -->
<!-- ******************************************************************** -->

<!ELEMENT HPCToolkitStructure (LM)*>
<!ATTLIST HPCToolkitStructure
        version CDATA #REQUIRED
        i       CDATA #REQUIRED
        n       CDATA #IMPLIED>
  <!-- Load module: -->
  <!--   (i)d: unique identifier for cross referencing -->
  <!--   (n)ame -->
  <!--   (l)ine range: "beg-end" (inclusive range) -->
  <!--   (v)ma-range-set: "{[beg-end), [beg-end)...}" -->
  <!--   (t)arget: target function address -->
  <!--   (d)evice: device name -->
  <!ELEMENT LM (F|P)*>
  <!ATTLIST LM
        i CDATA #REQUIRED
        n CDATA #REQUIRED
        has-calls CDATA #REQUIRED
        v CDATA #IMPLIED>
  <!-- File: -->
  <!ELEMENT F (P|L|S)*>
  <!ATTLIST F
        i CDATA #REQUIRED
        n CDATA #REQUIRED>
  <!-- Procedure: ln=link name (if different than name) -->
  <!ELEMENT P (P|A|L|S|C)*>
  <!ATTLIST P
        i  CDATA #REQUIRED
        n  CDATA #REQUIRED
        ln CDATA #IMPLIED
        l  CDATA #IMPLIED
        s  CDATA #IMPLIED
        v  CDATA #IMPLIED>
  <!-- Alien: (f)ilename -->
  <!ELEMENT A (A|L|S|C)*>
  <!ATTLIST A
        i CDATA #REQUIRED
        f CDATA #IMPLIED
        n CDATA #IMPLIED
        ln CDATA #IMPLIED
        l CDATA #IMPLIED
        v CDATA #IMPLIED>
  <!-- Loop -->
  <!ELEMENT L (A|L|S|C)*>
  <!ATTLIST L
        i CDATA #REQUIRED
        l CDATA #REQUIRED
        f CDATA #IMPLIED
        v CDATA #IMPLIED>
  <!-- Statement -->
  <!ELEMENT S EMPTY>
  <!ATTLIST S
        i CDATA #REQUIRED
        l CDATA #REQUIRED
        v CDATA #IMPLIED>
  <!-- Callsite (a special Statement) -->
  <!ELEMENT C (C)*>
  <!ATTLIST C
        i CDATA #REQUIRED
        l CDATA #REQUIRED
        v CDATA #IMPLIED
        t CDATA #IMPLIED
        d CDATA #IMPLIED>
]>"""

# ... and the ``struct/`` GPU files carry the same DTD behind an SPDX licence comment.
_SPDX_COMMENT = """\
<!--
SPDX-FileCopyrightText: 2003-2024 Rice University
SPDX-FileCopyrightText: 2024 Contributors to the HPCToolkit Project

SPDX-License-Identifier: CC-BY-4.0
-->

"""
DTD_4_9_SPDX = DTD_4_9.replace("[\n", "[\n" + _SPDX_COMMENT, 1)

#: Which elements each element may contain, from the DTD's ``<!ELEMENT>`` declarations.
ALLOWED_CHILDREN: Mapping[str, frozenset[str]] = {
    ROOT_TAG: frozenset({LOAD_MODULE}),
    LOAD_MODULE: frozenset({FILE, PROCEDURE}),
    FILE: frozenset({PROCEDURE, LOOP, STATEMENT}),
    PROCEDURE: frozenset({PROCEDURE, ALIEN, LOOP, STATEMENT, CALL}),
    ALIEN: frozenset({ALIEN, LOOP, STATEMENT, CALL}),
    LOOP: frozenset({ALIEN, LOOP, STATEMENT, CALL}),
    STATEMENT: frozenset(),
    CALL: frozenset({CALL}),
}

#: ``#REQUIRED`` attributes of each element, from the DTD's ``<!ATTLIST>`` declarations.
REQUIRED_ATTRIBUTES: Mapping[str, tuple[str, ...]] = {
    ROOT_TAG: ("version", "i"),
    LOAD_MODULE: ("i", "n", "has-calls"),
    FILE: ("i", "n"),
    PROCEDURE: ("i", "n"),
    ALIEN: ("i",),
    LOOP: ("i", "l"),
    STATEMENT: ("i", "l"),
    CALL: ("i", "l"),
}

#: The order in which hpcstruct writes each element's attributes [V]; builders of new trees
#: (pystruct) should create their attribute dicts in this order, optional ones omitted.
ATTRIBUTE_ORDER: Mapping[str, tuple[str, ...]] = {
    ROOT_TAG: ("i", "version", "n"),
    LOAD_MODULE: ("i", "n", "has-calls", "v"),
    FILE: ("i", "n"),
    PROCEDURE: ("i", "n", "ln", "s", "l", "v"),
    ALIEN: ("i", "l", "f", "n", "v"),
    LOOP: ("i", "l", "f", "v"),
    STATEMENT: ("i", "l", "v"),
    CALL: ("i", "l", "v", "t", "d"),
}

# Elements hpcstruct writes as ``<X .../>`` when they have no children; all others get a
# closing tag even when empty [V].
_SELF_CLOSING = frozenset({STATEMENT, CALL})

# formats.md §4.2, the address-set grammar (.hpcstruct_addresses).
_ADDRESS = ADDRESS
_ADDRESS_SET = ADDRESS_SET
_VERSION = re.compile(r"(\d+)\.(\d+)")
_DECIMAL = re.compile(r"\d+")
_HEX = re.compile(_ADDRESS)
# A line number as meta.db holds it (u32, formats.md §3.2).
_LINE = re.compile(r"0*\d{1,10}")
_LINE_MAX = 0xFFFFFFFF

_CHUNK = 1 << 20  # bytes fed to expat at a time

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO
Destination = str | os.PathLike[str] | BinaryIO


# --------------------------------------------------------------------------------------------
# sniff


def sniff(head: bytes) -> bool:
    """True when ``head`` (the first bytes of a file, up to 64) starts an hpcstruct file."""
    text = bytes(head[:64])
    if text.startswith(b"\xef\xbb\xbf"):
        text = text[3:]
    text = text.lstrip()
    if text.startswith(b"<?xml"):
        end = text.find(b"?>")
        if end < 0:
            return False
        text = text[end + 2 :].lstrip()
    for opening in (b"<!DOCTYPE " + ROOT_TAG.encode(), b"<" + ROOT_TAG.encode()):
        common = min(len(text), len(opening))
        if common >= 5 and text[:common] == opening[:common]:
            return True
    return False


# --------------------------------------------------------------------------------------------
# read


def _source_name(source: Source) -> str | None:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    if isinstance(source, bytes | bytearray | memoryview):
        return None
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else None


def _chunks(source: Source) -> Iterator[bytes | memoryview]:
    if isinstance(source, str | os.PathLike):
        with open_regular(source) as stream:
            while chunk := stream.read(_CHUNK):
                yield chunk
    elif isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source).cast("B")
        for start in range(0, len(view), _CHUNK):
            yield view[start : start + _CHUNK]
    else:
        while chunk := source.read(_CHUNK):
            yield chunk


class _Reader:
    """Expat callbacks building the Scope tree; one instance per file."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.parser = pyexpat.ParserCreate()
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.CharacterDataHandler = self._text
        self.parser.EntityDeclHandler = self._entity
        self.parser.XmlDeclHandler = self._xml_declaration
        self.encoding = "utf-8"
        self.stack: list[Scope] = []
        self.modules: list[Scope] = []
        self.root_attrs: dict[str, str] | None = None
        self.prolog = bytearray()  # everything fed before the root element started
        self.doctype = ""

    def error(self, problem: str, tag: str | None = None) -> FormatError:
        section = f"line {self.parser.CurrentLineNumber}"
        if tag is not None:
            section += f": <{tag}>"
        return FormatError(self.path, section, problem)

    def feed(self, chunk: bytes | memoryview, final: bool) -> None:
        if self.root_attrs is None:
            self.prolog += chunk
        try:
            self.parser.Parse(chunk, final)
        except pyexpat.ExpatError as exc:
            problem = f"malformed XML: {pyexpat.ErrorString(exc.code)}"
            if final:
                problem += " (truncated file?)"
            raise FormatError(
                self.path, f"line {exc.lineno}, column {exc.offset + 1}", problem
            ) from None

    def _xml_declaration(self, version: str, encoding: str | None, standalone: int) -> None:
        if encoding:
            self.encoding = encoding

    def _entity(self, name: str, *_: object) -> None:
        raise self.error(f"entity declaration {name!r}: hpcstruct files declare no entities")

    def _text(self, data: str) -> None:
        if data.strip():
            text = data.strip()
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise self.error(f"unexpected text {shown!r} between elements")

    def _start(self, tag: str, attrs: dict[str, str]) -> None:
        if self.root_attrs is None:
            self._start_root(tag, attrs)
            return
        if tag not in SCOPE_TAGS:
            raise self.error(f"unknown element <{tag}>", tag)
        ranges = attrs.get("v")
        if ranges is not None and _ADDRESS_SET.fullmatch(ranges) is None:
            raise self.error(
                f"bad address set v={_clip(ranges)!r} (expected {{[0xLO-0xHI) ...}} of 64-bit "
                "addresses)",
                tag,
            )
        # Tools read these as numbers (Scope.line, Scope.call_target): refuse what is none.
        line = attrs.get("l")
        if line is not None and (_LINE.fullmatch(line) is None or int(line) > _LINE_MAX):
            raise self.error(f"line l={_clip(line)!r} is not a line number (0 to 2^32-1)", tag)
        target = attrs.get("t")
        if target is not None and _HEX.fullmatch(target) is None:
            raise self.error(f"call target t={_clip(target)!r} is not a 64-bit 0x address", tag)
        scope = Scope(tag, attrs, [])
        if self.stack:
            self.stack[-1].children.append(scope)
        else:
            self.modules.append(scope)
        self.stack.append(scope)

    def _start_root(self, tag: str, attrs: dict[str, str]) -> None:
        if tag != ROOT_TAG:
            raise self.error(f"wrong root element <{tag}>, expected <{ROOT_TAG}>", tag)
        self._check_version(attrs.get("version"))
        self.root_attrs = attrs
        # The DOCTYPE text (and anything else between the XML declaration and the root
        # element) is kept verbatim so that writing reproduces it.
        prolog = bytes(self.prolog[: self.parser.CurrentByteIndex])
        self.prolog = bytearray()
        if prolog.startswith(b"\xef\xbb\xbf"):
            prolog = prolog[3:]
        if prolog.lstrip().startswith(b"<?xml"):
            prolog = prolog[prolog.index(b"?>") + 2 :]
        try:
            self.doctype = prolog.decode(self.encoding).strip()
        except (LookupError, UnicodeDecodeError) as exc:
            raise self.error(f"cannot decode the DOCTYPE: {exc}", tag) from None

    def _check_version(self, version: str | None) -> None:
        if version is None:
            raise self.error("missing version attribute", ROOT_TAG)
        match = _VERSION.fullmatch(version)
        if match is None:
            raise self.error(f"bad version {version!r} (expected MAJOR.MINOR)", ROOT_TAG)
        major, minor = int(match[1]), int(match[2])
        if major != SUPPORTED_MAJOR:
            raise self.error(
                f"unsupported version {version} (this reader knows "
                f"{SUPPORTED_MAJOR}.{SUPPORTED_MINOR})",
                ROOT_TAG,
            )
        if minor > SUPPORTED_MINOR:
            warnings.warn(
                f"{self.path or '<buffer>'}: line {self.parser.CurrentLineNumber}: "
                f"version {version} is newer than {SUPPORTED_MAJOR}.{SUPPORTED_MINOR}; "
                "reading it as 4.9",
                FormatWarning,
                stacklevel=6,  # the caller of read()
            )

    def _end(self, tag: str) -> None:
        if self.stack:
            self.stack.pop()


def _clip(text: str) -> str:
    """An attribute value short enough for a one-line message."""
    return text if len(text) <= 60 else text[:57] + "..."


def read(source: Source) -> StructureFile:
    """Parse an hpcstruct file (path, bytes or binary stream) into a :class:`StructureFile`.

    Parsing streams through expat in 1 MiB chunks; attribute order and the DOCTYPE text are kept.
    Raises :class:`FormatError` (with the line number) for malformed or truncated XML, a wrong
    root element, an unknown element, a bad ``v`` address set (or an address past 64 bits), a
    line ``l`` or call target ``t`` that is not a number, or a major version other than 4;
    warns with :class:`FormatWarning` for a newer minor version.
    """
    reader = _Reader(_source_name(source))
    try:
        for chunk in _chunks(source):
            reader.feed(chunk, final=False)
    except OSError as error:
        raise FormatError(reader.path, "file", error.strerror or str(error)) from None
    reader.feed(b"", final=True)
    if reader.root_attrs is None:  # pragma: no cover - expat reports "no element found" first
        raise FormatError(reader.path, "document", f"no <{ROOT_TAG}> element")
    root_attrs = reader.root_attrs
    return StructureFile(
        modules=reader.modules,
        version=root_attrs.get("version", ""),
        root_attrs=root_attrs,
        doctype=reader.doctype,
    )


# --------------------------------------------------------------------------------------------
# write

_ESCAPES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        '"': "&quot;",
        "\t": "&#9;",
        "\n": "&#10;",
        "\r": "&#13;",
    }
)
_NEEDS_ESCAPE = re.compile('[&<>"\t\n\r\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]')
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _attributes(attrs: Mapping[str, str], path: str | None, tag: str) -> str:
    parts = []
    for key, value in attrs.items():
        if _NEEDS_ESCAPE.search(value) is not None:
            bad = _NOT_XML.search(value)
            if bad is not None:
                code = ord(bad.group())
                problem = f"character U+{code:04X} cannot be written in XML 1.0"
                if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
                    problem = (
                        f"{value!r} holds the byte 0x{code - 0xDC00:02X}, which is not UTF-8: "
                        "XML cannot carry it (rename the file or its directory to UTF-8)"
                    )
                raise FormatError(path, f"<{tag} {key}>", problem)
            value = value.translate(_ESCAPES)
        parts.append(f' {key}="{value}"')
    return "".join(parts)


def _lines(obj: StructureFile, path: str | None) -> Iterator[str]:
    """The file's text, as pieces of at most one element line each."""
    yield XML_DECLARATION + "\n"
    yield (obj.doctype or DTD_4_9) + "\n"
    root_attrs = dict(obj.root_attrs)
    root_attrs["version"] = obj.version
    yield f"<{ROOT_TAG}{_attributes(root_attrs, path, ROOT_TAG)}>\n"
    stack: list[tuple[Scope, bool]] = [(scope, False) for scope in reversed(obj.modules)]
    while stack:
        scope, closing = stack.pop()
        tag = scope.tag
        if closing:
            yield f"</{tag}>\n"
        elif not scope.children and tag in _SELF_CLOSING:
            yield f"<{tag}{_attributes(scope.attrs, path, tag)}/>\n"
        else:
            yield f"<{tag}{_attributes(scope.attrs, path, tag)}>\n"
            stack.append((scope, True))
            stack.extend((child, False) for child in reversed(scope.children))
    yield f"</{ROOT_TAG}>\n"


def _write_stream(obj: StructureFile, stream: BinaryIO, path: str | None) -> None:
    pending: list[str] = []
    for line in _lines(obj, path):
        pending.append(line)
        if len(pending) >= 16384:
            stream.write("".join(pending).encode("utf-8"))
            pending.clear()
    stream.write("".join(pending).encode("utf-8"))


def to_bytes(obj: StructureFile) -> bytes:
    """The file hpcstruct would write for ``obj``."""
    buffer = io.BytesIO()
    _write_stream(obj, buffer, None)
    return buffer.getvalue()


def write(obj: StructureFile, dest: Destination) -> None:
    """Write ``obj`` to a path or binary stream exactly as hpcstruct writes it."""
    if isinstance(dest, str | os.PathLike):
        # Render first so that an unwritable attribute leaves no half-written file behind.
        data = to_bytes(obj)
        with open(dest, "wb") as stream:
            stream.write(data)
    else:
        _write_stream(obj, dest, _source_name(dest))


def renumber(structure: StructureFile) -> None:
    """Assign ``i`` ids in output order as hpcstruct does, in place.

    The root gets ``i="0"``, the first ``LM`` ``i="2"`` (hpcstruct never uses 1) and every
    following element the next integer in document order. ``i`` becomes each element's first
    attribute, where hpcstruct writes it, so trees built without ids come out canonical.
    """
    structure.root_attrs = {"i": "0", **{k: v for k, v in structure.root_attrs.items() if k != "i"}}
    next_id = 2
    stack = list(reversed(structure.modules))
    while stack:
        scope = stack.pop()
        attrs = scope.attrs
        rest = {k: v for k, v in attrs.items() if k != "i"}
        attrs.clear()
        attrs["i"] = str(next_id)
        attrs.update(rest)
        next_id += 1
        stack.extend(reversed(scope.children))


# --------------------------------------------------------------------------------------------
# verify


def _label(scope: Scope) -> str:
    ident = scope.attrs.get("i")
    return f"<{scope.tag}{'' if ident is None else f' i={ident}'}>"


def _check_ranges(text: str) -> str | None:
    if _ADDRESS_SET.fullmatch(text) is None:
        return f"bad address set {text!r}"
    ranges = parse_ranges(text)
    for lo, hi in ranges:
        if lo >= hi:
            return f"empty or reversed range [{lo:#x}-{hi:#x})"
    for (_, prev_hi), (lo, _) in itertools.pairwise(ranges):
        if lo < prev_hi:
            return f"ranges not sorted and disjoint in {text!r}"
    return None


def verify(obj: StructureFile) -> list[str]:
    """Consistency problems of a structure tree; empty when it is clean.

    Checks the version, the DTD nesting (``LM > F|P``, ``F > P|L|S``, ``P > P|A|L|S|C``,
    ``A > A|L|S|C``, ``L > A|L|S|C``, ``S`` empty), required attributes, unique integer ids,
    integer lines, hex call targets and well-formed address sets (``lo < hi``, sorted, disjoint).
    """
    problems: list[str] = []
    match = _VERSION.fullmatch(obj.version)
    if match is None or int(match[1]) != SUPPORTED_MAJOR:
        problems.append(f"<{ROOT_TAG}>: unsupported version {obj.version!r}")
    seen: dict[str, str] = {}
    root_id = obj.root_attrs.get("i")
    if root_id is None:
        problems.append(f"<{ROOT_TAG}>: missing attribute i")
    else:
        seen[root_id] = f"<{ROOT_TAG}>"
    stack: list[tuple[Scope, str]] = [(scope, ROOT_TAG) for scope in reversed(obj.modules)]
    while stack:
        scope, parent = stack.pop()
        label = _label(scope)
        attrs = scope.attrs
        if scope.tag not in ALLOWED_CHILDREN[parent]:
            problems.append(f"{label}: not allowed inside <{parent}>")
        for name in REQUIRED_ATTRIBUTES[scope.tag]:
            if name not in attrs:
                problems.append(f"{label}: missing attribute {name}")
        ident = attrs.get("i")
        if ident is not None:
            if _DECIMAL.fullmatch(ident) is None:
                problems.append(f"{label}: id {ident!r} is not a non-negative integer")
            elif ident in seen:
                problems.append(f"{label}: id {ident} already used by {seen[ident]}")
            else:
                seen[ident] = label
        line = attrs.get("l")
        if line is not None and _DECIMAL.fullmatch(line) is None:
            problems.append(f"{label}: line {line!r} is not a non-negative integer")
        target = attrs.get("t")
        if target is not None and _HEX.fullmatch(target) is None:
            problems.append(f"{label}: call target {target!r} is not a 0x hex address")
        ranges = attrs.get("v")
        if ranges is not None:
            problem = _check_ranges(ranges)
            if problem is not None:
                problems.append(f"{label}: {problem}")
        stack.extend((child, scope.tag) for child in reversed(scope.children))
    return problems


# --------------------------------------------------------------------------------------------
# dump


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _describe(scope: Scope, ids: bool) -> str:
    """One dump line: tag, name, [file:line], {ranges}, then every other attribute."""
    attrs = scope.attrs
    parts = [scope.tag]
    used = {"n", "l", "f", "v", "i"}
    if "n" in attrs:
        parts.append(_quote(attrs["n"]))
    if "l" in attrs or "f" in attrs:
        where = attrs.get("l", "?")
        if "f" in attrs:
            where = f"{attrs['f']}:{where}"
        parts.append(f"[{where}]")
    if "v" in attrs:
        parts.append(attrs["v"])
    parts.extend(f"{key}={_quote(value)}" for key, value in attrs.items() if key not in used)
    if ids and "i" in attrs:
        parts.append(f"#{attrs['i']}")
    return " ".join(parts)


def dump(obj: StructureFile, out: TextIO, *, ids: bool = False) -> None:
    """Write ``obj`` as an indented tree, one scope per line, e.g. ``P "main" [12] {[0x..)}``.

    Every attribute is shown (ids only with ``ids=True``: they differ between otherwise equal
    files), so two dumps can be compared with ``diff``.
    """
    header = " ".join(
        f"{key}={_quote(value)}" for key, value in obj.root_attrs.items() if key != "i" or ids
    )
    out.write(f"{ROOT_TAG} {header}\n")
    stack: list[tuple[Scope, int]] = [(scope, 0) for scope in reversed(obj.modules)]
    while stack:
        scope, depth = stack.pop()
        out.write("  " * depth + _describe(scope, ids) + "\n")
        stack.extend((child, depth + 1) for child in reversed(scope.children))

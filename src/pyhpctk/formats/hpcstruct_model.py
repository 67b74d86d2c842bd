"""In-memory model of an hpcstruct XML file (DTD 4.9, formats.md §4).

Only data lives here; :mod:`pyhpctk.formats.hpcstruct` parses and writes it. pystruct builds these
trees, pyprof reads them. A scope keeps its attributes in the order the file had them, so a read
then a write reproduces the file; typed accessors decode the attributes tools use.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

# Element tags, formats.md §4.2.
LOAD_MODULE, FILE, PROCEDURE, ALIEN, LOOP, STATEMENT, CALL = "LM", "F", "P", "A", "L", "S", "C"
SCOPE_TAGS = frozenset({LOAD_MODULE, FILE, PROCEDURE, ALIEN, LOOP, STATEMENT, CALL})

_RANGE = re.compile(r"\[0x([0-9a-fA-F]+)-0x([0-9a-fA-F]+)\)")


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """Decode an address set ``{[0xLO-0xHI) ...}`` into half-open (lo, hi) pairs."""
    return [(int(lo, 16), int(hi, 16)) for lo, hi in _RANGE.findall(text)]


def format_ranges(ranges: list[tuple[int, int]]) -> str:
    """Encode half-open (lo, hi) pairs as hpcstruct writes them: ``{[0x10f5-0x10f9) [...)}``."""
    return "{" + " ".join(f"[{lo:#x}-{hi:#x})" for lo, hi in ranges) + "}"


@dataclass(slots=True)
class Scope:
    """One element of the structure tree (``LM``, ``F``, ``P``, ``A``, ``L``, ``S`` or ``C``)."""

    tag: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[Scope] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.tag not in SCOPE_TAGS:
            raise ValueError(f"unknown hpcstruct element {self.tag!r}")

    @property
    def name(self) -> str:
        return self.attrs.get("n", "")

    @property
    def line(self) -> int:
        return int(self.attrs.get("l", "0"))

    @property
    def file(self) -> str | None:
        return self.attrs.get("f")

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return parse_ranges(self.attrs.get("v", "{}"))

    @property
    def call_target(self) -> int | None:
        """The callee entry address of a ``C`` element, if known."""
        target = self.attrs.get("t")
        return int(target, 16) if target else None

    def walk(self) -> Iterator[Scope]:
        """This scope and every descendant, in document order."""
        stack = [self]
        while stack:
            scope = stack.pop()
            yield scope
            stack.extend(reversed(scope.children))


@dataclass(slots=True)
class StructureFile:
    """A whole hpcstruct file: its ``LM`` scopes and the header attributes.

    ``doctype`` is the inline DTD text exactly as read (the writer emits HPCToolkit's DTD 4.9 when
    it is empty), so files round-trip byte for byte.
    """

    modules: list[Scope] = field(default_factory=list)
    version: str = "4.9"
    root_attrs: dict[str, str] = field(
        default_factory=lambda: {"i": "0", "version": "4.9", "n": ""}
    )
    doctype: str = ""

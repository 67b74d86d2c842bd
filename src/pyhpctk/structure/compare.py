"""How close is one hpcstruct file to another: precision and recall per kind of fact.

The accuracy test and the table in ``docs/pystruct.md`` both use this module, so they measure the
same thing. Ids and element order never count. Four kinds of facts are compared, each as a
multiset (a fact that occurs twice must be found twice):

* **procedures**: ``(name, entry address)`` of every ``P``;
* **statements**: ``(procedure, file, line)`` of every ``S`` (the file is the one in effect: the
  enclosing ``F``, loop ``f`` or alien ``f``);
* **loops**: ``(procedure, nesting)`` where nesting is the tuple of header lines ``(file, line)``
  of the loop and every loop around it, outermost first;
* **inlined calls**: ``(procedure, call-site file, call-site line, callee name)`` of every
  call-site/callee ``A`` pair (guard aliens are not calls).

Precision is matched / ours, recall is matched / theirs; both are 1.0 when both sides are empty.

``aliases`` maps path prefixes of *our* file names to the reference's, for differences that come
from the machine rather than the analysis: hpcstruct canonicalises a source path with
``realpath`` when the file exists where it runs (``/usr/local/cuda`` -> ``/usr/local/cuda-12.5``),
which no other machine can reproduce. Callers report scores with and without aliases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from pyhpctk.formats.hpcstruct_model import (
    ALIEN,
    FILE,
    LOOP,
    PROCEDURE,
    STATEMENT,
    Scope,
    StructureFile,
)

KINDS = ("procedures", "statements", "loops", "inlines")
GUARD_NAME = "<inline>"


@dataclass(frozen=True, slots=True)
class Score:
    """Precision and recall of one kind of fact."""

    matched: int
    ours: int
    theirs: int

    @property
    def precision(self) -> float:
        return (
            1.0
            if self.ours == 0 and self.theirs == 0
            else (self.matched / self.ours if self.ours else 0.0)
        )

    @property
    def recall(self) -> float:
        return (
            1.0
            if self.ours == 0 and self.theirs == 0
            else (self.matched / self.theirs if self.theirs else 0.0)
        )


def _renamer(aliases: Mapping[str, str] | None) -> Callable[[str], str]:
    pairs = sorted((aliases or {}).items(), key=lambda kv: -len(kv[0]))

    def rename(path: str) -> str:
        for old, new in pairs:
            if path.startswith(old):
                return new + path[len(old) :]
        return path

    return rename


def facts(
    structure: StructureFile, aliases: Mapping[str, str] | None = None
) -> dict[str, Counter[Hashable]]:
    """Every fact of every kind in a structure file (file names rewritten by ``aliases``)."""
    out: dict[str, Counter[Hashable]] = {kind: Counter() for kind in KINDS}
    rename = _renamer(aliases)
    for lm in structure.modules:
        for child in lm.children:
            if child.tag == FILE:
                for proc in child.children:
                    if proc.tag == PROCEDURE:
                        _proc_facts(proc, rename(child.name), out, rename)
            elif child.tag == PROCEDURE:
                _proc_facts(child, "", out, rename)
    return out


def _proc_facts(
    proc: Scope, file: str, out: dict[str, Counter[Hashable]], rename: Callable[[str], str]
) -> None:
    name = proc.name
    ranges = proc.ranges
    entry = ranges[0][0] if ranges else -1
    out["procedures"][(name, entry)] += 1

    def visit(scope: Scope, file: str, loops: tuple[tuple[str, int], ...], callsite: bool) -> None:
        for child in scope.children:
            tag = child.tag
            if tag == STATEMENT:
                out["statements"][(name, file, child.line)] += 1
            elif tag == LOOP:
                lfile = rename(child.file) if child.file else file
                nest = (*loops, (lfile, child.line))
                out["loops"][(name, nest)] += 1
                visit(child, lfile, nest, False)
            elif tag == ALIEN:
                afile = rename(child.file) if child.file else file
                if callsite:
                    # The callee half of a pair: its body is in the callee's file.
                    visit(child, afile, loops, False)
                elif child.name == GUARD_NAME:
                    visit(child, afile, loops, False)
                else:
                    # A call-site A: every A child is a callee (formats.md §4.3).
                    for callee in child.children:
                        if callee.tag == ALIEN:
                            out["inlines"][(name, afile, child.line, callee.name)] += 1
                    visit(child, afile, loops, True)
            elif tag == PROCEDURE:
                _proc_facts(child, file, out, rename)

    visit(proc, file, (), False)


def compare(
    ours: StructureFile, theirs: StructureFile, aliases: Mapping[str, str] | None = None
) -> dict[str, Score]:
    """Precision/recall of ``ours`` against the reference ``theirs``, per kind."""
    mine = facts(ours, aliases)
    ref = facts(theirs)
    result = {}
    for kind in KINDS:
        matched = sum((mine[kind] & ref[kind]).values())
        result[kind] = Score(matched, sum(mine[kind].values()), sum(ref[kind].values()))
    return result


def differences(
    ours: StructureFile,
    theirs: StructureFile,
    kind: str,
    aliases: Mapping[str, str] | None = None,
) -> tuple[list[Hashable], list[Hashable]]:
    """Facts of one kind only we have, and facts only the reference has (for diagnosis)."""
    mine = facts(ours, aliases)[kind]
    ref = facts(theirs)[kind]
    return sorted((mine - ref).elements(), key=repr), sorted((ref - mine).elements(), key=repr)

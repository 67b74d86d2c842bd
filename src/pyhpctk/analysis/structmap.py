"""Address lookup in hpcstruct trees: which scopes enclose an instruction (formats.md §4).

For one ``LM`` element, :class:`StructureIndex` collects every statement (``S``) and call-site
(``C``) address range with the chain of enclosing elements (``F``, ``P``, ``A``, ``L``), sorts the
ranges once and answers lookups with a binary search (``np.searchsorted``), so classifying many
addresses costs O(log n) each. It also exposes the static call graph of ``+gpucfg`` files (``C``
elements with a target). It reads :class:`~pyhpctk.formats.hpcstruct_model.Scope` trees only;
parsing XML is :mod:`pyhpctk.formats.hpcstruct`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pyhpctk.formats.hpcstruct_model import (
    ALIEN,
    CALL,
    FILE,
    LOAD_MODULE,
    LOOP,
    PROCEDURE,
    STATEMENT,
    Scope,
    StructureFile,
)

Chain = tuple[Scope, ...]


@dataclass(frozen=True, slots=True)
class CallSite:
    """A ``C`` element of a ``+gpucfg`` structure: a call instruction and its callee's entry."""

    address: int
    target: int | None
    caller_entry: int


class StructureIndex:
    """Every instruction range of one load module, with its enclosing scopes."""

    __slots__ = (
        "_chains",
        "_hi",
        "_lo",
        "_reach",
        "call_sites",
        "has_calls",
        "module",
        "procedures",
    )

    def __init__(self, module: Scope) -> None:
        if module.tag != LOAD_MODULE:
            raise ValueError(f"expected an LM scope, got {module.tag}")
        self.module = module
        self.has_calls = module.attrs.get("has-calls", "0") == "1"
        lows: list[int] = []
        highs: list[int] = []
        chains: list[Chain] = []
        self.call_sites: list[CallSite] = []
        self.procedures: dict[int, Chain] = {}  # entry address -> chain down to the P

        stack: list[tuple[Scope, Chain]] = [(child, ()) for child in reversed(module.children)]
        while stack:
            scope, above = stack.pop()
            chain = (*above, scope)
            if scope.tag in (STATEMENT, CALL):
                for lo, hi in scope.ranges:
                    lows.append(lo)
                    highs.append(hi)
                    chains.append(chain)
                if scope.tag == CALL:
                    ranges = scope.ranges
                    procedure = next((s for s in reversed(above) if s.tag == PROCEDURE), None)
                    if ranges and procedure is not None and procedure.ranges:
                        self.call_sites.append(
                            CallSite(ranges[0][0], scope.call_target, procedure.ranges[0][0])
                        )
            else:
                if scope.tag == PROCEDURE and scope.ranges:
                    self.procedures.setdefault(scope.ranges[0][0], chain)
                stack.extend((child, chain) for child in reversed(scope.children))
        order = np.argsort(np.asarray(lows, dtype=np.uint64), kind="stable")
        self._lo: npt.NDArray[np.uint64] = np.asarray(lows, dtype=np.uint64)[order]
        self._hi: npt.NDArray[np.uint64] = np.asarray(highs, dtype=np.uint64)[order]
        self._chains: list[Chain] = [chains[i] for i in order]
        # _reach[k]: the furthest end of ranges 0..k; none of them covers an address past it.
        self._reach: npt.NDArray[np.uint64] = (
            np.maximum.accumulate(self._hi) if len(self._hi) else self._hi
        )

    @property
    def path(self) -> str:
        """The binary this structure describes (``LM n``)."""
        return self.module.name

    def lookup(self, address: int) -> Chain | None:
        """The scopes enclosing ``address``, from the ``F`` down to its ``S``/``C``, or None."""
        if not len(self._lo):
            return None
        where = int(np.searchsorted(self._lo, np.uint64(address), side="right")) - 1
        # Ranges may overlap (rarely); walk back only while an earlier range can still reach.
        while where >= 0 and int(self._reach[where]) > address:
            if address < int(self._hi[where]):
                return self._chains[where]
            where -= 1
        return None

    def procedure_at(self, entry: int) -> Chain | None:
        """The chain down to the procedure whose entry address is ``entry``."""
        return self.procedures.get(entry)


def index_structure(structure: StructureFile) -> list[StructureIndex]:
    """One index per ``LM`` element of a structure file."""
    return [StructureIndex(module) for module in structure.modules if module.tag == LOAD_MODULE]


def enclosing_file(chain: Chain) -> str | None:
    """The file name of the nearest ``F`` in a chain."""
    for scope in reversed(chain):
        if scope.tag == FILE:
            return scope.name
    return None


__all__ = [
    "ALIEN",
    "CALL",
    "FILE",
    "LOOP",
    "PROCEDURE",
    "STATEMENT",
    "CallSite",
    "Chain",
    "StructureIndex",
    "enclosing_file",
    "index_structure",
]

"""Which scopes of a structure file contain an address: :class:`AddressMap` (formats.md §4).

pyprof turns (load module, offset) pairs into procedure, inlined-call, loop and line contexts by
asking, for whole arrays of addresses at once, which innermost scope of a structure file holds
each one; the scopes' address ranges (``v="{[0x1000-0x1010) ...}"``) become disjoint sorted
intervals painted by the innermost owner. Read through :mod:`.hpcstruct`, which re-exports it.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from pyhpctk.formats.hpcstruct_model import CALL, PROCEDURE, STATEMENT, Scope

# formats.md §4.2, address-set grammar: "{" then "[0xLO-0xHI)" separated by single spaces, "}".
# Addresses are offsets in a binary: 64 bits at most (leading zeros aside).
ADDRESS = r"0x0*[0-9a-fA-F]{1,16}"
_HEX_RANGE = rf"\[{ADDRESS}-{ADDRESS}\)"
ADDRESS_SET = re.compile(rf"\{{(?:{_HEX_RANGE}(?: {_HEX_RANGE})*)?\}}")

_NO_SCOPE = -1


class _IntervalTable:
    """Disjoint half-open address intervals, sorted, each owned by one scope index."""

    __slots__ = ("ends", "owners", "starts")

    def __init__(
        self,
        lo: npt.NDArray[np.uint64],
        hi: npt.NDArray[np.uint64],
        owner: npt.NDArray[np.int64],
        depth: npt.NDArray[np.int64],
    ) -> None:
        keep = lo < hi
        lo, hi, owner, depth = lo[keep], hi[keep], owner[keep], depth[keep]
        order = np.argsort(lo, kind="stable")
        lo, hi, owner, depth = lo[order], hi[order], owner[order], depth[order]
        if lo.size < 2 or bool(np.all(lo[1:] >= hi[:-1])):
            # Usual case for binaries: statement ranges never overlap.
            self.starts, self.ends, self.owners = lo, hi, owner
            return
        # Overlapping intervals (shared code in libc, Python lines claimed by a function and by
        # a lambda on that line): cut the address space at every boundary and paint the
        # intervals longest first, then shallowest first, then in document order, so the
        # shortest, then deepest, then last interval containing an address owns it.
        bounds = np.unique(np.concatenate([lo, hi]))
        first = np.searchsorted(bounds, lo)
        last = np.searchsorted(bounds, hi)
        segment_owner = np.full(bounds.size - 1, _NO_SCOPE, dtype=np.int64)
        length = hi - lo
        paint_order = np.lexsort((owner, depth, -length.astype(np.float64)))
        for k in paint_order.tolist():
            segment_owner[first[k] : last[k]] = owner[k]
        owned = segment_owner != _NO_SCOPE
        self.starts = bounds[:-1][owned]
        self.ends = bounds[1:][owned]
        self.owners = segment_owner[owned]

    def lookup(self, addresses: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        result = np.full(addresses.shape, _NO_SCOPE, dtype=np.int64)
        if self.starts.size == 0:
            return result
        k = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        inside = k >= 0
        inside[inside] = addresses[inside] < self.ends[k[inside]]
        result[inside] = self.owners[k[inside]]
        return result


_HEX_NUMBER = re.compile(r"0x([0-9a-fA-F]+)")


def _decode_address_sets(
    texts: list[str],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """(lo, hi) of every range in ``texts`` in order, and how many ranges each text holds."""
    count = np.fromiter((text.count("[") for text in texts), dtype=np.int64, count=len(texts))
    numbers = _HEX_NUMBER.findall(" ".join(texts))
    if len(numbers) != 2 * int(count.sum()):
        bad = next(text for text in texts if ADDRESS_SET.fullmatch(text) is None)
        raise ValueError(f"bad address set {bad!r}")
    try:
        values = np.fromiter((int(x, 16) for x in numbers), dtype=np.uint64, count=len(numbers))
    except OverflowError:
        raise ValueError("an address set holds an address beyond 64 bits") from None
    return values[0::2], values[1::2], count


class AddressMap:
    """Map addresses to the innermost scopes whose ranges contain them, in bulk.

    Built once from a scope (normally an ``LM``): every scope below it is numbered in document
    order (:attr:`scopes`, :attr:`parents`), and the ``v`` ranges are flattened into two sorted
    interval tables. Statement and call ranges (``S``, ``C``) come first: they say which
    procedure, inlined call and loop an instruction belongs to. Procedure and loop ``v`` ranges
    are 1-byte entry / header markers (formats.md §4.2), consulted only for addresses no
    statement covers. Where ranges overlap, the shortest range wins, then the deepest scope,
    then the later one in the file.

    ``nested_procedures=False`` leaves out procedures nested inside ``root`` (used for Python
    structure, where a line belongs to the innermost function defined around it: look it up
    in that function's own map).
    """

    __slots__ = ("_leaves", "_markers", "parents", "scopes")

    def __init__(self, root: Scope, *, nested_procedures: bool = True) -> None:
        scopes: list[Scope] = []
        parents: list[int] = []
        # Address sets are collected as text and decoded in one pass at the end.
        texts: list[str] = []
        owners: list[int] = []
        depths: list[int] = []
        leaves: list[bool] = []
        stack: list[tuple[Scope, int, int]] = [(root, _NO_SCOPE, 0)]
        while stack:
            scope, parent, depth = stack.pop()
            index = len(scopes)
            scopes.append(scope)
            parents.append(parent)
            ranges = scope.attrs.get("v")
            if ranges is not None and "[" in ranges:
                texts.append(ranges)
                owners.append(index)
                depths.append(depth)
                leaves.append(scope.tag in (STATEMENT, CALL))
            for child in reversed(scope.children):
                if child.tag == PROCEDURE and not nested_procedures:
                    continue
                stack.append((child, index, depth + 1))
        self.scopes: list[Scope] = scopes
        self.parents: npt.NDArray[np.int64] = np.asarray(parents, dtype=np.int64)
        lo, hi, count = _decode_address_sets(texts)
        owner = np.repeat(np.asarray(owners, dtype=np.int64), count)
        depth_of = np.repeat(np.asarray(depths, dtype=np.int64), count)
        leaf = np.repeat(np.asarray(leaves, dtype=bool), count)
        self._leaves = _IntervalTable(lo[leaf], hi[leaf], owner[leaf], depth_of[leaf])
        self._markers = _IntervalTable(lo[~leaf], hi[~leaf], owner[~leaf], depth_of[~leaf])

    def lookup(self, addresses: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """For each address, the index in :attr:`scopes` of its innermost scope, or -1."""
        query = np.asarray(addresses)
        if query.dtype.kind == "i" and query.size and int(query.min()) < 0:
            raise ValueError("addresses must be non-negative")
        query = query.astype(np.uint64, copy=False)
        result = self._leaves.lookup(query)
        missing = result == _NO_SCOPE
        if missing.any():
            result[missing] = self._markers.lookup(query[missing])
        return result

    def path(self, index: int) -> tuple[Scope, ...]:
        """The scopes from the map's root down to ``scopes[index]`` (empty for -1)."""
        chain: list[Scope] = []
        while index != _NO_SCOPE:
            chain.append(self.scopes[index])
            index = int(self.parents[index])
        return tuple(reversed(chain))

    def paths(self, addresses: npt.ArrayLike) -> list[tuple[Scope, ...]]:
        """:meth:`path` of :meth:`lookup` for every address (each distinct scope walked once)."""
        indices = self.lookup(addresses)
        unique, inverse = np.unique(indices, return_inverse=True)
        chains = [self.path(int(index)) for index in unique.tolist()]
        return [chains[k] for k in inverse.ravel().tolist()]

    def enclosing(self, index: int, tag: str) -> Scope | None:
        """The nearest scope with ``tag`` on the path to ``scopes[index]`` (itself included)."""
        while index != _NO_SCOPE:
            scope = self.scopes[index]
            if scope.tag == tag:
                return scope
            index = int(self.parents[index])
        return None


__all__ = ["ADDRESS", "ADDRESS_SET", "AddressMap"]

"""The calling context tree pyprof builds: contexts and functions, as meta.db will hold them.

A context is what meta.db calls a ``{Ctx}`` (formats.md §3.2, §3.7): a relation to its parent
(lexical nesting, call, inlined call), a lexical type (function, loop, line, instruction) and a
payload (a function, a source location, a point in a load module). Entry points ("main thread",
"application thread", "unknown entry") sit directly below the implicit global context, id 0.

The tree is stored as parallel lists indexed by context id (a parent array), with a dictionary
from ``(parent, key)`` to id so that inserting the same path twice yields the same context: that
is what makes call path unification and context expansion idempotent. This module holds data and
tree arithmetic only; it must never read or write files.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pyhpctk.core.ids import ContextId

# formats.md §3.2: relations, lexical types and entry points are the database's vocabulary.
from pyhpctk.formats.vocabulary import ENTRY_POINT_NAMES, EntryPoint, LexicalType, Relation


@dataclass(frozen=True, slots=True)
class FunctionKey:
    """A meta.db function (formats.md §3.2, Functions section).

    ``token`` tells apart functions that print the same (HPCToolkit keeps one entry per structure
    element, so two inlined copies of one routine are two functions); it is not written anywhere.
    """

    name: str | None
    module: str | None = None
    offset: int = 0
    file: str | None = None
    line: int = 0
    token: Hashable = None

    def describe(self) -> tuple[str | None, str | None, int, str | None, int]:
        """What a database stores of this function (the token left out)."""
        return (self.name, self.module, self.offset, self.file, self.line)


@dataclass(frozen=True, slots=True)
class ContextKey:
    """Everything that identifies a context among its siblings.

    ``entry_point`` is set only for entry points (children of the global context); the other
    fields follow the ``{Ctx}`` flex payload: ``function`` (hasFunction), ``file``/``line``
    (hasSrcLoc, when ``file`` is not None), ``module``/``offset`` (hasPoint, when ``module`` is not
    None).
    """

    relation: Relation = Relation.CALL
    lexical_type: LexicalType = LexicalType.FUNCTION
    function: FunctionKey | None = None
    file: str | None = None
    line: int = 0
    module: str | None = None
    offset: int = 0
    entry_point: EntryPoint | None = None

    @property
    def is_elided(self) -> bool:
        """hpcprof never writes lexical instruction contexts to meta.db (formats.md §3.7)."""
        return self.relation is Relation.LEXICAL and self.lexical_type is LexicalType.INSTRUCTION

    def label(self) -> str:
        """A one-line description in the style of HPCToolkit's dumps (``-call> [function] f``)."""
        if self.entry_point is not None:
            return ENTRY_POINT_NAMES[self.entry_point]
        parts = [f"-{self.relation.name.lower()}> [{self.lexical_type.name.lower()}]"]
        if self.function is not None:
            parts.append(self.function.name or "<unknown function>")
        if self.file is not None:
            parts.append(f"{self.file}:{self.line}")
        if self.module is not None:
            parts.append(f"{self.module}+{self.offset:#x}")
        return " ".join(parts)


ROOT_KEY = ContextKey(relation=Relation.CALL, lexical_type=LexicalType.FUNCTION)


class ContextBuilder:
    """A growing tree of contexts; ids are dense, assigned in creation order, root = 0.

    Distinct keys are interned to small integers (:meth:`intern`), so the hot path of
    expansion, :meth:`child_interned`, hashes pairs of ints rather than dataclasses.
    """

    __slots__ = (
        "_index",
        "_interned",
        "_kinds",
        "_unique_keys",
        "depth",
        "elided",
        "keys",
        "lexical_type",
        "parent",
        "relation",
    )

    def __init__(self) -> None:
        self.parent: list[int] = [-1]
        self.keys: list[ContextKey] = [ROOT_KEY]
        self.depth: list[int] = [0]
        self.relation: list[int] = [int(ROOT_KEY.relation)]
        self.lexical_type: list[int] = [int(ROOT_KEY.lexical_type)]
        self.elided: list[bool] = [False]
        self._index: dict[tuple[int, int], int] = {}
        self._interned: dict[ContextKey, int] = {}
        self._unique_keys: list[ContextKey] = []
        self._kinds: list[tuple[int, int, bool]] = []

    def __len__(self) -> int:
        return len(self.parent)

    def intern(self, key: ContextKey) -> int:
        """A small integer standing for ``key`` in this tree."""
        found = self._interned.get(key)
        if found is None:
            found = len(self._unique_keys)
            self._interned[key] = found
            self._unique_keys.append(key)
            self._kinds.append((int(key.relation), int(key.lexical_type), key.is_elided))
        return found

    def distinct_keys(self) -> list[ContextKey]:
        """Every distinct key used in the tree, in first-use order (cheap: no pass over nodes)."""
        return list(self._unique_keys)

    def lexical_type_of(self, key_id: int) -> int:
        """The lexical type of an interned key."""
        return self._kinds[key_id][1]

    def child_interned(self, parent: int, key_id: int) -> int:
        """The child of ``parent`` with the interned key ``key_id``, created on first use."""
        found = self._index.get((parent, key_id))
        if found is not None:
            return found
        ident = len(self.parent)
        self._index[(parent, key_id)] = ident
        self.parent.append(parent)
        self.keys.append(self._unique_keys[key_id])
        self.depth.append(self.depth[parent] + 1)
        relation, lexical_type, elided = self._kinds[key_id]
        self.relation.append(relation)
        self.lexical_type.append(lexical_type)
        self.elided.append(elided)
        return ident

    def child(self, parent: int, key: ContextKey) -> ContextId:
        """The child of ``parent`` with ``key``, created on first use."""
        return ContextId(self.child_interned(parent, self.intern(key)))

    def find(self, parent: int, key: ContextKey) -> ContextId | None:
        """The child of ``parent`` with ``key``, or None."""
        key_id = self._interned.get(key)
        found = None if key_id is None else self._index.get((parent, key_id))
        return None if found is None else ContextId(found)

    def parent_array(self) -> npt.NDArray[np.int64]:
        """Parent ids as an array (the root's parent is -1)."""
        return np.asarray(self.parent, dtype=np.int64)

    def depth_array(self) -> npt.NDArray[np.int64]:
        return np.asarray(self.depth, dtype=np.int64)

    def relation_array(self) -> npt.NDArray[np.int8]:
        return np.asarray(self.relation, dtype=np.int8)

    def lexical_type_array(self) -> npt.NDArray[np.int8]:
        return np.asarray(self.lexical_type, dtype=np.int8)

    def elided_array(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.elided, dtype=bool)

    def children(self) -> list[list[int]]:
        """Children of every context, in id order."""
        result: list[list[int]] = [[] for _ in self.parent]
        for ident in range(1, len(self.parent)):
            result[self.parent[ident]].append(ident)
        return result

    def visible_ancestor(self) -> npt.NDArray[np.int64]:
        """For every context, itself if meta.db shows it, else its nearest shown ancestor."""
        parent = self.parent_array()
        elided = self.elided_array()
        result = np.arange(len(parent), dtype=np.int64)
        depth = self.depth_array()
        # Level by level from the top: an elided context takes its parent's answer.
        order = np.argsort(depth, kind="stable")
        levels = np.searchsorted(depth[order], np.arange(int(depth.max(initial=0)) + 2))
        for level in range(1, len(levels) - 1):
            rows = order[levels[level] : levels[level + 1]]
            rows = rows[elided[rows]]
            result[rows] = result[parent[rows]]
        return result

    def path(self, ident: int) -> list[ContextKey]:
        """The keys from the top (below the root) down to ``ident``."""
        keys: list[ContextKey] = []
        while ident > 0:
            keys.append(self.keys[ident])
            ident = self.parent[ident]
        keys.reverse()
        return keys

    def walk(self) -> Iterator[int]:
        """Every context id, parents before children (creation order guarantees it)."""
        return iter(range(len(self.parent)))

    def verify(self) -> list[str]:
        """Invariant problems: every parent created before its child, depths consistent."""
        problems = []
        for ident in range(1, len(self.parent)):
            parent = self.parent[ident]
            if not 0 <= parent < ident:
                problems.append(f"context {ident}: parent {parent} does not precede it")
            elif self.depth[ident] != self.depth[parent] + 1:
                problems.append(f"context {ident}: depth {self.depth[ident]} is not parent's + 1")
        return problems


__all__ = [
    "ENTRY_POINT_NAMES",
    "ROOT_KEY",
    "ContextBuilder",
    "ContextKey",
    "EntryPoint",
    "FunctionKey",
    "LexicalType",
    "Relation",
]

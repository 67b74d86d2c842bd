"""Call path unification: merge every profile's CCT into one tree by an associative reduction.

Each ``.hpcrun`` CCT (formats.md §1.5) names its frames by per-file load-module ids and per-file
node ids. :class:`RawTree` renames a frame by what it *is* — ``(module path, offset, unwound)``,
or ``(None, placeholder code, ...)`` for placeholders (lm_id 0) — so that the same call path in
two profiles is the same node. :meth:`RawTree.merge` inserts another tree and returns where each
of its nodes landed; merging is associative and commutative up to node numbering, which lets
``-j`` workers (or MPI ranks) unify their share of profiles and reduce pairwise.

:func:`.extract.extract` turns one profile into a :class:`ProfileData`: its own raw tree, its
point values and its trace records, all in terms of that tree. Nothing here knows about
structure files or databases.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.metrics import MeasuredMetric
from pyhpctk.analysis.runtimes import Roles
from pyhpctk.formats.hpcrun_model import (
    GPU_CONTEXT_LM_ID,
    GPU_RANGE_LM_ID,
    GPU_ROOT_LM_ID,
)

# formats.md §1.5: lm ids of hpcrun's "outlined range trees", named like placeholders.
GPU_RANGE_MODULES: dict[int, str | None] = {
    GPU_ROOT_LM_ID: "<gpu root>",
    GPU_CONTEXT_LM_ID: "<gpu context>",
    GPU_RANGE_LM_ID: "<gpu range>",
}

RawKey = tuple[str | None, int, bool]
"""``(module path or None for a placeholder, offset or packed placeholder code, unwound)``."""


_MODULE_CODES: dict[str | None, int] = {None: 0}
_MODULE_NAMES: list[str | None] = [None]
_MODULE_HASHES = np.zeros(1, dtype=np.uint64)  # by code: a hash of the name, the same everywhere
_MODULE_LOCK = threading.Lock()


def module_code(module: str | None) -> int:
    """A small integer standing for a module path in this process (None, placeholders: 0)."""
    global _MODULE_HASHES
    code = _MODULE_CODES.get(module)
    if code is None:
        with _MODULE_LOCK:
            code = _MODULE_CODES.get(module)
            if code is None:
                assert module is not None
                code = len(_MODULE_NAMES)
                digest = hashlib.blake2b(module.encode("utf-8", "surrogateescape"), digest_size=8)
                hashes = np.append(_MODULE_HASHES, np.uint64(int.from_bytes(digest.digest())))
                _MODULE_HASHES = hashes  # readers see the old array or the complete new one
                _MODULE_NAMES.append(module)
                _MODULE_CODES[module] = code
    return code


def module_name(code: int) -> str | None:
    """The module path :func:`module_code` gave ``code`` to."""
    return _MODULE_NAMES[code]


_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def _mix(
    parent: npt.NDArray[np.int64],
    code: npt.NDArray[np.int64],
    offset: npt.NDArray[np.uint64],
    unwound: npt.NDArray[np.bool_],
) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of (parent, module code, offset, unwound), vectorised (splitmix-style).

    Only a filter: every hash match is confirmed on the four columns.
    """
    with np.errstate(over="ignore"):
        x = (parent + 1).astype(np.uint64) * _M1
        x ^= offset.astype(np.uint64)
        x *= _M2
        x ^= x >> np.uint64(31)
        x ^= (code.astype(np.uint64) << np.uint64(1)) | unwound.astype(np.uint64)
        x *= _M3
        x ^= x >> np.uint64(29)
    return x


_ROOT_PATH = np.uint64(0x243F6A8885A308D3)


def _path_mix(
    parent_path: npt.NDArray[np.uint64],
    offset: npt.NDArray[np.uint64],
    key_hash: npt.NDArray[np.uint64],
) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of a node's whole call path: its parent's path hash and its own key
    (its offset, and :func:`_key_hash` of its module and unwound flag).

    Module *names* are hashed, not this process's module codes, so a path has the same hash
    in every process. Only a filter: every hit is confirmed on the keys and the parent links.
    """
    with np.errstate(over="ignore"):
        x = parent_path * _M1
        x ^= offset
        x *= _M2
        x ^= x >> np.uint64(31)
        x ^= key_hash
        x *= _M1
        x ^= x >> np.uint64(29)
    return x


def _key_hash(
    code: npt.NDArray[np.int64], unwound: npt.NDArray[np.bool_]
) -> npt.NDArray[np.uint64]:
    """The part of :func:`_path_mix` a node's module and unwound flag give."""
    with np.errstate(over="ignore"):
        key = _MODULE_HASHES[code] * _M3
    key ^= unwound.view(np.uint8)
    return key


class _Buckets:
    """Sorted 64-bit hashes with where each run of them with the same top bits starts, so a
    lookup scans about one entry instead of a binary search (whose random probes cost ~100 ns
    a key).

    Hashes are spread evenly (:func:`_path_mix`), so with about as many buckets as entries a
    bucket holds one entry on average and a few at most.
    """

    __slots__ = ("keys", "shift", "starts")

    def __init__(self, sorted_keys: npt.NDArray[np.uint64]) -> None:
        bits = max(len(sorted_keys).bit_length(), 1)
        self.shift = np.uint64(64 - bits)
        widths = np.bincount((sorted_keys >> self.shift).view(np.int64), minlength=1 << bits)
        self.starts = np.zeros((1 << bits) + 1, dtype=np.intp)
        np.cumsum(widths, out=self.starts[1:])
        # The keys and one more, the largest hash, that no key is less than.
        self.keys = np.append(sorted_keys, np.uint64(2**64 - 1))

    def search(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
        """The first position whose key is not less than each of ``keys`` (searchsorted's
        left side), clipped to the last position."""
        bucket = (keys >> self.shift).view(np.intp)  # below 2**63: the same numbers
        at = self.starts[bucket]
        # In its bucket, a key's place is after the entries less than it (the bucket's end
        # when all are: the next bucket's first entry is larger).
        active = np.flatnonzero(self.keys[at] < keys)
        if len(active):
            end = self.starts[bucket[active] + 1]
            inside = np.arange(len(active))
            while len(active):
                at[active] += 1
                where = at[active]
                more = (where < end[inside]) & (self.keys[where] < keys[active])
                active, inside = active[more], inside[more]
        np.minimum(at, max(len(self.keys) - 2, 0), out=at)
        return at


class _Columns:
    """A tree's nodes as numpy columns plus two sorted hash indexes, for vectorised lookups:
    by (parent, key) and by whole call path."""

    __slots__ = (
        "code",
        "hashes",
        "nodes",
        "offset",
        "parent",
        "path",
        "path_buckets",
        "path_nodes",
        "path_sorted",
        "unwound",
    )

    def __init__(
        self,
        parent: npt.NDArray[np.int64],
        code: npt.NDArray[np.int64],
        offset: npt.NDArray[np.uint64],
        unwound: npt.NDArray[np.bool_],
    ) -> None:
        self.parent = parent
        self.code = code
        self.offset = offset
        self.unwound = unwound
        self.hashes: npt.NDArray[np.uint64] | None = None
        self.nodes: npt.NDArray[np.int64] | None = None
        self.path: npt.NDArray[np.uint64] | None = None
        self.path_sorted: npt.NDArray[np.uint64] | None = None
        self.path_nodes: npt.NDArray[np.int64] | None = None
        self.path_buckets: _Buckets | None = None

    @classmethod
    def of(cls, parent: list[int], keys: list[RawKey]) -> _Columns:
        return cls(
            np.asarray(parent, dtype=np.int64),
            np.fromiter((module_code(k[0]) for k in keys), dtype=np.int64, count=len(keys)),
            np.fromiter((k[1] for k in keys), dtype=np.uint64, count=len(keys)),
            np.fromiter((k[2] for k in keys), dtype=bool, count=len(keys)),
        )

    def index(self) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """(sorted hashes, node of each)."""
        if self.hashes is None or self.nodes is None:
            hashes = _mix(self.parent, self.code, self.offset, self.unwound)
            order = np.argsort(hashes, kind="stable").astype(np.int64)
            self.hashes, self.nodes = hashes[order], order
        return self.hashes, self.nodes

    def paths(self) -> npt.NDArray[np.uint64]:
        """Every node's path hash (computed a depth level at a time on first use)."""
        if self.path is None:
            path = np.empty(len(self.parent), dtype=np.uint64)
            key = _key_hash(self.code, self.unwound)
            by_depth, cuts = levels(self.parent)
            for d in range(len(cuts) - 1):
                level = by_depth[cuts[d] : cuts[d + 1]]
                # Depth 0 holds the roots; every deeper node's parent is done already.
                above = np.full(len(level), _ROOT_PATH) if d == 0 else path[self.parent[level]]
                path[level] = _path_mix(above, self.offset[level], key[level])
            self.path = path
        return self.path

    def path_index(self) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """(sorted path hashes, node of each)."""
        if self.path_sorted is None or self.path_nodes is None:
            path = self.paths()
            order = np.argsort(path, kind="stable").astype(np.int64)
            self.path_sorted, self.path_nodes = path[order], order
        return self.path_sorted, self.path_nodes

    def path_search(self, path: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
        """``np.searchsorted(sorted path hashes, path)``, clipped to the last position."""
        if self.path_buckets is None:
            self.path_buckets = _Buckets(self.path_index()[0])
        return self.path_buckets.search(path)

    def find(
        self,
        parent: npt.NDArray[np.int64],
        code: npt.NDArray[np.int64],
        offset: npt.NDArray[np.uint64],
        unwound: npt.NDArray[np.bool_],
    ) -> npt.NDArray[np.int64]:
        """The node with each (parent, code, offset, unwound), or -1."""
        hashes, nodes = self.index()
        result = np.full(len(parent), -1, dtype=np.int64)
        if not len(hashes) or not len(parent):
            return result
        wanted = _mix(parent, code, offset, unwound)
        at = np.minimum(np.searchsorted(hashes, wanted), len(hashes) - 1)
        candidate = nodes[at]
        same_hash = hashes[at] == wanted
        hit = (
            same_hash
            & (self.parent[candidate] == parent)
            & (self.code[candidate] == code)
            & (self.offset[candidate] == offset)
            & (self.unwound[candidate] == unwound)
        )
        result[hit] = candidate[hit]
        # A hash shared by different keys (astronomically rare): scan the run of equal hashes.
        for i in np.flatnonzero(same_hash & ~hit).tolist():
            j = int(at[i]) + 1
            while j < len(hashes) and hashes[j] == wanted[i]:
                c = int(nodes[j])
                if (
                    self.parent[c] == parent[i]
                    and self.code[c] == code[i]
                    and self.offset[c] == offset[i]
                    and self.unwound[c] == unwound[i]
                ):
                    result[i] = c
                    break
                j += 1
        return result

    def append(
        self,
        parent: npt.NDArray[np.int64],
        code: npt.NDArray[np.int64],
        offset: npt.NDArray[np.uint64],
        unwound: npt.NDArray[np.bool_],
    ) -> None:
        base = len(self.parent)
        if self.hashes is not None and self.nodes is not None:
            new = _mix(parent, code, offset, unwound)
            order = np.argsort(new, kind="stable")
            at = np.searchsorted(self.hashes, new[order], side="right")
            self.hashes = np.insert(self.hashes, at, new[order])
            self.nodes = np.insert(self.nodes, at, base + order.astype(np.int64))
        self.parent = np.concatenate([self.parent, parent])
        self.code = np.concatenate([self.code, code])
        self.offset = np.concatenate([self.offset, offset])
        self.unwound = np.concatenate([self.unwound, unwound])
        self.path = self.path_sorted = self.path_nodes = self.path_buckets = None

    def append_paths(
        self,
        parent: npt.NDArray[np.int64],
        code: npt.NDArray[np.int64],
        offset: npt.NDArray[np.uint64],
        unwound: npt.NDArray[np.bool_],
        path: npt.NDArray[np.uint64],
    ) -> None:
        """:meth:`append` nodes whose path hashes are known, keeping the path index (and
        dropping the other: merges look up paths only)."""
        base = len(self.parent)
        sorted_paths, nodes = self.path_index()
        order = np.argsort(path, kind="stable")
        at = np.searchsorted(sorted_paths, path[order], side="right")
        self.path_sorted = np.insert(sorted_paths, at, path[order])
        self.path_nodes = np.insert(nodes, at, base + order.astype(np.int64))
        self.path_buckets = None
        self.path = np.concatenate([self.paths(), path])
        self.parent = np.concatenate([self.parent, parent])
        self.code = np.concatenate([self.code, code])
        self.offset = np.concatenate([self.offset, offset])
        self.unwound = np.concatenate([self.unwound, unwound])
        self.hashes = self.nodes = None


def _depths(parent: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    """Each node's depth (roots 0), by pointer jumping: a pass adds to each node the depth of
    its current ancestor's climb and moves it to that ancestor's ancestor, so ``log2(depth)``
    passes do it (not one per level). The roots' ancestor is a slot past the nodes that climbs
    no further, and two buffers take turns, so a pass allocates nothing."""
    n = len(parent)
    up = np.empty(n + 1, dtype=np.intp)
    np.copyto(up[:n], parent)
    up[:n][parent < 0] = n
    up[n] = n
    depth = np.empty(n + 1, dtype=np.int32)
    np.not_equal(up, n, out=depth)
    above = np.empty_like(up)
    climbed = np.empty_like(depth)
    while True:
        np.take(up, up, out=above, mode="clip")  # (every index is in range; "raise" copies)
        if np.array_equal(above, up):  # every node's ancestor is the top: done
            break
        np.take(depth, up, out=climbed, mode="clip")
        depth += climbed
        up, above = above, up
    return depth[:n]


def levels(parent: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """Nodes sorted by depth (stable) and where each depth starts: parents before children."""
    depth = _depths(parent)
    widths = np.bincount(depth, minlength=1)
    # 16-bit keys take numpy's radix sort.
    keys = depth.astype(np.int16) if len(widths) <= 1 << 15 else depth
    by_depth = np.argsort(keys, kind="stable")
    cuts = np.zeros(len(widths) + 1, dtype=np.intp)
    np.cumsum(widths, out=cuts[1:])
    return by_depth.astype(np.int64, copy=False), cuts


class RawTree:
    """A forest of frames keyed by ``(parent, RawKey)``; ids are dense in creation order.

    Two representations are kept, each built from the other on demand: Python lists
    (:attr:`parent`, :attr:`keys`) with a dict for one-at-a-time :meth:`node`, and numpy columns
    with a sorted hash index for the bulk :meth:`merge`. Whichever path adds nodes drops the
    other representation.
    """

    __slots__ = ("_columns", "_index", "_keys", "_parent")

    def __init__(self) -> None:
        self._parent: list[int] | None = []
        self._keys: list[RawKey] | None = []
        self._index: dict[tuple[int, RawKey], int] | None = {}
        self._columns: _Columns | None = None

    @classmethod
    def from_arrays(cls, parent: list[int], keys: list[RawKey]) -> RawTree:
        """A tree from parent positions and keys already free of duplicate siblings."""
        tree = cls()
        tree._parent = parent
        tree._keys = keys
        tree._index = None  # built on first insertion
        return tree

    @classmethod
    def from_columns(
        cls,
        parent: npt.NDArray[np.int64],
        code: npt.NDArray[np.int64],
        offset: npt.NDArray[np.uint64],
        unwound: npt.NDArray[np.bool_],
    ) -> RawTree:
        """A tree from columns free of duplicate siblings (module codes of :func:`module_code`)."""
        tree = cls()
        tree._parent = tree._keys = tree._index = None
        tree._columns = _Columns(parent, code, offset, unwound)
        return tree

    def wire(self) -> tuple[object, ...]:
        """A compact picklable form for another process (module codes are per process)."""
        columns = self.columns()
        used, local = np.unique(columns.code, return_inverse=True)
        names = [module_name(c) for c in used.tolist()]
        return (columns.parent, local.astype(np.int64), columns.offset, columns.unwound, names)

    @classmethod
    def from_wire(cls, wire: tuple[object, ...]) -> RawTree:
        """The tree :meth:`wire` described, in this process's module codes."""
        parent, local, offset, unwound, names = wire
        assert isinstance(local, np.ndarray) and isinstance(names, list)
        table = np.asarray([module_code(n) for n in names] or [0], dtype=np.int64)
        return cls.from_columns(parent, table[local], offset, unwound)  # type: ignore[arg-type]

    @property
    def parent(self) -> list[int]:
        """Each node's parent (-1 for a root), as a list."""
        if self._parent is None:
            assert self._columns is not None
            self._parent = self._columns.parent.tolist()
        return self._parent

    @property
    def keys(self) -> list[RawKey]:
        """Each node's :data:`RawKey`, as a list."""
        if self._keys is None:
            assert self._columns is not None
            columns = self._columns
            self._keys = list(
                zip(
                    [module_name(c) for c in columns.code.tolist()],
                    columns.offset.tolist(),
                    columns.unwound.tolist(),
                    strict=True,
                )
            )
        return self._keys

    def __len__(self) -> int:
        if self._columns is not None:
            return len(self._columns.parent)
        return len(self.parent)

    def _lookup(self) -> dict[tuple[int, RawKey], int]:
        if self._index is None:
            self._index = dict(
                zip(zip(self.parent, self.keys, strict=True), range(len(self.parent)), strict=True)
            )
        return self._index

    def path_hashes(self) -> npt.NDArray[np.uint64]:
        """Every node's call-path hash (:func:`_path_mix`; computed once, kept for merges)."""
        return self.columns().paths()

    def columns(self) -> _Columns:
        """The nodes as numpy columns (built from the lists on first use)."""
        if self._columns is None:
            self._columns = _Columns.of(self.parent, self.keys)
        return self._columns

    def node(self, parent: int, key: RawKey) -> int:
        """The node for ``key`` under ``parent`` (-1 for a root), created on first use."""
        index = self._lookup()
        found = index.get((parent, key))
        if found is not None:
            return found
        parents, keys = self.parent, self.keys
        ident = len(parents)
        index[(parent, key)] = ident
        parents.append(parent)
        keys.append(key)
        self._columns = None
        return ident

    def extend(self, parents: list[int], keys: list[RawKey]) -> None:
        """Append nodes known to be new: no sibling of any of them has its key (nodes below
        nodes made for them, as :mod:`.graft` makes them)."""
        own_parents, own_keys = self.parent, self.keys
        own_parents.extend(parents)
        own_keys.extend(keys)
        self._columns = None
        self._index = None

    def merge(self, other: RawTree) -> npt.NDArray[np.int64]:
        """Insert ``other`` into this tree; element ``i`` of the result is where node ``i`` went.

        The result is the one of inserting ``other``'s nodes one by one in its order (new nodes
        are numbered in that order). Every node of ``other`` is looked up at once by the hash
        of its whole call path; the hits are confirmed on their keys and parent links, and a
        node that misses is new (its path is not here). Should any hit not be confirmed (a hash
        collision, astronomically rare), the merge goes a depth level at a time instead
        (:meth:`_merge_by_levels`). (``other`` has no duplicate siblings, so none of its nodes
        can find another of its own.)
        """
        n = len(other)
        if n == 0:
            return np.full(0, -1, dtype=np.int64)
        mine = self.columns()
        theirs = other.columns()
        if len(mine.parent) == 0:
            return self._merge_bylevels(other)
        sorted_paths, nodes = mine.path_index()
        path = theirs.paths()
        at = mine.path_search(path)
        hit = sorted_paths[at] == path
        everywhere = bool(hit.all())  # the usual case: no new call path
        # ``mapping`` with one more slot, -1, that a root's parent (-1) reads: a node's
        # parent's mapping is then one gather. Misses hold -2 (a parent no node has) until
        # they are numbered.
        extended = np.empty(n + 1, dtype=np.int64)
        extended[n] = -1
        mapping = extended[:n]
        np.take(nodes, at, out=mapping, mode="clip")  # ("raise" would copy)
        del at
        if not everywhere:
            mapping[~hit] = -2
        parent = theirs.parent
        if everywhere or np.any(hit):
            rows = slice(None) if everywhere else hit
            found = mapping[rows]
            confirmed = mine.parent[found] == extended[parent[rows]]
            confirmed &= mine.code[found] == theirs.code[rows]
            confirmed &= mine.offset[found] == theirs.offset[rows]
            confirmed &= mine.unwound[found] == theirs.unwound[rows]
            if not bool(np.all(confirmed)):
                return self._merge_bylevels(other)
        if not everywhere:
            new = np.flatnonzero(~hit)
            mapping[new] = len(mine.parent) + np.arange(len(new), dtype=np.int64)
            mine.append_paths(
                extended[parent[new]],
                theirs.code[new],
                theirs.offset[new],
                theirs.unwound[new],
                path[new],
            )
            self._parent = self._keys = self._index = None
        return mapping

    def _merge_bylevels(self, other: RawTree) -> npt.NDArray[np.int64]:
        """:meth:`merge` a depth level at a time: a level's (parent, key) pairs are looked up
        in the (parent, key) hash index at once, and a node under a new node is new without a
        lookup."""
        n = len(other)
        mapping = np.full(n, -1, dtype=np.int64)
        mine = self.columns()
        theirs = other.columns()
        parent = theirs.parent
        is_new = np.zeros(n, dtype=bool)
        by_depth, cuts = levels(parent)
        for d in range(len(cuts) - 1):
            level = by_depth[cuts[d] : cuts[d + 1]]
            up = parent[level]
            rooted = up < 0
            safe_up = np.maximum(up, 0)
            orphan = ~rooted & is_new[safe_up]
            ask = level[~orphan]
            is_new[level[orphan]] = True
            if len(ask):
                asked_up = np.where(rooted, -1, mapping[safe_up])[~orphan]
                hits = mine.find(
                    asked_up, theirs.code[ask], theirs.offset[ask], theirs.unwound[ask]
                )
                mapping[ask] = hits
                is_new[ask[hits < 0]] = True
        new = np.flatnonzero(is_new)
        if len(new):
            base = len(self)
            mapping[new] = base + np.arange(len(new), dtype=np.int64)
            new_parent = np.where(parent[new] < 0, -1, mapping[np.maximum(parent[new], 0)])
            mine.append(new_parent, theirs.code[new], theirs.offset[new], theirs.unwound[new])
            self._parent = self._keys = self._index = None
        return mapping

    def paths(self) -> dict[tuple[RawKey, ...], int]:
        """Every node's root path (for tests: two trees are equal when their path sets are)."""
        result: dict[tuple[RawKey, ...], int] = {}
        cache: list[tuple[RawKey, ...]] = []
        for ident, (parent, key) in enumerate(zip(self.parent, self.keys, strict=True)):
            path = ((cache[parent]) if parent >= 0 else ()) + (key,)
            cache.append(path)
            result[path] = ident
        return result


@dataclass(slots=True)
class ProfileData:
    """One profile reduced to arrays over its own :class:`RawTree` (see :func:`extract`)."""

    name: str
    tree: RawTree
    header: dict[str, str]
    id_tuple: list[tuple[int, int, int]]
    metrics: list[MeasuredMetric]
    value_node: npt.NDArray[np.int64]
    value_metric: npt.NDArray[np.int64]
    value: npt.NDArray[np.float64]
    trace_time: npt.NDArray[np.uint64] | None = None
    trace_node: npt.NDArray[np.int64] | None = None
    call_trace: bool = False
    module_paths: dict[str, str] = field(default_factory=dict)
    """Load-module path -> the measurement directory it is relative to."""
    roles: Roles | None = None
    """What the thread can be to native runtimes' worker threads (:mod:`.worker_roles`)."""

    def remap(self, mapping: npt.NDArray[np.int64]) -> None:
        """Renumber nodes after this profile's tree was merged into a bigger one."""
        self.value_node = mapping[self.value_node]
        if self.trace_node is not None:
            self.trace_node = np.where(self.trace_node >= 0, mapping[self.trace_node], -1)
        if self.roles is not None:
            self.roles.remap(mapping)


@dataclass(slots=True)
class Unified:
    """A reduction result: one tree and the profiles whose nodes refer to it."""

    tree: RawTree
    profiles: list[tuple[int, ProfileData]]


def leaf(index: int, data: ProfileData) -> Unified:
    """The reduction's unit: a single profile with its own tree."""
    return Unified(data.tree, [(index, data)])


def combine(left: Unified, right: Unified) -> Unified:
    """The associative merge of two partial unifications (``right`` is folded into ``left``)."""
    mapping = left.tree.merge(right.tree)
    for _, data in right.profiles:
        data.remap(mapping)
        data.tree = left.tree
    return Unified(left.tree, left.profiles + right.profiles)


def reduce_pairwise(parts: list[Unified], jobs: int) -> Unified:
    """Merge partial unifications pairwise (a tree reduction of depth log2 n)."""
    if not parts:
        raise ValueError("nothing to reduce")
    while len(parts) > 1:
        pairs = [(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        odd = [parts[-1]] if len(parts) % 2 else []
        if jobs > 1 and len(pairs) > 1:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                merged = list(pool.map(lambda p: combine(*p), pairs))
        else:
            merged = [combine(a, b) for a, b in pairs]
        parts = merged + odd
    return parts[0]

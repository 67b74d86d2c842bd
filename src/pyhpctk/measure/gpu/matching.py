"""Matching activities to operations by correlation id (the monitor thread's half of the work).

Operations come from two places: the Python paths put operation tuples on each thread's
operation channel; the C hook records (correlation id, token) pairs, where a token names an
operation prototype (a call site: kind, call node, placeholder, thread, CCT). The
:class:`Matcher` keeps the operations no activity has answered yet, the sites as numpy columns
(:class:`SiteTable`), the graph nodes each capture made, and matches a buffer's activities with
one sorted search instead of one dictionary lookup per record where it can.

Only the monitor thread calls :meth:`Matcher.drain` and :meth:`Matcher.match`; application
threads call :meth:`Matcher.token` (under the session lock, from the hook's slow path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import cast, overload

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.operations import (
    CLONE_TAG,
    INNER_TAG,
    NODE_TAG,
    OP_CCT,
    OP_CORRELATION,
    OP_KIND,
    OP_MULTI,
    OP_THREAD,
    site_key,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.backend import NativeHook
    from pyhpctk.measure.gpu.operations import GpuStats, GpuThread, Operation

#: What the native hook's drain() returns: one (correlation id, token) pair per operation.
NATIVE_RECORD = np.dtype([("correlation", "<u8"), ("token", "<i8")])
#: The matcher's waiting C-hook operations: the pair and the buffer count when drained.
PENDING = np.dtype([("correlation", "<u8"), ("token", "<i8"), ("born", "<i8")])
NATIVE_AGE = 4  # buffers an operation waits in the array before it moves to the dict
_TAGS = NODE_TAG | CLONE_TAG


@dataclasses.dataclass(frozen=True, slots=True)
class SiteTable:
    """The C hook's tokens as numpy columns: what matching and attribution need per token."""

    objects: np.ndarray  # token → the operation prototype (an object array of tuples)
    call: np.ndarray
    placeholder: np.ndarray
    kind: np.ndarray  # token → its operation's kind
    thread: np.ndarray  # token → the matcher's number for its GpuThread
    cct: np.ndarray  # token → a number for its CCT (the same number: the same CCT)
    multi: np.ndarray

    @staticmethod
    def empty() -> SiteTable:
        none = np.zeros(0, dtype=np.int64)
        return SiteTable(np.zeros(0, dtype=object), none, none, none, none, none, none.astype(bool))


class SiteOperations(Sequence["Operation"]):
    """Each activity's operation where the C hook recorded them all: its site's prototype,
    looked up when asked (a buffer's tens of thousands of activities need no list of them)."""

    __slots__ = ("objects", "tokens")

    def __init__(self, objects: np.ndarray, tokens: np.ndarray) -> None:
        self.objects = objects
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    @overload
    def __getitem__(self, index: int) -> Operation: ...

    @overload
    def __getitem__(self, index: slice) -> list[Operation]: ...

    def __getitem__(self, index: int | slice) -> Operation | list[Operation]:
        if isinstance(index, slice):
            return cast("list[Operation]", self.objects[self.tokens[index]].tolist())
        return cast("Operation", self.objects[self.tokens[index]])

    def take(self, indices: np.ndarray) -> list[Operation]:
        """The operations of the activities at ``indices``."""
        return cast("list[Operation]", self.objects[self.tokens[indices]].tolist())


def issued_into(cct: object, operations: Sequence[Operation | None]) -> np.ndarray:
    """Which of ``operations`` were recorded into ``cct`` (a bool per operation): for the C
    hook's :class:`SiteOperations`, one look per site, not per activity."""
    if isinstance(operations, SiteOperations):
        sites = [op is not None and op[OP_CCT] is cct for op in operations.objects.tolist()]
        mask: np.ndarray = np.array(sites, dtype=bool)[operations.tokens]
        return mask
    return np.fromiter(
        (op is not None and op[OP_CCT] is cct for op in operations), bool, len(operations)
    )


@dataclasses.dataclass(slots=True)
class Matched:
    """One buffer's activities, each with its operation (or None), owner and token."""

    records: np.ndarray
    operations: list[Operation | None] | SiteOperations
    owners: np.ndarray  # the owning thread's number, -1: no known operation
    tokens: np.ndarray
    unknown: list[int]  # indices of activities no operation claimed
    captures: list[Operation | None] | None  # per activity: its graph node's maker, if known


class Matcher:
    """Operations waiting for their activities, and the C hook's sites (module docstring)."""

    def __init__(self, stats: GpuStats) -> None:
        self.stats = stats
        self.hook: NativeHook | None = None
        self.pending: dict[int, Operation] = {}  # correlation → op (Python-recorded)
        self.native_pending = np.zeros(0, dtype=PENDING)  # the hook's operations, unmatched
        self.aged: dict[int, int] = {}  # correlation → token: the hook's, waiting for long
        self.inner = np.zeros(0, dtype=PENDING)  # driver calls inside runtime calls (INNER_TAG)
        self.sites: list[Operation] = []  # token → operation prototype (correlation 0)
        self.table = SiteTable.empty()  # the same as arrays (monitor thread)
        self.token_of: dict[tuple[int, int, int, int, int, bool], int] = {}
        self.thread_numbers: dict[int, int] = {}
        self.numbered: list[GpuThread] = []
        self.own_calls: set[int] = set()  # correlation ids of the backend's own CUDA calls
        self.graph_nodes: dict[int, Operation] = {}  # graph node id → the op that made it
        self.clones: dict[int, int] = {}  # node of an instantiated graph → its original

    # -- application threads (the hook's slow path, with the session lock) --

    def token(self, operation: Operation) -> int:
        """The token of ``operation``'s site (made on first use)."""
        key = site_key(operation)
        token = self.token_of.get(key)
        if token is None:
            token = self.token_of[key] = len(self.sites)
            self.sites.append((0, *operation[1:]))
        return token

    # -- monitor thread --

    def drain(self, threads: list[GpuThread]) -> None:
        """Take every operation announced so far: the threads' channels and the hook's pairs."""
        pending = self.pending
        for state in threads:
            for operation in state.operations.drain():
                correlation = operation[OP_CORRELATION]
                if operation[OP_KIND] == act.GRAPH_NODE:
                    self._graph_node(correlation & ~_TAGS, operation)
                else:
                    self.stats.operations += 1
                    pending[correlation] = operation
        hook = self.hook
        if hook is None:
            return
        raw = np.frombuffer(hook.drain(), dtype=NATIVE_RECORD)
        if not len(raw):
            return
        inner = (raw["correlation"] & np.uint64(INNER_TAG)) != 0
        if inner.any():
            self.inner = self._pending(raw[inner], self.inner, INNER_TAG)
            raw = raw[~inner]
        tagged = (raw["correlation"] & np.uint64(_TAGS)) != 0
        if tagged.any():
            self._tagged(raw[tagged])
            raw = raw[~tagged]
        self.stats.operations += len(raw)
        self.native_pending = self._pending(raw, self.native_pending)

    def _pending(self, raw: np.ndarray, waiting: np.ndarray, tag: int = 0) -> np.ndarray:
        """``waiting`` and the hook's pairs ``raw`` (their ``tag`` cleared), born now."""
        fresh = np.empty(len(raw), dtype=PENDING)
        fresh["correlation"] = raw["correlation"] & np.uint64(~tag & 0xFFFFFFFFFFFFFFFF)
        fresh["token"] = raw["token"]
        fresh["born"] = self.stats.buffers
        return np.concatenate([waiting, fresh]) if len(waiting) else fresh

    def _tagged(self, raw: np.ndarray) -> None:
        """The hook's graph records: nodes made at a known site, clones of nodes."""
        sites = self.sites
        for correlation, token in zip(
            raw["correlation"].tolist(), raw["token"].tolist(), strict=True
        ):
            if correlation & CLONE_TAG:
                self.clones[correlation & ~_TAGS] = token
            elif 0 <= token < len(sites):
                self._graph_node(correlation & ~_TAGS, sites[token])

    def _graph_node(self, node: int, operation: Operation) -> None:
        if operation[OP_KIND] == act.GRAPH_NODE and node:
            self.graph_nodes[node] = operation
            self.stats.graph_nodes += 1

    def add_clone(self, node: int, original: int) -> None:
        self.clones[node] = original

    def capture_of(self, node: int) -> Operation | None:
        """The operation that made graph node ``node`` (or the node it was cloned from)."""
        original = self.clones.get(node)
        if original is not None:
            found = self.graph_nodes.get(original)
            if found is not None:
                return found
        return self.graph_nodes.get(node)

    def forget_own(self, records: np.ndarray) -> np.ndarray:
        """Leave out the activities of the backend's own calls (counted in ``stats.own``)."""
        own = self.own_calls
        if not own or not len(records):
            return records
        mine = np.isin(records["correlation"], np.fromiter(own, np.uint64, len(own)))
        if not mine.any():
            return records
        self.stats.own += int(mine.sum())
        own.difference_update(records["correlation"][mine].tolist())  # one record each
        return records[~mine]

    def match(self, records: np.ndarray) -> Matched:
        """Each activity's operation: the hook's pairs by sorted search, the rest by dict."""
        correlations = records["correlation"]
        tokens = self._match_native(correlations)
        table = self.site_table()
        missing = bool((tokens < 0).any())
        owners = table.thread[np.maximum(tokens, 0)] if len(table.objects) else tokens.copy()
        if not missing:  # the C hook recorded every one (a launch loop, a model's steps)
            if len(self.inner):
                self._match_inner(correlations[:0], tokens[:0])  # ages the inner calls
            return Matched(
                records,
                SiteOperations(table.objects, tokens),
                owners,
                tokens,
                [],
                self._captures(records),
            )
        operations: list[Operation | None] = (
            table.objects[np.maximum(tokens, 0)].tolist()
            if len(table.objects)
            else [None] * len(records)
        )
        owners[tokens < 0] = -1
        unknown: list[int] = []
        # Activities without a token: aged hook operations, and those Python recorded.
        pending = self.pending
        pop = pending.pop
        aged = self.aged
        token_of = self.token_of
        for index in np.flatnonzero(tokens < 0).tolist():
            correlation = int(correlations[index])
            token = aged.get(correlation, -1)
            if token >= 0:
                table = self.site_table()
                if not table.multi[token]:
                    del aged[correlation]
                tokens[index] = token
                operations[index] = table.objects[token]
                owners[index] = table.thread[token]
                continue
            operation = pop(correlation, None)
            operations[index] = operation
            if operation is None:
                unknown.append(index)
                continue
            if operation[OP_MULTI]:
                pending[operation[OP_CORRELATION]] = operation  # more activities will come
            owners[index] = self.thread_number(operation[OP_THREAD])
            # The C hook's slow path gave this site a token (operation_token).
            tokens[index] = token_of.get(site_key(operation), -1)
        self.site_table()  # tokens newer than the table: rebuilt now, not per batch
        if len(self.inner):
            # Last, the inner driver calls: an activity that carries the id of an operation
            # recorded in Python (a slow path) belongs to that operation, whatever id the
            # inner call had (CUPTI may give both one id).
            unknown = self._claim_inner(correlations, unknown, tokens, operations, owners)
        return Matched(records, operations, owners, tokens, unknown, self._captures(records))

    def _captures(self, records: np.ndarray) -> list[Operation | None] | None:
        """Per activity, the operation that made its graph node (None: no graph node known)."""
        nodes = records["graph_node"]
        if not self.graph_nodes or not nodes.any():
            return None
        captures = [self.capture_of(node) if node else None for node in nodes.tolist()]
        self.stats.graph_activities += sum(c is not None for c in captures)
        return captures if any(c is not None for c in captures) else None

    def _match_native(self, correlations: np.ndarray) -> np.ndarray:
        """Each record's token from the C hook's operations (-1: none), with numpy.

        Matched operations leave the pending array, except those several activities answer
        (CUDA graph launches), which stay for the buffers to come.
        """
        waiting = self.native_pending
        tokens = np.full(len(correlations), -1, dtype=np.int64)
        if not len(waiting):
            return tokens
        order = np.argsort(waiting["correlation"], kind="stable")
        ordered = waiting["correlation"][order]
        at = np.minimum(np.searchsorted(ordered, correlations), len(ordered) - 1)
        hit = ordered[at] == correlations
        tokens[hit] = waiting["token"][order[at[hit]]]
        multi = self.site_table().multi
        taken = order[at[hit]]
        taken = taken[~multi[waiting["token"][taken]]]
        keep = np.ones(len(waiting), dtype=bool)
        keep[taken] = False
        # Operations no activity answered within NATIVE_AGE buffers (event queries, frees...)
        # move to a dict of correlation → token, so the array searched at every buffer stays
        # the size of the recent operations and a late activity still finds its operation.
        old = keep & (waiting["born"] < self.stats.buffers - NATIVE_AGE)
        if old.any():
            self.aged.update(
                zip(
                    waiting["correlation"][old].tolist(),
                    waiting["token"][old].tolist(),
                    strict=True,
                )
            )
            keep &= ~old
        if not keep.all():
            self.native_pending = waiting[keep]
        return tokens

    def _claim_inner(
        self,
        correlations: np.ndarray,
        unknown: list[int],
        tokens: np.ndarray,
        operations: list[Operation | None],
        owners: np.ndarray,
    ) -> list[int]:
        """Give the activities at ``unknown`` their inner driver call's site, where one has it;
        returns those still unknown."""
        if not unknown:
            self._match_inner(correlations[:0], tokens[:0])  # ages the inner calls
            return unknown
        at = np.asarray(unknown, dtype=np.int64)
        found = np.full(len(at), -1, dtype=np.int64)
        self._match_inner(correlations[at], found)
        if not (found >= 0).any():
            return unknown
        table = self.site_table()
        still: list[int] = []
        for index, token in zip(unknown, found.tolist(), strict=True):
            if token < 0:
                still.append(index)
                continue
            tokens[index] = token
            operations[index] = table.objects[token]
            owners[index] = table.thread[token]
        return still

    def _match_inner(self, correlations: np.ndarray, tokens: np.ndarray) -> None:
        """Activities no operation claimed that carry an inner driver call's id: its runtime
        call's token. The inner calls are forgotten after NATIVE_AGE buffers, never counted as
        unanswered (their runtime call is the operation)."""
        waiting = self.inner
        missing = np.flatnonzero(tokens < 0)
        if len(missing):
            order = np.argsort(waiting["correlation"], kind="stable")
            ordered = waiting["correlation"][order]
            wanted = correlations[missing]
            at = np.minimum(np.searchsorted(ordered, wanted), len(ordered) - 1)
            hit = ordered[at] == wanted
            if hit.any():
                tokens[missing[hit]] = waiting["token"][order[at[hit]]]
                self.stats.inner_matched += int(hit.sum())
        self.inner = waiting[waiting["born"] >= self.stats.buffers - NATIVE_AGE]

    def thread_number(self, state: GpuThread) -> int:
        number = self.thread_numbers.get(id(state))
        if number is None:
            number = self.thread_numbers[id(state)] = len(self.thread_numbers)
            self.numbered.append(state)  # keeps the id from being reused
        return number

    def site_table(self) -> SiteTable:
        """The C hook's sites as arrays (rebuilt when new sites appeared; sites are few)."""
        table = self.table
        sites = self.sites
        if len(table.objects) != len(sites):
            count = len(sites)
            objects = np.empty(count, dtype=object)
            for index in range(count):
                objects[index] = sites[index]
            ccts: dict[int, int] = {}
            chosen = sites[:count]
            table = SiteTable(
                objects=objects,
                call=np.array([site[2] for site in chosen], dtype=np.int64),
                placeholder=np.array([site[3] for site in chosen], dtype=np.int64),
                kind=np.array([site[OP_KIND] for site in chosen], dtype=np.int64),
                thread=np.array([self.thread_number(s[OP_THREAD]) for s in chosen], np.int64),
                cct=np.array(
                    [ccts.setdefault(id(site[OP_CCT]), len(ccts)) for site in chosen], np.int64
                ),
                multi=np.array([site[OP_MULTI] for site in chosen], dtype=bool),
            )
            self.table = table
        return table

    def unanswered(self) -> int:
        """Operations no activity answered (graph launches and graph nodes never count)."""
        count = sum(
            not op[OP_MULTI] and op[OP_KIND] != act.GRAPH_NODE for op in self.pending.values()
        )
        waiting = self.native_pending
        multi = self.site_table().multi
        if len(waiting):
            count += int((~multi[waiting["token"]]).sum())
        if self.aged:
            count += int((~multi[np.fromiter(self.aged.values(), np.int64, len(self.aged))]).sum())
        return count

"""Wait-free single-producer single-consumer channels (the paper's C_O, C_A and trace channels).

Two implementations of one interface (``push``, ``drain``, ``len``, ``capacity``,
``overflowed``):

- :class:`SpscChannel`, the one the monitor uses, stores items in a :class:`collections.deque`.
  ``deque.append`` and ``deque.popleft`` are single C calls that CPython runs atomically under
  the GIL: a producer never waits for the consumer, takes no lock, and never sees a torn state.
  It is the fastest channel CPython offers (one C call per item), which matters on the
  application thread's path, once per GPU operation.
- :class:`SegmentedChannel`, the same contract written out as the classic algorithm (a linked
  list of fixed-size segments; the producer only writes its tail slot and then publishes it by
  advancing its own counter, the consumer only reads published slots and advances its own
  counter). It documents why the contract holds without relying on deque internals and is the
  oracle the tests compare the deque channel with.

A bounded channel (``capacity`` > 0) refuses an item when full, counts it in ``overflowed`` and
returns False: a producer that must not block (a tracing channel behind a slow disk) loses
records visibly, never silently. Exactly one thread may push and exactly one thread may drain.

Standard library only.
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

SEGMENT = 256  # slots per segment of a SegmentedChannel
T = TypeVar("T")


class SpscChannel(Generic[T]):
    """One producer, one consumer, no locks: a deque used only through atomic C calls."""

    __slots__ = ("_items", "append", "capacity", "items", "name", "overflowed")

    def __init__(self, name: str = "", capacity: int = 0) -> None:
        self.name = name
        self.capacity = capacity  # 0: unbounded
        self.overflowed = 0  # items refused because the channel was full (producer-owned)
        self._items: collections.deque[T] = collections.deque()
        #: The producer's fast path for an unbounded channel: one C call, no checks.
        self.append = self._items.append
        #: The queue itself, for a consumer's cheap "anything waiting?" truth test.
        self.items = self._items

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: T) -> bool:
        """Producer side: append ``item``; False (and counted) when a bounded channel is full."""
        if self.capacity and len(self._items) >= self.capacity:
            self.overflowed += 1
            return False
        self._items.append(item)
        return True

    def drain(self, handle: Callable[[T], None] | None = None) -> list[T]:
        """Consumer side: every item published so far, oldest first (handed to ``handle`` too)."""
        items = self._items
        popleft = items.popleft
        out = [popleft() for _ in range(len(items))]
        if handle is not None:
            for item in out:
                handle(item)
        return out


class _Segment:
    __slots__ = ("next", "slots")

    def __init__(self) -> None:
        self.slots: list[object] = [None] * SEGMENT  # items, or None once consumed
        self.next: _Segment | None = None


class SegmentedChannel(Generic[T]):
    """The same contract as :class:`SpscChannel`, as a segmented Lamport queue."""

    __slots__ = (
        "_head",
        "_head_count",
        "_tail",
        "_tail_count",
        "capacity",
        "name",
        "overflowed",
    )

    def __init__(self, name: str = "", capacity: int = 0) -> None:
        self.name = name
        self.capacity = capacity
        self.overflowed = 0
        segment = _Segment()
        self._head = segment  # consumer-owned
        self._tail = segment  # producer-owned
        self._head_count = 0  # items consumed so far (written by the consumer only)
        self._tail_count = 0  # items published so far (written by the producer only)

    def __len__(self) -> int:
        return self._tail_count - self._head_count

    def push(self, item: T) -> bool:
        count = self._tail_count
        if self.capacity and count - self._head_count >= self.capacity:
            self.overflowed += 1
            return False
        index = count % SEGMENT
        tail = self._tail
        if index == 0 and count:
            segment = _Segment()
            tail.next = segment
            self._tail = tail = segment
        tail.slots[index] = item
        self._tail_count = count + 1  # publish only after the slot is written
        return True

    def drain(self, handle: Callable[[T], None] | None = None) -> list[T]:
        end = self._tail_count
        count = self._head_count
        items: list[T] = []
        head = self._head
        while count < end:
            index = count % SEGMENT
            if index == 0 and count:
                following = head.next
                assert following is not None  # published items always have their segment
                head = following
            item: T = head.slots[index]  # type: ignore[assignment]
            head.slots[index] = None  # let the item be freed
            items.append(item)
            count += 1
        self._head = head
        self._head_count = count
        if handle is not None:
            for item in items:
                handle(item)
        return items

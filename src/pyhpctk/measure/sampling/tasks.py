"""Asyncio-aware stacks (``pyrun --async-aware``, issue #37 item 4).

A coroutine runs on the event loop's frames (``asyncio.run`` → ``run_forever`` → ``_run_once`` →
``Handle._run`` → ``Task.__step``), whichever task it belongs to, so a plain profile puts every
task's time under the same loop frames and says nothing of which task awaited which. With
async-aware stacks a sample of a running task is placed instead under the chain of tasks
awaiting it, each a context node ``<task NAME>``, outermost first, with each awaiting task's own
suspended coroutine frames (where it awaits) between its node and the next::

    | Main → <task main> → main → <task parent> → parent → <task worker-a> → worker → crunch

The loop's frames below the running task's outermost coroutine frame are left out. A task
*awaits* another when its ``_fut_waiter`` is that task or a ``gather`` future holding it (the
first such awaiter is followed; a task awaited by none is the chain's root).

The engine marks each sample's outermost coroutine frame (its coroutine's address, as
:func:`id` gives it: :data:`TASK_BIT`); the Python sampler finds the task by its coroutine's
frame. :class:`TaskChains` maps either to the chain, looking at the tasks once per drain or
sample (``asyncio.tasks``' registries: ``_all_tasks`` on 3.11, ``_scheduled_tasks`` and
``_eager_tasks`` on 3.12 and 3.13). A sample in a coroutine no task drives (``coro.send`` by
hand) keeps its whole stack. Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import sys

from pyhpctk.measure.cct import python_frame_ips

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from types import FrameType

    from pyhpctk.measure.session.table import ThreadTable

#: The engine's task marker: ``TASK_BIT | address of the coroutine`` (engine.h, CODE_TASK).
TASK_BIT = 1 << 62
#: The name of a task's context node.
TASK_FORMAT = "<task {}>"
FID_SHIFT = 32  # formats.md §1.10: a Python frame's ip is fid << 32 | line
LINE_MASK = 0xFFFFFFFF
#: asyncio's registries of live tasks, by version (attributes of ``asyncio.tasks``).
REGISTRIES = ("_all_tasks", "_scheduled_tasks", "_eager_tasks")


def live_tasks() -> list[object]:
    """Every asyncio task of this process now (none when asyncio was never imported)."""
    module = sys.modules.get("asyncio.tasks")
    if module is None:
        return []
    found: list[object] = []
    for name in REGISTRIES:
        registry = getattr(module, name, None)
        for _ in range(3):  # another thread may add a task while the set is copied
            try:
                found.extend(list(registry or ()))
                break
            except RuntimeError:
                continue
    return found


class TaskChains:
    """The tasks of one moment (:meth:`refresh`), and the chain awaiting each."""

    __slots__ = (
        "_awaited_by",
        "_by_coro",
        "_by_frame",
        "_chains",
        "_previous",
        "_resolved",
        "_stale",
        "table",
    )

    def __init__(self, table: ThreadTable) -> None:
        self.table = table  # its functions name the frames and the tasks' nodes
        self._by_coro: dict[int, object] = {}  # id(coroutine) -> its task
        self._by_frame: dict[int, object] = {}  # id(the coroutine's outermost frame) -> task
        self._awaited_by: dict[int, object] = {}  # id(task) -> the first task awaiting it
        self._chains: dict[int, tuple[int, ...]] = {}  # id(task) -> its chain's ips
        # The engine's markers resolved since the last look, and before it (coroutine address
        # -> chain): a task that ended between its last samples and the drain is gone from
        # asyncio's registry, and is found there.
        self._resolved: dict[int, tuple[int, ...]] = {}
        self._previous: dict[int, tuple[int, ...]] = {}
        self._stale = True

    def refresh(self) -> None:
        """Look at the tasks again before the next lookup (each drain, each sample)."""
        self._stale = True

    def _look(self) -> None:
        self._stale = False
        self._previous, self._resolved = self._resolved, {}
        self._by_coro.clear()
        self._by_frame.clear()
        self._awaited_by.clear()
        self._chains.clear()
        for task in live_tasks():
            try:
                coro = task.get_coro()  # type: ignore[attr-defined]
            except AttributeError:
                continue
            self._by_coro[id(coro)] = task
            frame = getattr(coro, "cr_frame", None)
            if frame is not None:
                self._by_frame[id(frame)] = task
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is not None:
                for awaited in (waiter, *getattr(waiter, "_children", ())):
                    self._awaited_by.setdefault(id(awaited), task)

    def by_coroutine(self, address: int) -> object | None:
        """The task whose coroutine is at ``address`` (the engine's marker), or None."""
        if self._stale:
            self._look()
        return self._by_coro.get(address)

    def by_frame(self, frame: FrameType) -> object | None:
        """The task whose coroutine's outermost frame is ``frame``, or None."""
        if self._stale:
            self._look()
        return self._by_frame.get(id(frame))

    def chain(self, task: object) -> tuple[int, ...]:
        """The ips of the tasks awaiting ``task`` and of ``task`` itself, outermost first: each
        task's node, then (but for ``task``'s, whose frames the sample holds) the frames of its
        coroutine down to the await it is suspended at."""
        key = id(task)
        found = self._chains.get(key)
        if found is None:
            tasks = [task]
            seen = {key}
            awaiter = self._awaited_by.get(key)
            while awaiter is not None and id(awaiter) not in seen:
                tasks.append(awaiter)
                seen.add(id(awaiter))
                awaiter = self._awaited_by.get(id(awaiter))
            ips: list[int] = []
            for outer in reversed(tasks):
                ips.append(
                    self.table.functions.named(TASK_FORMAT.format(_name(outer))) << FID_SHIFT
                )
                if outer is not task:
                    ips.extend(self._suspended(outer))
            found = self._chains[key] = tuple(ips)
        return found

    def _suspended(self, task: object) -> list[int]:
        """The ips of a suspended task's coroutine frames, outermost first (``cr_await``)."""
        ips = []
        register = self.table.functions.register
        coro = getattr(task, "get_coro", lambda: None)()
        for _ in range(256):
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is None:
                break
            fid = register(frame.f_code)
            if fid:
                ips.append(fid << FID_SHIFT | ((frame.f_lineno or 0) & LINE_MASK))
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        return ips

    def thread_ips(self, frame: FrameType, fid_of: dict[int, int]) -> list[int]:
        """The Python sampler's ips of a stack (innermost first, as
        :func:`~pyhpctk.measure.cct.python_frame_ips`): up to the running task's outermost
        coroutine frame, then the chain of tasks awaiting it."""
        if self._stale:
            self._look()
        outer: FrameType | None = frame
        while outer is not None:
            task = self._by_frame.get(id(outer))
            if task is not None:
                ips = python_frame_ips(frame, self.table.functions, fid_of, stop=outer)
                ips.extend(reversed(self.chain(task)))
                return ips
            outer = outer.f_back
        return python_frame_ips(frame, self.table.functions, fid_of)

    def engine_path(self, path: list[int]) -> list[int]:
        """An engine sample's path (outermost first) with its task marker replaced by the
        chain of tasks, and the frames below the marker left out."""
        for at, ip in enumerate(path):
            if ip >> 62 == 1:  # TASK_BIT, not a native frame's 1 << 63
                address = ip & ~TASK_BIT
                task = self.by_coroutine(address)
                chain = self.chain(task) if task is not None else self._previous.get(address)
                if chain is None:  # no task drives this coroutine
                    return path[:at] + path[at + 1 :]
                self._resolved[address] = chain
                return [*chain, *path[at + 1 :]]
        return path


def _name(task: object) -> str:
    try:
        return str(task.get_name())  # type: ignore[attr-defined]
    except Exception:  # a task-like object of another library
        return type(task).__name__

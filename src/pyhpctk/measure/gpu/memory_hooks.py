"""The allocators' own hooks that feed :class:`~.memory.MemoryTracker` (issue #37 item 2).

Each is installed when its framework is imported (now, if it already is; else by a finder on
``sys.meta_path`` that runs the hook once the module has executed), never importing it itself:

- **CuPy** (public API, ``cupy.cuda.MemoryHook``, any CuPy with it): a hook object entered on the
  importing thread (CuPy's hooks are per thread: allocations of other threads are not seen).
  ``malloc_postprocess``/``free_postprocess`` are the pool's blocks, ``alloc_postprocess`` the
  pool's ``cudaMalloc`` (reserved; CuPy tells no hook when its pool frees a segment, and tells
  a failed ``cudaMalloc`` with ``mem_ptr`` 0: not reserved).
- **PyTorch** (private API, pinned to the versions in :data:`TORCH_SUPPORTED`; another version
  is refused in one line and its memory left unmeasured): at CUDA's lazy initialization
  (``torch.cuda._lazy_call``: importing torch does not start CUDA), the caching allocator's own
  history is turned on with Python stacks only (``torch._C._cuda_record_memory_history``: what
  ``torch.cuda.memory._record_memory_history(stacks="python")`` does, without the profiler), and
  an out-of-memory observer is attached (``torch._C._cuda_attach_out_of_memory_observer``): it
  reads the history and writes the report before the allocator raises ``OutOfMemoryError``.
  At exit the history is read once more (:meth:`.MemoryTracker.take_torch`). A program that
  calls ``_record_memory_history(None)`` itself turns it off.

CuPy's pool tells ``malloc_postprocess`` of a failed allocation too (``mem_ptr`` 0): the
out-of-memory report is written then, before CuPy raises. At exit an uncaught CuPy
``OutOfMemoryError`` (``sys.last_value``) that no report was written for yet (raised on another
thread, whose hook is not ours) gets one then, before the process ends.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import inspect
import re
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pyhpctk.measure.gpu import memory_files
from pyhpctk.measure.gpu.memory import CUPY, MemoryTracker, Replayed

#: The PyTorch releases whose private allocator API this was written and tested against.
TORCH_SUPPORTED = ("2.11", "2.12", "2.13", "2.14")  # run on 2.11 (device) and 2.14 (here)
#: Actions left out of PyTorch's history: pyrun reads alloc, free_completed and segment_*
#: (alloc/free, map/unmap: the latter two are expandable segments growing and shrinking).
TORCH_SKIPPED = ["free_requested", "snapshot", "annotate"]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hooks[name](module)`` once module ``name`` has executed (top-level names only)."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks
        self._busy = threading.local()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None or getattr(self._busy, "on", False):
            return None
        self._busy.on = True  # the other finders, in their order (an editable install's too)
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(name, path, target)
                    if spec is not None:
                        break
        finally:
            self._busy.on = False
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            self.hooks.pop(name, None)
            hook(module)

        loader.exec_module = exec_module
        return spec


def install(tracker: MemoryTracker) -> None:
    """Hook the allocators imported now, and those imported later."""
    hooks: dict[str, Callable[[ModuleType], None]] = {
        "cupy": lambda module: _install_cupy(tracker, module),
        "torch": lambda module: _install_torch(tracker, module),
    }
    for name in list(hooks):
        module = sys.modules.get(name)
        if module is not None:
            hooks.pop(name)(module)
    if hooks:
        finder = _AfterImport(hooks)
        sys.meta_path.insert(0, finder)
        tracker.hooks.append(finder)


class CupyPoolEvents:
    """What a ``cupy.cuda.MemoryHook`` hears, told to the tracker (the hook's methods; a test
    without a GPU calls them as CuPy would)."""

    name = "pyhpctk"

    def __init__(self, tracker: MemoryTracker) -> None:
        self.tracker = tracker

    def malloc_postprocess(self, **kwargs: Any) -> None:
        device, address, size = int(kwargs["device_id"]), int(kwargs["mem_ptr"]), kwargs["size"]
        if address:
            self.tracker.allocated(CUPY, device, address, int(kwargs["mem_size"]))
        elif size:  # CuPy's pool failed (mem_ptr 0): out of memory, before CuPy raises
            memory_files.out_of_memory(
                self.tracker, device, int(size), "CuPy: the memory pool could not allocate"
            )

    def free_postprocess(self, **kwargs: Any) -> None:
        self.tracker.freed(CUPY, int(kwargs["device_id"]), int(kwargs["mem_ptr"]))

    def alloc_postprocess(self, **kwargs: Any) -> None:
        address = int(kwargs["mem_ptr"])
        if address:  # 0: the pool's cudaMalloc failed (CuPy tells it too): nothing reserved
            self.tracker.reserved(CUPY, int(kwargs["device_id"]), address, int(kwargs["mem_size"]))


def _install_cupy(tracker: MemoryTracker, module: ModuleType) -> None:
    try:
        from cupy.cuda import MemoryHook
    except ImportError as error:
        tracker.problems.append(f"pyrun: gpu memory: CuPy without MemoryHook ({error}): not seen")
        return
    hook_class = type("PyhpctkMemoryHook", (CupyPoolEvents, MemoryHook), {})
    hook = hook_class(tracker)
    hook.__enter__()
    tracker.hooks.append(hook)


def torch_refusal(version: str) -> str:
    """The one line for a PyTorch whose allocator pyrun does not know; '' for a known one."""
    if version.split("+")[0].rsplit(".", 1)[0] in TORCH_SUPPORTED:
        return ""
    return (
        f"pyrun: gpu memory: PyTorch {version} is not supported (supported: "
        f"{TORCH_SUPPORTED[0]}.x to {TORCH_SUPPORTED[-1]}.x; its allocator's private API may"
        " differ): PyTorch's"
        " memory is not measured"
    )


UNKNOWN_ACTION = re.compile(r"Unknown TraceEntry action: (\w+)")


def _record_skipping_what_it_knows(record: Any, arguments: dict[str, Any]) -> None:
    """``record(**arguments)``, its ``skip_actions`` cut to the actions this release knows: one
    that names an action it does not know refuses the whole call ("Unknown TraceEntry action:
    annotate" from 2.11, which has no ``annotate``)."""
    skipped = list(arguments.get("skip_actions", ()))
    while True:
        try:
            record(**arguments)
            return
        except RuntimeError as error:
            unknown = UNKNOWN_ACTION.search(str(error))
            if unknown is None or unknown.group(1) not in skipped:
                raise
            skipped.remove(unknown.group(1))
            arguments = {**arguments, "skip_actions": list(skipped)}


class TorchAllocator:
    """PyTorch's caching allocator, read through its history (see the module docstring)."""

    def __init__(self, tracker: MemoryTracker, torch: Any) -> None:
        self.tracker = tracker
        self.torch = torch
        self.enabled = False

    def enable(self) -> None:
        c = self.torch._C
        try:
            # What _record_memory_history(stacks="python") does, without its checks; by name,
            # so that each release's own list of arguments is kept (2.11's differs from 2.14's)
            record = self.torch.cuda.memory._record_memory_history_impl
            wanted = {
                "enabled": "all",
                "context": "alloc",
                "stacks": "python",
                "max_entries": sys.maxsize,
                "skip_actions": TORCH_SKIPPED,  # (where known: the replay ignores them anyway)
            }
            known = inspect.signature(record).parameters
            _record_skipping_what_it_knows(
                record, {name: value for name, value in wanted.items() if name in known}
            )
            c._cuda_attach_out_of_memory_observer(self.out_of_memory)
        except Exception as error:  # (raised here it would fail the program's CUDA start)
            self.tracker.problems.append(
                f"pyrun: gpu memory: cannot record PyTorch's allocator: {error}"
            )
            return
        self.enabled = True

    def read(self) -> None:
        if self.enabled:
            self.tracker.take_torch(self.torch.cuda.memory._snapshot())

    def out_of_memory(self, device: int, requested: int, allocated: int, free: int) -> None:
        """The allocator could not find ``requested`` bytes (called before it raises)."""
        message = f"PyTorch: {allocated} bytes allocated, {free} bytes free on the device"
        memory_files.out_of_memory(self.tracker, device, requested, message)

    def finish(self) -> None:
        try:
            self.read()
        except Exception as error:
            self.tracker.problems.append(f"pyrun: gpu memory: cannot read PyTorch's: {error!r}")


def _install_torch(tracker: MemoryTracker, torch: ModuleType) -> None:
    refusal = torch_refusal(str(getattr(torch, "__version__", "?")))
    if refusal:  # said at once: the program goes on, its PyTorch memory unmeasured
        sys.stderr.write(refusal + "\n")
        return
    allocator = TorchAllocator(tracker, torch)
    tracker.hooks.append(allocator)
    torch.cuda._lazy_call(allocator.enable)


def _uncaught_oom(tracker: MemoryTracker) -> None:
    """An uncaught CuPy out-of-memory error the program dies of: its report, now."""
    error = getattr(sys, "last_value", None)
    if error is None or type(error).__name__ != "OutOfMemoryError" or tracker.oom_reports:
        return
    if not type(error).__module__.startswith("cupy"):
        return
    requested = getattr(error, "size", 0)
    memory_files.out_of_memory(
        tracker, 0, requested if isinstance(requested, int) else 0, str(error)
    )


def finish(tracker: MemoryTracker, report: bool = True) -> Replayed:
    """Undo the hooks (reading PyTorch's history a last time), replay every event, attribute
    the metrics into the threads' CCTs, write the timeline; say the peak and the reports."""
    undo(tracker)
    result = tracker.replay()
    with tracker.session.lock:
        tracker.attribute(result)
    try:
        memory_files.write_timeline(tracker, result)
    except OSError as error:
        tracker.problems.append(f"pyrun: gpu memory: cannot write the timeline: {error}")
    if report:
        for line in tracker.problems + memory_files.summary(tracker, result):
            sys.stderr.write(line + "\n")
    return result


def undo(tracker: MemoryTracker) -> None:
    """Undo the hooks (reading PyTorch's history a last time)."""
    for hook in tracker.hooks:
        if isinstance(hook, TorchAllocator):
            hook.finish()
        elif isinstance(hook, _AfterImport):
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(hook)
        elif isinstance(hook, CupyPoolEvents):
            # (another thread's exit, or CuPy already torn down: nothing to undo)
            with contextlib.suppress(Exception):
                hook.__exit__(None, None, None)  # type: ignore[attr-defined]
    tracker.hooks.clear()
    _uncaught_oom(tracker)

"""PyTorch's modules and annotations, and the ``nvtx`` package's, as ranges (``pyrun --ranges``).

:func:`install` hooks these once they are imported (now, or when the program imports them), and
each opens and closes a range of :class:`~pyhpctk.measure.ranges.Ranges`:

- ``nn.Module`` calls, through PyTorch's global forward hooks
  (``register_module_forward_pre_hook``, ``register_module_forward_hook(always_call=True)``):
  the range is named after the module's path in its model, ``layer1.0.conv1 (Conv2d)``; the
  model itself by its class, ``ResNet``. A module called before anything that holds it is named
  from itself, and its submodules are renamed when a model holding it is first called.
- the backward pass: autograd runs a module's backward nodes on its own threads (one per
  device, the calling thread for the CPU), where no frame says which module made them. Each
  module's call puts a pre-hook (``Node.register_prehook``) on the autograd node of its output
  (naming the chain of modules down to it) and on those of its inputs (naming the chain above
  it): autograd runs a graph's nodes newest first, so from one hooked node to the next the
  nodes that run are the module's own, and the hook that fires switches the thread's ranges to
  that chain. A node is hooked once, by the first module to see it: the innermost module that
  made it. ``torch.autograd.backward`` and ``grad`` (their common ``_engine_run_backward``)
  pre-hook the pass's roots with a switch to no module (a loss computed outside the model: its
  backward runs first, on a thread still in the last module of the pass before), and restore
  the calling thread's ranges when they return.
  Why not the alternatives: full backward hooks (``register_module_full_backward_hook``)
  wrap every module's inputs and outputs in an extra autograd function, which refuses
  in-place operations on them (ResNet's ``ReLU(inplace=True)``) and costs a node per module;
  autograd's sequence numbers, which torch.profiler correlates, are only readable from a node
  (or the profiler's own events), and a sample cannot ask the running node for its number.
- ``torch.profiler.record_function`` (``torch.autograd.profiler.record_function``):
  its ``__enter__``/``__exit__``, so a decorator's use is seen too.
- ``torch.cuda.nvtx.range_push``/``range_pop`` (and ``torch.cuda.nvtx.range``, which calls
  them), and the ``nvtx`` package's ``push_range``/``pop_range`` and ``annotate`` (context
  manager and decorator), whether or not an NVTX tool is attached.

Standard library only: this runs inside the measured program (PyTorch is imported by it).
"""

from __future__ import annotations

import functools
import sys
import threading

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    from pyhpctk.measure.ranges import Ranges

#: The key of an autograd node's ``metadata`` that says pyrun hooked it.
MARK = "pyhpctk.ranges"

#: What ``getattr(value, "grad_fn", ...)`` gives for a value that is no tensor.
_NOT_A_TENSOR = object()

#: The name of a range the program gave no name (``nvtx.annotate()`` as a context manager).
UNNAMED = "<unnamed range>"


def install(ranges: Ranges) -> TorchRanges:
    """Hook PyTorch and ``nvtx`` for ``ranges``: now where imported, else at their import.
    Returns PyTorch's hooks (:meth:`TorchRanges.uninstall` takes them off: benchmarks)."""
    torch_hooks = TorchRanges(ranges)
    hooks: dict[str, Callable[[Any], None]] = {
        "torch": torch_hooks.install,
        "nvtx": functools.partial(hook_nvtx, ranges),
    }
    for name in list(hooks):
        module = sys.modules.get(name)
        if module is not None:
            hooks.pop(name)(module)
    if hooks:
        sys.meta_path.insert(0, ImportWatcher(hooks))
    return torch_hooks


class ImportWatcher:
    """A meta path finder that runs a hook right after a watched package's own import."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> ModuleSpec | None:
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        del self.hooks[fullname]
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                hook(module)
            except Exception as error:  # a version whose insides differ: measured without
                sys.stderr.write(f"pyrun: --ranges: cannot hook {fullname}: {error!r}\n")

        loader.exec_module = exec_module
        return spec


class TorchRanges:
    """PyTorch's hooks (see the module docstring)."""

    def __init__(self, ranges: Ranges) -> None:
        self.ranges = ranges
        self.local = threading.local()  # .chain: module names open; .base: kept in backward
        self.names: Any = None  # WeakKeyDictionary: module -> its range's name
        self.switches: dict[tuple[str, ...], Callable[..., None]] = {}
        self._undo: list[Callable[[], object]] = []  # what uninstall() runs

    def install(self, torch: Any) -> None:
        import weakref

        nn_module = torch.nn.modules.module
        self.names = weakref.WeakKeyDictionary()
        self.grad_enabled = torch.is_grad_enabled
        forward_pre, forward_post = self.module_hooks()
        pre = nn_module.register_module_forward_pre_hook(forward_pre)
        post = nn_module.register_module_forward_hook(forward_post, always_call=True)
        self._undo += [getattr(pre, "remove", _nothing), getattr(post, "remove", _nothing)]
        self._wrap_backward(torch)
        record = torch.autograd.profiler.record_function
        enter, leave = record.__enter__, record.__exit__
        ranges = self.ranges

        def record_enter(self: Any) -> Any:
            ranges.push(str(self.name))
            return enter(self)

        def record_exit(self: Any, *exc: object) -> Any:
            try:
                return leave(self, *exc)
            finally:
                ranges.pop()

        self._replace(record, "__enter__", record_enter)
        self._replace(record, "__exit__", record_exit)
        nvtx: Any = sys.modules.get("torch.cuda.nvtx")
        if nvtx is not None:
            self._replace(nvtx, "range_push", _pushing(ranges, nvtx.range_push))
            self._replace(nvtx, "range_pop", _popping(ranges, nvtx.range_pop))

    def _replace(self, owner: Any, name: str, value: object) -> None:
        original = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, original))

    def uninstall(self) -> None:
        """Take PyTorch's hooks off again (the nodes hooked so far keep theirs)."""
        while self._undo:
            self._undo.pop()()

    def _wrap_backward(self, torch: Any) -> None:
        autograd = torch.autograd
        run = autograd._engine_run_backward
        ranges, local, hook = self.ranges, self.local, self._hook

        def engine_run_backward(*args: Any, **kwargs: Any) -> Any:
            # The pass's roots (a loss computed outside any module) run under no module: the
            # thread that runs them (autograd's, which outlives the pass) is told so first.
            hook(args[0] if args else kwargs.get("t_outputs", ()), ())
            saved = ranges.save()
            outer = getattr(local, "base", None)
            local.base = len(saved)
            try:
                return run(*args, **kwargs)
            finally:
                local.base = outer
                ranges.restore(saved)

        self._replace(autograd, "_engine_run_backward", engine_run_backward)

    def name_of(self, module: Any) -> str:
        name = self.names.get(module)
        if name is None:
            names = self.names
            for path, sub in module.named_modules(remove_duplicate=False):
                kind = type(sub).__name__
                names[sub] = f"{path} ({kind})" if path else kind
            name = names[module]
        return str(name)

    def module_hooks(self) -> tuple[Callable[[Any, Any], None], Callable[[Any, Any, Any], None]]:
        """The global forward pre- and post-hooks: closures, since every module call runs both
        (what they would look up on ``self`` is looked up once here)."""
        local, names, name_of, hook = self.local, self.names, self.name_of, self._hook
        push, pop, grad_enabled = self.ranges.push, self.ranges.pop, self.grad_enabled

        def forward_pre(module: Any, args: Any) -> None:
            outer: tuple[str, ...] = getattr(local, "chain", ())
            name = names.get(module) or name_of(module)
            local.chain = (*outer, name)
            push(name)
            if grad_enabled():
                hook(args, outer)

        def forward_post(module: Any, args: Any, output: Any) -> None:
            chain: tuple[str, ...] = getattr(local, "chain", ())
            if grad_enabled():
                hook(output, chain)
            local.chain = chain[:-1]
            pop()

        return forward_pre, forward_post

    def _hook(self, value: Any, chain: tuple[str, ...]) -> None:
        """Pre-hook the autograd nodes of the tensors in ``value`` with a switch to
        ``chain`` (a node already hooked keeps its first): ``value`` itself, or those of a
        tuple, list or dict one level down (what ``grad_fn`` has meaning for)."""
        if type(value) is tuple and len(value) == 1:  # the common case: one tensor
            value = value[0]
        node = getattr(value, "grad_fn", _NOT_A_TENSOR)  # a tensor's (made when asked): once
        if node is not _NOT_A_TENSOR:
            if node is not None:
                self._hook_node(node, chain)
            return
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, (tuple, list)):
            value = getattr(value, "values", tuple)()  # a ModelOutput (transformers)
        for item in value:
            node = getattr(item, "grad_fn", None)
            if node is not None:
                self._hook_node(node, chain)

    def _hook_node(self, node: Any, chain: tuple[str, ...]) -> None:
        """Pre-hook ``node`` with a switch to ``chain`` unless it was hooked. A node is marked
        in its own ``metadata``: ``grad_fn`` is a Python object PyTorch makes when asked and
        drops when no one holds it, so its id is no node's (on the H100, a leaf module's output
        node met again as its sibling's input got a second switch, to their parent, and the
        leaves' backward kernels went to it)."""
        marks = getattr(node, "metadata", None)  # every node has it (PyTorch 2.0 on)
        if marks is None or MARK in marks:
            return
        marks[MARK] = True
        node.register_prehook(self.switches.get(chain) or self._switch(chain))

    def _switch(self, chain: tuple[str, ...]) -> Callable[..., None]:
        """The pre-hook that switches a thread to ``chain`` (one per chain)."""
        switch_to, local = self.ranges.switch, self.local

        def switch(grad_outputs: object) -> None:
            switch_to(chain, getattr(local, "base", None) or 0)

        self.switches[chain] = switch
        return switch


def _nothing() -> None:
    pass


def _pushing(ranges: Ranges, push: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(push)
    def range_push(msg: object, *args: Any, **kwargs: Any) -> Any:
        ranges.push(str(msg) if msg else UNNAMED)
        return push(msg, *args, **kwargs)

    return range_push


def _popping(ranges: Ranges, pop: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(pop)
    def range_pop(*args: Any, **kwargs: Any) -> Any:
        ranges.pop()
        return pop(*args, **kwargs)

    return range_pop


def hook_nvtx(ranges: Ranges, nvtx: Any) -> None:
    """The ``nvtx`` package's nested ranges (see the module docstring)."""
    nvtx.push_range = _pushing(ranges, nvtx.push_range)
    nvtx.pop_range = _popping(ranges, nvtx.pop_range)
    original = nvtx.annotate

    class annotate:  # the name the program knows
        __doc__ = original.__doc__

        def __init__(self, message: str | None = None, *args: Any, **kwargs: Any) -> None:
            self.message = message
            self.inner = original(message, *args, **kwargs)

        def __enter__(self) -> annotate:
            ranges.push(str(self.message or UNNAMED))
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> Any:
            try:
                return self.inner.__exit__(*exc)
            finally:
                ranges.pop()

        def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
            name = str(self.message or getattr(func, "__name__", UNNAMED))
            inner = self.inner(func)

            @functools.wraps(func)
            def annotated(*args: Any, **kwargs: Any) -> Any:
                ranges.push(name)
                try:
                    return inner(*args, **kwargs)
                finally:
                    ranges.pop()

            return annotated

    nvtx.annotate = annotate


__all__ = ["ImportWatcher", "TorchRanges", "hook_nvtx", "install"]

import queue
import threading

from torch.autograd import profiler

_sequence = [0]


class Node:
    """An autograd node: its backward launches ``kernels`` kernels through ``launch``."""

    def __init__(self, launch, kernels, inputs):
        self.sequence_nr = _sequence[0]
        _sequence[0] += 1
        self.launch = launch
        self.kernels = kernels
        self.inputs = [t._node for t in inputs if t._node is not None]
        self.prehooks = []
        self.metadata = {}

    def register_prehook(self, hook):
        self.prehooks.append(hook)

    def run(self):
        for hook in self.prehooks:
            hook(())
        for _ in range(self.kernels):
            self.launch()


class NodeWrapper:
    """What ``tensor.grad_fn`` gives, as PyTorch's C++ nodes do: a Python object made when
    asked for (PyTorch keeps it only while something holds it, then makes another: its id
    says nothing of the node's), its pre-hooks and metadata the node's own."""

    def __init__(self, node):
        self._node = node

    def register_prehook(self, hook):
        self._node.register_prehook(hook)

    @property
    def metadata(self):
        return self._node.metadata


class Tensor:
    def __init__(self, grad_fn=None):
        self._node = grad_fn

    @property
    def grad_fn(self):
        return None if self._node is None else NodeWrapper(self._node)


_work = queue.Queue()
_worker = []


def _serve():
    while True:
        job, done = _work.get()
        job()
        done.set()


def _engine_run_backward(roots, worker=True):
    """Run every node reachable from ``roots``, newest first, on the worker thread (one for
    the process, as autograd's device thread) or the calling thread."""
    (root,) = roots
    seen, nodes, todo = set(), [], [root._node]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        todo.extend(node.inputs)
    nodes.sort(key=lambda node: -node.sequence_nr)

    def run():
        for node in nodes:
            node.run()

    if not worker:
        run()
        return
    if not _worker:
        _worker.append(threading.Thread(target=_serve, name="autograd", daemon=True))
        _worker[0].start()
    done = threading.Event()
    _work.put((run, done))
    done.wait()


def backward(root, worker=True):
    _engine_run_backward((root,), worker)


__all__ = ["Node", "Tensor", "backward", "profiler"]

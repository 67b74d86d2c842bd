"""A stand-in for PyTorch with the few parts ``pyrun --ranges`` hooks (tests without torch).

Modules call the global forward hooks as ``torch.nn.Module.__call__`` does; an operation of a
module launches its forward kernel on the simulated GPU and makes an autograd node that launches
its backward kernels; ``torch.autograd._engine_run_backward`` runs the nodes newest first on a
worker thread (as autograd's device thread does), calling each node's pre-hooks first;
``record_function`` and ``torch.cuda.nvtx`` are plain context managers and functions.
"""

from torch import autograd, cuda, nn

_grad = [True]


def is_grad_enabled():
    return _grad[0]


__all__ = ["autograd", "cuda", "is_grad_enabled", "nn"]

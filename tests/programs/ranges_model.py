"""A model of the PyTorch stand-in (``tests/programs/fake_torch``), trained on the simulated GPU
under ``pyrun --ranges`` (issue #37 item 1).

``ranges_model.py OUT.json [STEPS]``: each step runs ``Net`` (``fc1`` and ``fc2``, Linear: one
forward kernel, two backward kernels each; ``act``, ReLU: one and one; the net's own last
operation: one and one; the loss, outside the net: one and one) forward on the main thread and
backward on a worker thread that lives as long as the process, as autograd's device thread;
then spins on the CPU inside ``record_function("spin")``, inside
``torch.cuda.nvtx.range_push("nvtx spin")`` and outside any range (after a backward run on the
main thread itself). ``OUT`` gets the truth: kernels per module and CPU seconds per range.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch.autograd import Node, Tensor

from pyhpctk.measure.gpu import simulated_runtime

gpu = simulated_runtime()
KERNELS = {"Net": 2, "fc1 (Linear)": 3, "act (ReLU)": 2, "fc2 (Linear)": 3}


class Linear(torch.nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        gpu.launch()
        return Tensor(Node(gpu.launch, 2, [x]))


class ReLU(torch.nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        gpu.launch()
        return Tensor(Node(gpu.launch, 1, [x]))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = Linear()
        self.act = ReLU()
        self.fc2 = Linear()

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc2(self.act(self.fc1(x)))
        gpu.launch()  # the net's own operation
        return Tensor(Node(gpu.launch, 1, [y]))


def cross_entropy(x: Tensor) -> Tensor:
    """The loss, outside any module: one kernel forward, one backward."""
    gpu.launch()
    return Tensor(Node(gpu.launch, 1, [x]))


def spin(seconds: float) -> float:
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass
    return time.thread_time() - began


def main(out: str, steps: int) -> None:
    model = Net()
    spent = {"spin": 0.0, "nvtx spin": 0.0, "outside": 0.0}
    for _ in range(steps):
        loss = cross_entropy(model(Tensor()))
        torch.autograd.backward(loss)
        with torch.autograd.profiler.record_function("spin"):
            spent["spin"] += spin(0.06)
        torch.cuda.nvtx.range_push("nvtx spin")
        spent["nvtx spin"] += spin(0.04)
        torch.cuda.nvtx.range_pop()
        torch.autograd.backward(cross_entropy(model(Tensor())), worker=False)
        spent["outside"] += spin(0.02)
    gpu.synchronize()
    kernels = {name: count * steps for name, count in KERNELS.items()}
    kernels["fc1 (Linear)"] += steps * 3  # the second pass, backward on the main thread
    kernels["fc2 (Linear)"] += steps * 3
    kernels["act (ReLU)"] += steps * 2
    kernels["Net"] += steps * 2
    kernels["outside"] = steps * 4  # the losses, forward and backward
    with open(out, "w") as stream:
        json.dump({"kernels": kernels, "cpu": spent}, stream)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10)

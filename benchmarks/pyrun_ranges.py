"""What ``pyrun --ranges`` costs beside plain pyrun on PyTorch training steps (issue #37 item 1).

    PYTHONPATH=src python3 benchmarks/pyrun_ranges.py
        [--workload cpu|calls|simulated|resnet18|gpt2] [--rounds 7] [--repeat 3] [--steps 10]
        [--probe] [--switch-interval S]

Processes of one machine differ by more than the 3 % this is about (up to 30 % between plain
runs on the device machine), so both configurations run in one process, in one pyrun session
started with ranges (``runtime.start(ranges=True)``, the CPU-time sampler at 200 Hz and, for
the GPU workloads, ``gpu=nvidia``): rounds alternate between *on* (PyTorch's hooks installed:
every module's forward and backward is a range, launch sites carry their ranges) and *off*
(the hooks taken off: no range is ever opened; what is left of ranges then is the engine's time
stamp per sample and one look-up per GPU launch, so *off* is pyrun without ranges within that
much). Each round times ``--repeat`` runs of ``--steps`` training steps per configuration (the
process's CPU time for ``cpu``, wall time on the GPU), best of them, in an order that
alternates; the ratio on / off of each round, and their median, are printed last.
``--probe``: one more line per configuration and round, of what pyrun did meanwhile
(``benchmarks/ranges_probe.py``: threads' CPU, the C hook's counters, the slow path, the
collector, the sizes of the ranges' tables and CCTs); ``--switch-interval S``: the interpreter's
switch interval (``sys.setswitchinterval``) set first, to see what waits for the GIL cost.

Workloads: ``cpu``, a small residual CNN on the CPU (one thread, batch 16 of 64² images, SGD:
about as many module calls per step as ResNet-18, for machines without a GPU); ``resnet18`` and
``gpt2``, the CUDA training steps of ``benchmarks/pyrun_gpu.py``; ``calls``, forward and
backward passes through a chain of 64 tiny Linear modules, which prints the hooks' CPU cost per
module call (what a GPU step pays per module on its launching threads); ``simulated``, the same
chain under ``gpu=simulated`` through the C hook, a kernel launched by each module's forward and
backward, the backward on a thread with no Python frame of the program as autograd's device
thread (pyrun's GPU path without a GPU, timed on the CPU clock).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cpu_steps(steps: int) -> Callable[[], None]:
    """``steps`` training steps of a small residual CNN on the CPU."""
    import torch

    torch.set_num_threads(1)

    class Block(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(width)
            self.relu = torch.nn.ReLU(inplace=True)
            self.conv2 = torch.nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + x)

    class Net(torch.nn.Module):
        def __init__(self, width: int = 16, blocks: int = 8) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, width, 3, padding=1)
            self.layers = torch.nn.Sequential(*(Block(width) for _ in range(blocks)))
            self.fc = torch.nn.Linear(width, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.layers(self.stem(x)).mean((2, 3)))

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 3, 64, 64)
    target = torch.randint(0, 10, (16,))

    def run() -> None:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()

    return run


#: ``calls``: modules of the chain, each called once per forward and backward
CHAIN = 64


def call_steps(steps: int) -> Callable[[], None]:
    """``steps`` forward and backward passes through a chain of :data:`CHAIN` tiny Linear
    modules (4 by 4, batch 1): as little work per module call as there can be, so that the
    difference on / off is the hooks' cost per module call."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(CHAIN)))
    data = torch.randn(1, 4)

    def run() -> None:
        for _ in range(steps):
            model(data).sum().backward()

    return run


#: ``simulated``'s device thread, compiled as pyrun's own code (its frames are looked through):
#: a thread with no frame of the program, as autograd's device thread, that runs each backward
#: pass it is given; the backward's kernels are launched from there too.
DEVICE_CODE = """
def kernel(*grads):
    if launch:
        launch[0]()


def serve(jobs, engine):
    while True:
        job = jobs.get()
        if job is None:
            return
        loss, grad, done = job
        engine.run_backward((loss,), (grad,), False, False, (), True, True)
        done.set()
"""


def simulated_steps(steps: int, launch: list[Callable[[], object]]) -> Callable[[], None]:
    """The passes of :func:`call_steps`, each module's forward and backward launching a kernel
    through ``launch[0]`` (the simulated GPU, once it is there; none before), the backward on a
    thread of its own with no Python frame of the program (:data:`DEVICE_CODE`)."""
    import _thread
    import queue
    import threading

    import torch

    from pyhpctk.measure import ranges

    torch.set_num_threads(1)
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(CHAIN)))
    data = torch.randn(1, 4)
    device: dict[str, Any] = {"launch": launch}
    exec(compile(DEVICE_CODE, ranges.__file__, "exec"), device)
    kernel = device["kernel"]

    def forward(module: object, args: object, output: torch.Tensor) -> None:
        kernel()
        output.register_hook(kernel)

    for layer in model:
        layer.register_forward_hook(forward)
    jobs: queue.Queue[Any] = queue.Queue()
    _thread.start_new_thread(device["serve"], (jobs, torch.autograd.Variable._execution_engine))
    done = threading.Event()

    def run() -> None:
        for _ in range(steps):
            loss = model(data).sum()
            done.clear()
            jobs.put((loss, torch.ones_like(loss), done))
            done.wait()

    return run


def measure(args: argparse.Namespace) -> list[tuple[float, float]]:
    """(best on, best off) of each round of ``args`` (:func:`main`'s options)."""
    workload, rounds, repeat, steps = args.workload, args.rounds, args.repeat, args.steps
    from pyhpctk.measure.launch import runtime

    launch: list[Callable[[], object]] = []  # the simulated GPU's, once started
    if workload in ("cpu", "calls"):
        body = cpu_steps(steps) if workload == "cpu" else call_steps(steps)
        event = None
    elif workload == "simulated":
        body = simulated_steps(steps, launch)
        event = "gpu=simulated,hook=c"
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from pyrun_gpu import _model_steps

        body = _model_steps(workload, steps)
        event = "gpu=nvidia,hook=c"
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    body()  # warm-up: kernels loaded, allocator pools filled
    out = tempfile.mkdtemp(prefix="pyrun-ranges-bench-")
    session = runtime.start(out, gpu_event=event, install_hooks=False, ranges=True)
    if workload == "simulated":
        launch.append(session.gpu.backend.launch)  # type: ignore[union-attr]
    ranges = session.ranges
    assert ranges is not None
    hooks = ranges.hooks
    hooks.uninstall()  # type: ignore[attr-defined]  # installed by start(): each round's own
    import torch

    probe = None
    if args.probe:
        from ranges_probe import Probe

        probe = Probe(session)
        print(f"probe: switch interval {sys.getswitchinterval() * 1e3:.2f} ms", flush=True)

    # The CPU workload is timed on the process's CPU clock (pyrun's drain thread included):
    # other jobs of a shared machine stretch wall time at random. The GPU ones on the wall.
    clock = time.perf_counter if event and event.startswith("gpu=nvidia") else time.process_time

    def timed() -> float:
        best = float("inf")
        for _ in range(repeat):
            began = clock()
            body()
            best = min(best, clock() - began)
        return best

    hooks.install(torch)  # type: ignore[attr-defined]
    if probe is not None:
        probe.begin()
    timed()  # the first sight of each launch site, with ranges (at the rounds' depth: a range
    # is anchored at its frame's depth, and its sites with it)
    if probe is not None:
        print(probe.line("first sight"), flush=True)
    hooks.uninstall()  # type: ignore[attr-defined]
    results = []
    for number in range(rounds):
        times = {}
        for on in (True, False) if number % 2 == 0 else (False, True):
            if on:
                hooks.install(torch)  # type: ignore[attr-defined]
            if probe is not None:
                probe.begin()
            times[on] = timed()
            if probe is not None:
                print(probe.line(f"round {number + 1} {'on' if on else 'off'}"), flush=True)
            if on:
                hooks.uninstall()  # type: ignore[attr-defined]
        results.append((times[True], times[False]))
        print(
            f"round {number + 1}: on {times[True]:.4f} s, off {times[False]:.4f} s, "
            f"ratio {times[True] / times[False]:.3f}",
            flush=True,
        )
    if probe is not None:
        probe.close()
    if session.gpu is not None:
        from pyhpctk.measure.gpu import shutdown

        shutdown(session.gpu)  # type: ignore[arg-type]
    runtime.stop(session)
    shutil.rmtree(out, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workload", choices=("cpu", "calls", "simulated", "resnet18", "gpt2"), default="cpu"
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--probe", action="store_true", help="what pyrun did in each configuration and round"
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        help="sys.setswitchinterval(S) first (how long a thread that wants the GIL may wait)",
    )
    args = parser.parse_args()
    results = measure(args)
    ratios = [on / off for on, off in results]
    print(
        f"{args.workload}: pyrun --ranges / pyrun, {args.steps} steps: median ratio "
        f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f} to {max(ratios):.3f}; "
        f"median on {statistics.median(r[0] for r in results):.4f} s, "
        f"off {statistics.median(r[1] for r in results):.4f} s)"
    )
    if args.workload == "calls":
        extra = statistics.median(on - off for on, off in results) / (args.steps * CHAIN)
        print(f"calls: {extra * 1e6:.1f} us of CPU per module call (forward and backward)")


if __name__ == "__main__":
    main()

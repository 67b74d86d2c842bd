"""Where the CPU cost of ``pyrun --ranges`` goes, piece by piece (issue #37 item 1).

    PYTHONPATH=src python3 benchmarks/ranges_pieces.py [--rounds 7] [--steps 200]

The ``calls`` workload of ``benchmarks/pyrun_ranges.py`` (forward and backward passes through 64
tiny Linear modules, one torch thread) in one pyrun session, timed on the process's CPU clock
(best of 3 per configuration and round, the order reversed every other round) with hooks that do
more and more of what ``--ranges`` does:

- ``global hooks``: PyTorch's global forward pre- and post-hooks, doing nothing (its path for
  them);
- ``+ name, push, pop``: the module's name looked up, its range pushed and popped;
- ``+ nodes hooked``: pyrun's forward hooks whole, but the pre-hook put on each autograd node does
  nothing (the nodes' ``grad_fn``, ``metadata`` and ``register_prehook``, and the backward's
  call of each hooked node's Python pre-hook);
- ``all``: pyrun's hooks, the backward's switch included.

Each line gives the median over rounds of the CPU per module call above the same passes without
hooks. Then pyrun's two forward hooks called directly (no PyTorch module call around them),
and ``Ranges.switch`` alone on a thread with no Python frame below the hook (autograd's
device thread, where the pre-hook holds the GIL), as a backward on the GPU makes it: µs a switch.
The hooks timed here are compiled as pyrun's own code (so their frames are looked through, as
``torch_ranges``' are).
"""

from __future__ import annotations

import _thread
import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from pyrun_ranges import CHAIN, call_steps

#: Code compiled as pyrun's own (its file is one of pyrun's): hooks whose frames are skipped.
OWN_CODE = """
def name_push_pop(ranges, hooks):
    names, name_of = hooks.names, hooks.name_of

    def pre(module, args):
        ranges.push(names.get(module) or name_of(module))

    def post(module, args, output):
        ranges.pop()

    return pre, post


def device(switch, names, count, out, done):
    # a thread's first frame (no frame below it): autograd's device thread calling a hook
    started = time.process_time()
    for _ in range(count):
        switch(names, 0)
    out.append(time.process_time() - started)
    done.set()
"""


def own_code() -> dict[str, Any]:
    from pyhpctk.measure import ranges

    namespace: dict[str, Any] = {"time": time}
    exec(compile(OWN_CODE, ranges.__file__, "exec"), namespace)
    return namespace


def measure(rounds: int, steps: int) -> dict[str, list[float]]:
    """The best CPU time of each configuration, per round."""
    import torch
    from torch.nn.modules import module as nn_module

    from pyhpctk.measure.launch import runtime

    body = call_steps(steps)
    body()
    session = runtime.start(tempfile.mkdtemp(), install_hooks=False, ranges=True)
    ranges: Any = session.ranges
    hooks = ranges.hooks
    hooks.uninstall()
    code = own_code()

    def register(pre: Callable[..., None], post: Callable[..., None]) -> Callable[[], None]:
        handles = (
            nn_module.register_module_forward_pre_hook(pre),
            nn_module.register_module_forward_hook(post, always_call=True),
        )

        def undo() -> None:
            for handle in handles:
                handle.remove()

        return undo

    def no_switch() -> Callable[[], None]:
        made = hooks._switch
        hooks._switch = lambda chain: hooks.switches.setdefault(chain, lambda grads: None)
        hooks.switches.clear()
        hooks.install(torch)

        def undo() -> None:
            hooks.uninstall()
            hooks._switch = made
            hooks.switches.clear()

        return undo

    def pyrun_hooks() -> Callable[[], None]:
        hooks.install(torch)
        return hooks.uninstall  # type: ignore[no-any-return]

    configs: dict[str, Callable[[], Callable[[], None]]] = {
        "off": lambda: lambda: None,
        "global hooks": lambda: register(lambda m, a: None, lambda m, a, o: None),
        "+ name, push, pop": lambda: register(*code["name_push_pop"](ranges, hooks)),
        "+ nodes hooked": no_switch,
        "all": pyrun_hooks,
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    for number in range(rounds):
        order = list(configs) if number % 2 == 0 else list(configs)[::-1]
        for name in order:
            undo = configs[name]()
            best = float("inf")
            for _ in range(3):
                began = time.process_time()
                body()
                best = min(best, time.process_time() - began)
            undo()
            times[name].append(best)
    runtime.stop(session)
    return times


def device_switch(count: int = 50000) -> float:
    """µs per ``Ranges.switch`` on a thread with no frame below the hook (best of 7)."""
    from pyhpctk.measure import ranges as module
    from pyhpctk.measure.cct import FunctionTable

    ranges = module.Ranges(FunctionTable(skip_prefixes=(module.__file__,)), timed=True)
    device = own_code()["device"]
    out: list[float] = []
    for _ in range(7):
        done = threading.Event()
        names = ("Net", "layer1 (Linear)")
        _thread.start_new_thread(device, (ranges.switch, names, count, out, done))
        done.wait()
    return min(out) / count * 1e6


def forward_hooks(count: int = 5000) -> float:
    """µs per call of pyrun's forward pre- and post-hook on a Linear module whose input's node
    was hooked by the module before it and whose output is new (best of 7), called directly."""
    import torch

    from pyhpctk.measure.launch import runtime

    torch.set_num_threads(1)
    session = runtime.start(tempfile.mkdtemp(), install_hooks=False, ranges=True)
    hooks: Any = session.ranges.hooks  # type: ignore[union-attr]
    hooks.uninstall()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    first, second = model[0], model[1]
    data = torch.randn(1, 4, requires_grad=True)
    hooks.name_of(model)
    pre, post = (
        hooks.module_hooks()
        if hasattr(hooks, "module_hooks")
        else (
            hooks.forward_pre,
            hooks.forward_post,
        )
    )
    best = float("inf")
    for _ in range(7):
        inputs = [first(data) for _ in range(count)]
        for tensor in inputs:
            hooks._hook(tensor, ("Sequential", "0 (Linear)"))
        pairs = [(tensor, second(tensor)) for tensor in inputs]
        began = time.process_time()
        for tensor, output in pairs:
            pre(second, (tensor,))
            post(second, (tensor,), output)
        best = min(best, time.process_time() - began)
    runtime.stop(session)
    return best / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    times = measure(args.rounds, args.steps)
    off = statistics.median(times["off"])
    calls = args.steps * CHAIN
    for name, values in times.items():
        extra = [(value - statistics.median(times["off"])) / calls * 1e6 for value in values]
        print(
            f"{name:18s} {statistics.median(values):.4f} s: "
            f"{(statistics.median(values) - off) / calls * 1e6:5.1f} us a module call above off "
            f"(rounds {min(extra):.1f} to {max(extra):.1f})"
        )
    print(f"forward pre- and post-hook, called directly: {forward_hooks():.2f} us a module call")
    print(f"Ranges.switch on a thread of no frames: {device_switch():.2f} us a switch")


if __name__ == "__main__":
    main()

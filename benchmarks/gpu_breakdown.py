"""Per-launch cost of GPU measurement, layer by layer, inside one process (issues #6 and #18).

    PYTHONPATH=src python3 benchmarks/gpu_breakdown.py [--launches 20000] [--repeat 5]
        [--children layers,session,torch,resnet18,gpt2,layers:resnet18] [--times 2]

Separate processes differ by up to 30% on the device machine (plain runs of the same loop); here
each layer is added to the same process in turn, and a workload is timed after each (best of
``--repeat``), in a child process per workload (``layers``: the launch-bound CuPy loop of
``pyrun_gpu.py``; ``layers:resnet18``, ``layers:gpt2``: those models' training steps):

1. ``plain``;
2. ``+activity``: CUPTI's activity kinds on, buffers handed back unread (raw ctypes callbacks):
   what CUPTI itself costs, the floor under any tool built on it;
3. ``+hook``: the C CUPTI hook subscribed, its slow path a constant (no monitor);

then, in a child process each, a whole pyrun session (``gpu=nvidia``, C hook) on the launch
loop (``session``), the MLP (``torch``), ResNet-18 and GPT-2 (the workloads of
``pyrun_gpu.py``): the times, the hook's counters (``slow``: Python entered at a call site;
``unlocked``: operations recorded without the GIL; ``inner``: driver calls inside runtime
calls, not operations), the wall and CPU time spent in reading buffers (``parse``), the
monitor's matching and attribution (``_process``, ``attribute``) and the slow path
(``operation_token``, ``current_context``). Every child runs ``--times`` times.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable


def _loop(cp: object, launches: int) -> float:
    x = cp.ones(256, dtype=cp.float32)  # type: ignore[attr-defined]
    cp.cuda.Device().synchronize()  # type: ignore[attr-defined]
    began = time.perf_counter()
    for _ in range(launches):
        x = x + 1.0
    cp.cuda.Device().synchronize()  # type: ignore[attr-defined]
    return time.perf_counter() - began


def discarding_buffers(lib: ctypes.CDLL) -> tuple[object, object]:
    """Register CUPTI buffer callbacks that hand out zeroed 8 MB blocks and drop them unread
    once complete: what CUPTI costs by itself. Keep the returned callbacks alive."""
    from pyhpctk.measure.gpu.cupti.lib import BUFFER_COMPLETED, BUFFER_REQUESTED

    blocks: dict[int, object] = {}

    def requested(buffer: object, size: object, most: object) -> None:
        block = (ctypes.c_uint8 * (8 << 20))()  # zeroed by ctypes
        blocks[ctypes.addressof(block)] = block
        buffer[0] = ctypes.addressof(block)  # type: ignore[index]
        size[0] = 8 << 20  # type: ignore[index]
        most[0] = 0  # type: ignore[index]

    def completed(context: int, stream: int, buffer: int, size: int, valid: int) -> None:
        blocks.pop(buffer, None)

    keep = (BUFFER_REQUESTED(requested), BUFFER_COMPLETED(completed))
    lib.cuptiActivityRegisterCallbacks(*keep)
    return keep


def layers(launches: int, repeat: int, workload: str = "launch") -> dict[str, float]:
    from cupti import cupti

    from pyhpctk.measure.gpu.cupti.lib import load_hook, loaded_library

    if workload == "launch":
        import cupy as cp

        body = lambda: _loop(cp, launches)  # noqa: E731
    else:
        body = _steps(workload)
    body()
    out = {"plain": min(body() for _ in range(repeat))}
    cupti.get_timestamp()
    lib = ctypes.CDLL(loaded_library("libcupti") or "libcupti.so")
    keep = discarding_buffers(lib)  # noqa: F841 (CUPTI calls them until the process ends)
    kinds = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "MEMORY2")
    for kind in kinds:  # what gpu=nvidia enables
        cupti.activity_enable(getattr(cupti.ActivityKind, kind))
    out["+activity"] = min(body() for _ in range(repeat))
    hook = load_hook()
    if hook is not None:
        entries = [
            (domain, int(m), 1, 0, 0)
            for domain, enum in (
                (int(cupti.CallbackDomain.RUNTIME_API), cupti.RuntimeApiTraceCbid),
                (int(cupti.CallbackDomain.DRIVER_API), cupti.DriverApiTraceCbid),
            )
            for n, m in enum.__members__.items()
            if "Launch" in n and "SIZE" not in n and "INVALID" not in n and int(m) < 4096
        ]
        hook.configure(entries, lambda *a: 0, None, 6, 0xFFFFFFFF)
        out["refused"] = hook.subscribe(loaded_library("libcupti"))
        out["+hook"] = min(body() for _ in range(repeat))
        out["hook_stats"] = hook.stats()  # type: ignore[assignment]
        hook.unsubscribe()
    lib.cuptiActivityFlushAll(1)  # through ctypes: the GIL released (docs/gpu.md, "No hang")
    return out


def _timed(owner: object, name: str, spent: dict[str, float], counts: dict[str, int]) -> None:
    """Wall time, CPU time of the calling thread (``NAME cpu``: the wall time also counts waits
    for the GIL) and number of the calls of ``owner.name``."""
    original = getattr(owner, name)

    def timed(*args: object, **kwargs: object) -> object:
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - began
            spent[name + " cpu"] = spent.get(name + " cpu", 0.0) + time.thread_time() - cpu
            counts[name] = counts.get(name, 0) + 1

    setattr(owner, name, timed)


def _steps(workload: str) -> Callable[[], float]:
    """Seconds of 10 training steps of ``pyrun_gpu.py``'s ResNet-18 or GPT-2, per call."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pyrun_gpu import _model_steps

    steps = _model_steps(workload, 10)

    def body() -> float:
        began = time.perf_counter()
        steps()
        return time.perf_counter() - began

    return body


def _torch_loop(steps: int) -> Callable[[], float]:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)
    ).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(512, 2048, device="cuda")
    target = torch.randint(0, 10, (512,), device="cuda")

    def run() -> float:
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        return time.perf_counter() - began

    return run


def session(launches: int, repeat: int, workload: str = "launch") -> dict[str, object]:
    from pyhpctk.measure.gpu import install, shutdown
    from pyhpctk.measure.gpu.attribution import Attributor
    from pyhpctk.measure.gpu.monitor import GpuMonitor
    from pyhpctk.measure.launch import runtime
    from pyhpctk.measure.session import Session

    spent: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name in ("_process", "operation_token", "_slow_operation"):
        _timed(GpuMonitor, name, spent, counts)
    _timed(Attributor, "attribute", spent, counts)
    _timed(Session, "current_context", spent, counts)
    if workload == "torch":
        body = _torch_loop(50)
    elif workload in ("resnet18", "gpt2"):  # issue #18: the real models of pyrun_gpu.py
        body = _steps(workload)
    else:
        import cupy as cp

        body = lambda: _loop(cp, launches)  # noqa: E731
    body()
    plain = min(body() for _ in range(repeat))
    out = tempfile.mkdtemp(prefix="pyrun-gpu-breakdown-")
    measured = runtime.start(out, install_hooks=False)
    monitor = install(measured, "gpu=nvidia")
    backend = monitor.backend
    reader = backend.buffers  # type: ignore[union-attr]
    parse = reader.parse_raw

    def timed_parse(*args: object) -> object:
        began, cpu = time.perf_counter(), time.thread_time()
        result = parse(*args)
        spent["parse"] = spent.get("parse", 0.0) + time.perf_counter() - began
        spent["parse cpu"] = spent.get("parse cpu", 0.0) + time.thread_time() - cpu
        return result

    reader.parse_raw = timed_parse  # type: ignore[method-assign,assignment]
    times = [body() for _ in range(repeat)]
    native = getattr(backend, "native", None)
    stats = native.stats() if native is not None else {}
    walk = getattr(native, "FRAME_WALK", "")
    began = time.perf_counter()
    gpu = shutdown(monitor)
    runtime.stop(measured)
    return {
        "plain": plain,
        "times": times,
        "ratio": min(times) / plain,
        "shutdown_s": time.perf_counter() - began,
        "hook": stats,
        "spent_s": spent,
        "calls": counts,
        "threads": len(monitor.threads),
        "gpu": gpu.as_dict(),
        "frame_walk": walk,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    children = ("layers", "session", "torch", "resnet18", "gpt2", "layers:resnet18", "layers:gpt2")
    parser.add_argument("--child", choices=children)
    parser.add_argument(
        "--children", default="layers,session,torch", help="what to run, e.g. resnet18,gpt2"
    )
    parser.add_argument("--times", type=int, default=2, help="runs of each child")
    args = parser.parse_args()
    if args.child is not None and args.child.startswith("layers"):
        workload = args.child.partition(":")[2] or "launch"
        print(json.dumps(layers(args.launches, args.repeat, workload)))
        return
    if args.child in ("session", "torch", "resnet18", "gpt2"):
        workload = "launch" if args.child == "session" else args.child
        print(json.dumps(session(args.launches, args.repeat, workload)))
        return
    for child in [c for c in args.children.split(",") if c] * args.times:
        command = [sys.executable, __file__, "--child", child]
        command += ["--launches", str(args.launches), "--repeat", str(args.repeat)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            print(child, "failed: no end after 300 s")
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            print(child, "failed:", done.stderr[-3000:])
            continue
        result = json.loads(lines[-1])
        if child.startswith("layers"):
            plain = result["plain"]
            print(child)
            for name in ("plain", "+activity", "+hook"):
                if name in result:
                    extra = (result[name] - plain) / args.launches * 1e6
                    per = f"  {extra:+.2f} µs/launch" if child == "layers" else ""
                    print(f"{name:10} {result[name]:.4f} s  {result[name] / plain:.3f}x{per}")
            stats = result.get("hook_stats") or {}
            print("hook", stats, "refused", result.get("refused"))
            if "+hook" in result and not (stats.get("fast") or stats.get("slow")):
                print(
                    "  (+hook: no callback reached the hook in this layer: the row measures "
                    "nothing; the session rows below are the hook's real cost)"
                )
        else:
            print(child, json.dumps(result))


if __name__ == "__main__":
    main()

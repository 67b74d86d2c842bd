"""What GPU memory tracking (``-e gpu=...,memory``, issue #37 item 2) costs on the CPU.

    python benchmarks/gpu_memory_cost.py [--allocations 100000] [--depth 30] [--repeat 5]

No GPU: inside a real session, a program ``--depth`` frames deep allocates and frees through
the CuPy hook's own methods (what ``cupy.cuda.MemoryHook`` calls per pool allocation), four
lines in turn (a model's layers); the same loop calling a Python method that does nothing is the
baseline, measured in the same run. Then the work at exit per event: replaying every event
(metrics per site, the timeline) and attributing the sites. Times are the calling thread's CPU
time (``time.thread_time``): on a shared machine wall time mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from pyhpctk.measure.gpu import memory
from pyhpctk.measure.gpu.memory_hooks import CupyPoolEvents
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session


class Nothing:
    def malloc_postprocess(self, **kwargs: int) -> None:
        return None

    def free_postprocess(self, **kwargs: int) -> None:
        return None


def deep(depth: int, body: Callable[[], None]) -> None:
    if depth:
        deep(depth - 1, body)
    else:
        body()


def allocations(hook: CupyPoolEvents | Nothing, count: int) -> Callable[[], None]:
    malloc = hook.malloc_postprocess
    sites = (  # four lines in turn (a model's layers)
        lambda address: malloc(device_id=0, size=512, mem_size=512, mem_ptr=address),
        lambda address: malloc(device_id=0, size=512, mem_size=512, mem_ptr=address),
        lambda address: malloc(device_id=0, size=512, mem_size=512, mem_ptr=address),
        lambda address: malloc(device_id=0, size=512, mem_size=512, mem_ptr=address),
    )

    def body() -> None:
        for i in range(count // 4):
            for line, site in enumerate(sites):
                address = (line << 40) | (i + 1)  # (0 is a failed allocation)
                site(address)
                hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=address)

    return body


def cpu(run: Callable[[], None]) -> float:
    began = time.thread_time()
    run()
    return time.thread_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=100_000)
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        session = Session(MeasureOptions(directory, checkpoint_s=0))
        session.register_thread(threading.current_thread(), main=True)
        kind = session.add_metric_kind(memory.memory_metric_kind())
        count, depth = args.allocations, args.depth
        base, tracked, replays, attributes = [], [], [], []
        for _ in range(args.repeat):
            tracker = memory.MemoryTracker(session, kind)
            hook = CupyPoolEvents(tracker)
            base.append(cpu(lambda: deep(depth, allocations(Nothing(), count))))
            tracked.append(cpu(lambda h=hook: deep(depth, allocations(h, count))))  # type: ignore[misc]
            began = time.thread_time()
            result = tracker.replay()
            replays.append(time.thread_time() - began)
            with session.lock:
                began = time.thread_time()
                tracker.attribute(result)
                attributes.append(time.thread_time() - began)
        events = 2 * count
        per = statistics.median(tracked) / count * 1e6
        baseline = statistics.median(base) / count * 1e6
        print(
            f"{count} allocations and frees, {depth} frames deep, 4 sites, median of {args.repeat}"
        )
        print(f"  baseline (a Python method doing nothing): {baseline:.2f} us an allocation+free")
        print(f"  tracked (CuPy hook, site unwound):        {per:.2f} us ({per / baseline:.1f}x)")
        print(f"  added by tracking:                        {per - baseline:.2f} us")
        print(f"  replay at exit:    {statistics.median(replays) / events * 1e6:.2f} us an event")
        print(f"  attribution:       {statistics.median(attributes) * 1e3:.2f} ms (4 sites)")


if __name__ == "__main__":
    main()

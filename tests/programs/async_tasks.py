"""Asyncio tasks that await each other and time themselves (issue #37, item 4).

``async_tasks.py OUT.json``: the task ``main`` awaits the task ``parent``, which gathers the
tasks ``worker-a`` and ``worker-b``; each worker calls ``crunch`` in short steps, handing the
loop on between them (the two interleave), and counts the CPU time its own steps took. ``OUT``
gets ``{task name: seconds}``: the truth a profile with asyncio-aware stacks must hold under
``<task worker-a>`` and ``<task worker-b>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

WORKERS = {"worker-a": 0.4, "worker-b": 0.8}


def crunch(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += i * i
    return total


async def worker(seconds: float, spent: dict[str, float]) -> None:
    task = asyncio.current_task()
    assert task is not None
    used = 0.0
    while used < seconds:
        began = time.thread_time()
        crunch(100000)  # a few ms: long beside the 1 ms sampling period
        used += time.thread_time() - began
        await asyncio.sleep(0)
    spent[task.get_name()] = used


async def parent(spent: dict[str, float]) -> None:
    workers = [asyncio.create_task(worker(s, spent), name=n) for n, s in WORKERS.items()]
    await asyncio.gather(*workers)


async def main(path: str) -> None:
    task = asyncio.current_task()
    assert task is not None
    task.set_name("main")
    spent: dict[str, float] = {}
    await asyncio.create_task(parent(spent), name="parent")
    with open(path, "w") as stream:
        json.dump(spent, stream)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

"""Six asyncio workers on a queue (issue #36's asyncio program).

Usage: asyncio_workers.py TRUTH.json SCALE

A producer puts SCALE items on a queue; six ``worker`` coroutines take them, parse
(``Parser.parse``), transform (``Transform.apply``) and summarise (``Summary.add``) each, and
yield to the loop between steps, so that the loop resumes them through the asyncio
accelerator's C frames.
"""

import asyncio
import sys

from selftime import clock, dump, spent


class Parser:
    def parse(self, item: int) -> list[int]:
        start = clock()
        out = []
        for _ in range(3):
            out = []
            for i in range(500):
                out.append((item * 7 + i) % 97)
        spent("Parser.parse", start)
        return out


class Transform:
    def apply(self, values: list[int]) -> list[int]:
        start = clock()
        out = []
        for _ in range(2):
            out = []
            for v in values:
                out.append(v * v % 13)
        spent("Transform.apply", start)
        return out


class Summary:
    def __init__(self) -> None:
        self.total = 0

    def add(self, values: list[int]) -> None:
        start = clock()
        for v in values:
            self.total += v
        spent("Summary.add", start)


async def worker(queue: "asyncio.Queue[int]", summary: Summary) -> None:
    parser, transform = Parser(), Transform()
    while True:
        item = await queue.get()
        values = parser.parse(item)
        await asyncio.sleep(0)
        values = transform.apply(values)
        await asyncio.sleep(0)
        summary.add(values)
        queue.task_done()


async def main(scale: int) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    summary = Summary()
    workers = [asyncio.create_task(worker(queue, summary)) for _ in range(6)]
    for item in range(scale):
        await queue.put(item)
    await queue.join()
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[2])))
    dump(sys.argv[1])

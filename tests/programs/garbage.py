"""Makes cyclic garbage over a large live heap, so that garbage collection costs a good share of
the CPU time, and times every collection with ``gc.callbacks`` (issue #36 item 4).

Usage: garbage.py TRUTH.json SCALE

Writes the CPU time spent inside collections (``gc_cpu``: from each "start" to its "stop" on
the collecting thread's CPU clock) and the CPU time of the call of ``main`` (``main_cpu``), in
seconds: the truth the test checks pyview's ``<gc>`` share of ``main`` against.
"""

import gc
import json
import sys
import time

inside = [0.0, 0.0]  # CPU time in collections, and the clock when the current one began


def timing(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        inside[1] = time.thread_time()
    else:
        inside[0] += time.thread_time() - inside[1]


class Node:
    def __init__(self, other: "Node | None" = None) -> None:
        self.other = other
        self.items = [other, self]


def churn(rounds: int) -> int:
    heap = [Node() for _ in range(30000)]  # survives: every older-generation pass walks it
    made = 0
    for i in range(rounds):
        a = Node()
        b = Node(a)  # the allocating line: a cycle each time, freed only by the collector
        a.other = b
        made += len(b.items)
        if i % 64 == 0:
            heap[i % len(heap)] = Node(a)  # the heap keeps changing a little
    return made


def main(truth: str, scale: int) -> None:
    began = time.thread_time()
    gc.callbacks.append(timing)
    gc.set_threshold(2000, 2, 2)
    churn(scale)
    gc.callbacks.remove(timing)
    truths = {"gc_cpu": inside[0], "main_cpu": time.thread_time() - began}
    with open(truth, "w") as out:
        json.dump(truths, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

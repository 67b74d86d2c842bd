"""A small library compiled by mypyc in the tests (issue #36's mypyc program): each method
times its own thread CPU time (``selftime``) around work that calls nothing of Python's."""

from selftime import clock, spent


class Vector:
    def __init__(self, x: float, y: float, z: float) -> None:
        self.x = x
        self.y = y
        self.z = z

    def dot(self, other: "Vector", times: int) -> float:
        start = clock()
        total = 0.0
        for _ in range(times):
            total += self.x * other.x + self.y * other.y + self.z * other.z
        spent("Vector.dot", start)
        return total


class Grid:
    def __init__(self, size: int) -> None:
        self.size = size

    def walk(self, times: int) -> int:
        start = clock()
        count = 0
        for i in range(times):
            count += (i * 7 + self.size) % 13
        spent("Grid.walk", start)
        return count


class Hasher:
    def mix(self, seed: int, times: int) -> int:
        start = clock()
        h = seed
        for i in range(times):
            h = (h * 31 + i) & 0xFFFFFFFF
        spent("Hasher.mix", start)
        return h

"""A pyperf-like benchmark worker around a raytrace-like compute (issue #36's first program).

Usage: raytrace.py TRUTH.json SCALE

pyperf's worker runs the benchmark seven frames below its entry (bench_time_func > _main >
_worker > create_run > compute > run_bench > render), each frame passing all of its time to the
next; the hot code is three methods of three classes, two of them named ``__sub__``.
"""

import sys

from selftime import clock, dump, spent

WIDTH = 200


class Vector:
    def __init__(self, parts: list[float]) -> None:
        self.parts = parts

    def __sub__(self, other: "Vector") -> "Vector":
        start = clock()
        out = []
        for _ in range(2):
            out = []
            for a, b in zip(self.parts, other.parts, strict=True):
                out.append(a - b)
        spent("Vector.__sub__", start)
        return Vector(out)


class Point:
    def __init__(self, parts: list[float]) -> None:
        self.parts = parts

    def __sub__(self, other: "Point") -> Vector:
        start = clock()
        out = [0.0] * len(self.parts)
        for _ in range(2):
            for i, a in enumerate(self.parts):
                out[i] = a - other.parts[i]
        spent("Point.__sub__", start)
        return Vector(out)


class Sphere:
    def __init__(self, centre: Point, radius: float) -> None:
        self.centre = centre
        self.radius = radius

    def intersect(self, origin: Point, direction: Vector) -> float:
        start = clock()
        total = 0.0
        for a, b, c in zip(origin.parts, direction.parts, self.centre.parts, strict=True):
            total += (a - c) * b
        spent("Sphere.intersect", start)
        return total


def trace_ray(scene: list[Sphere], eye: Point, pixel: Point, ahead: Vector) -> float:
    direction = (pixel - eye) - ahead
    return max(sphere.intersect(eye, direction) for sphere in scene)


def render(scale: int) -> float:
    parts = [float(i % 7) for i in range(WIDTH)]
    eye, ahead = Point(parts), Vector(parts[::-1])
    scene = [Sphere(Point([p + k for p in parts]), 1.0) for k in range(2)]
    pixels = [Point([p + y for p in parts]) for y in range(8)]
    best = 0.0
    for y in range(scale):
        best = max(best, trace_ray(scene, eye, pixels[y % 8], ahead))
    return best


def run_bench(scale: int) -> float:
    return render(scale)


def compute(scale: int) -> float:
    return run_bench(scale)


def create_run(scale: int) -> float:
    return compute(scale)


def _worker(scale: int) -> float:
    return create_run(scale)


def _main(scale: int) -> float:
    return _worker(scale)


def bench_time_func(scale: int) -> float:
    return _main(scale)


if __name__ == "__main__":
    bench_time_func(int(sys.argv[2]))
    dump(sys.argv[1])

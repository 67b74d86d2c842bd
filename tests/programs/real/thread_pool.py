"""A ThreadPoolExecutor of hashing, encoding and checking (issue #36's thread pool).

Usage: thread_pool.py TRUTH.json SCALE

Three workers take jobs; each job hashes (``Hasher.digest``), encodes (``Encoder.encode``) and
checks (``Checker.verify``) a record, in pure Python so that each thread's CPU clock sees it.
"""

import sys
from concurrent.futures import ThreadPoolExecutor

from selftime import clock, dump, spent


class Hasher:
    def digest(self, data: list[int]) -> int:
        start = clock()
        h = 2166136261
        for _ in range(3):
            for b in data:
                h = ((h ^ (b & 255)) * 16777619) & 0xFFFFFFFF
        spent("Hasher.digest", start)
        return h


class Encoder:
    def encode(self, data: list[int]) -> str:
        start = clock()
        out = []
        for _ in range(2):
            out = []
            for b in data:
                out.append(str(b))
        spent("Encoder.encode", start)
        return ",".join(out)


class Checker:
    def verify(self, data: list[int]) -> bool:
        start = clock()
        total = 0
        for _ in range(3):
            for b in data:
                total += b & 7
        spent("Checker.verify", start)
        return total >= 0


def job(seed: int) -> int:
    data = list(range(seed % 251, seed % 251 + 600))
    h = Hasher().digest(data)
    Encoder().encode(data)
    Checker().verify(data)
    return h


def main(scale: int) -> None:
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(job, range(scale)))


if __name__ == "__main__":
    main(int(sys.argv[2]))
    dump(sys.argv[1])

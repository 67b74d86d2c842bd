"""Symbolic algebra in sympy (issue #36's sympy program).

Usage: sympy_work.py TRUTH.json SCALE

Expands, differentiates and simplifies polynomials and rational functions SCALE times, with
sympy's cache cleared each round so the work is done again. The hot functions are sympy's
(its own timing cannot see them): the tests read the top ones from an independent sampler.
"""

import json
import sys
import time

import sympy
from sympy.core.cache import clear_cache


def rounds(scale: int) -> int:
    x, y, z = sympy.symbols("x y z")
    done = 0
    for i in range(scale):
        clear_cache()
        p = sympy.expand((x + y + z + i) ** 6)
        q = sympy.diff(p, x, 2) + sympy.diff(p, y)
        r = sympy.cancel((q * (x - y)) / (x - y))
        done += len(r.args)
    return done


def main(truth: str, scale: int) -> None:
    start = time.process_time()
    terms = rounds(scale)
    with open(truth, "w") as out:
        json.dump({"terms": terms, "cpu": time.process_time() - start}, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

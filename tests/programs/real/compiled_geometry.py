"""Runs the mypyc-compiled ``geometry`` library (issue #36's mypyc program).

Usage: compiled_geometry.py TRUTH.json SCALE

The library's three methods are called with work in the proportions 4 : 2 : 1 (``Vector.dot``,
``Grid.walk``, ``Hasher.mix``); each measures its own CPU time. The truth file says whether the
module imported was the compiled one (``TRUTH.json.module``).
"""

import json
import sys

import geometry
from selftime import SELF, dump


def main(truth: str, scale: int) -> None:
    vector, grid, hasher = geometry.Vector(1.0, 2.0, 3.0), geometry.Grid(5), geometry.Hasher()
    for round_ in range(20):
        vector.dot(vector, scale // 5)
        grid.walk(scale // 10)
        hasher.mix(round_, scale // 20)
    assert set(SELF) == {"Vector.dot", "Grid.walk", "Hasher.mix"}
    dump(truth)
    with open(truth + ".module", "w") as stream:
        json.dump({"file": geometry.__file__}, stream)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""Benchmark: ``pystruct MEAS`` on the native libraries of a numpy measurement (issue #17).

A measurement directory is written by hand (the engine's native frames are not needed): one
profile whose load module table names numpy's OpenBLAS and its ``_multiarray_umath`` extension
by their real paths, with ``(lm, offset)`` nodes at ``--functions`` addresses spread over the
functions whose names contain ``gemm`` (OpenBLAS) or ``matmul`` (numpy) — where a matrix
product spends its time. In the same run, wall time of the command:

- ``--functions all --no-cache``: every procedure of both libraries (the full analysis);
- ``--functions auto`` with an empty cache: the default (sampled procedures of large binaries);
- the same again on a copy of the measurement without ``structs/``: served by the cache.

Ratios are against the full analysis. Outputs and the cache live in a temporary directory that is
removed at the end; this script never writes into the repository or the user's cache. Example::

    .venv/bin/python benchmarks/pystruct_meas.py
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _libraries() -> list[tuple[Path, str]]:
    import numpy

    root = Path(numpy.__file__).parent
    blas = sorted((root.parent / "numpy.libs").glob("libscipy_openblas*.so"))
    core = sorted(root.glob("_core/_multiarray_umath*.so"))
    if not blas or not core:
        raise SystemExit("numpy's OpenBLAS or _multiarray_umath not found beside numpy")
    return [(blas[0], "gemm"), (core[0], "matmul")]


def _addresses(library: Path, word: str, count: int) -> list[int]:
    from pyhpctk.structure.elfimage import open_image

    functions = [f for f in open_image(library).functions if word in f.link_name]
    step = max(1, len(functions) // count)
    return [f.start + (f.end - f.start) // 2 for f in functions[::step][:count]]


def _write(meas: Path, chosen: list[tuple[Path, list[int]]]) -> None:
    from pyhpctk.measure.cct import MetricKind, MetricSpec, NodeIdAllocator, ThreadCCT
    from pyhpctk.measure.encode import ProfileIdentity, encode_profile

    meas.mkdir(parents=True)
    kind = MetricKind("cpu", (MetricSpec("CPUTIME (sec)"),), base=0)
    cct = ThreadCCT(NodeIdAllocator(), main=True)
    modules = []
    for lm_id, (library, addresses) in enumerate(chosen, 1):
        modules.append((lm_id, str(library), 1))
        for address in addresses:
            cct.add(kind, cct.child(cct.fence, lm_id, address), 0, 0.005)
    identity = ProfileIdentity("python", sys.executable, "", "", None, 0, 1, 1)
    profile = encode_profile(cct, identity, modules, [kind])
    (meas / "python-000000-000-00000001-1-0.hpcrun").write_bytes(profile)


def _run(arguments: list[str], cache: Path) -> float:
    command = [sys.executable, "-m", "pyhpctk.cli.pystruct", "-q", *arguments]
    environment = dict(os.environ, PYHPCTK_CACHE_DIR=str(cache))
    start = time.perf_counter()
    subprocess.run(command, check=True, env=environment)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=20, help="sampled functions per library")
    args = parser.parse_args(argv)
    chosen = [(lib, _addresses(lib, word, args.functions)) for lib, word in _libraries()]
    print(f"# {platform.node()} {platform.machine()} cores={os.cpu_count()}")
    for library, addresses in chosen:
        size = library.stat().st_size / 2**20
        print(f"# {library.name}: {size:.1f} MB, {len(addresses)} sampled addresses")
    with tempfile.TemporaryDirectory(prefix="pystruct-meas-") as tmp:
        work = Path(tmp)
        _write(work / "meas", chosen)
        full = _run(["--functions", "all", "--no-cache", str(work / "meas")], work / "unused")
        shutil.rmtree(work / "meas" / "structs")
        cold = _run([str(work / "meas")], work / "cache")
        shutil.copytree(work / "meas", work / "again", ignore=shutil.ignore_patterns("structs"))
        warm = _run([str(work / "again")], work / "cache")
    print("| run | wall s | ratio to full |")
    print("| --- | --- | --- |")
    for name, seconds in (
        ("--functions all --no-cache (full)", full),
        ("default, empty cache (sampled)", cold),
        ("default, second measurement (cache)", warm),
    ):
        print(f"| {name} | {seconds:.2f} | {seconds / full:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

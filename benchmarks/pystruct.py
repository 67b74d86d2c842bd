"""Benchmark: pystruct on large shared libraries of this machine, against ``objdump -d -l``.

For each library (default: libpython and libcrypto from the system, and numpy's core extension),
in the same run:

- ``pystruct -j 1 LIB -o TMP --force`` and ``pystruct -j 2 LIB -o TMP --force`` (wall time of
  the command, so start-up, ELF/DWARF reading, disassembly, CFGs, loops and XML writing all count);
- ``objdump -d -l LIB > /dev/null`` (disassembly with line numbers: the closest standard tool).

Each pystruct time is printed with its ratio to objdump. Every run is repeated ``--repeat`` times
and the best time kept. Outputs go to a temporary directory that is removed at the end; this
script never writes into the repository. Example::

    .venv/bin/python benchmarks/pystruct.py --repeat 1
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


def _candidates() -> list[Path]:
    found: list[Path] = []
    for pattern in ("libpython3*.so.1.0", "libcrypto.so.3"):
        for base in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
            hits = sorted(Path(base).glob(pattern))
            if hits:
                found.append(hits[0].resolve())
                break
    try:
        import numpy

        core = sorted(Path(numpy.__file__).parent.glob("_core/_multiarray_umath*.so"))
        if core:
            found.append(core[0])
    except ImportError:
        pass
    return found


def _best(command: list[str], repeat: int, stdout: int | None = None) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=stdout, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="*", type=Path, help="default: libpython, libcrypto")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--pystruct", default=str(Path(sys.executable).parent / "pystruct"))
    args = parser.parse_args(argv)
    libraries = args.libraries or _candidates()
    objdump = shutil.which("objdump")
    if objdump is None:
        print("objdump not found", file=sys.stderr)
        return 2
    print(
        f"# {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    print("| library | size | objdump -d -l | pystruct -j 1 | ratio | pystruct -j 2 | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="pystruct-bench-") as tmp:
        for lib in libraries:
            size = lib.stat().st_size / 1e6
            t_obj = _best([objdump, "-d", "-l", str(lib)], args.repeat, subprocess.DEVNULL)
            out = Path(tmp) / f"{lib.name}.hpcstruct"
            t1 = _best(
                [args.pystruct, "-q", "--force", "-j", "1", str(lib), "-o", str(out)], args.repeat
            )
            t2 = _best(
                [args.pystruct, "-q", "--force", "-j", "2", str(lib), "-o", str(out)], args.repeat
            )
            print(
                f"| {lib.name} | {size:.1f} MB | {t_obj:.2f} s | {t1:.2f} s | "
                f"{t1 / t_obj:.1f}x | {t2:.2f} s | {t2 / t_obj:.1f}x |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

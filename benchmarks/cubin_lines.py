"""What reading a captured cubin's lines costs pyprof, whole and for the launched kernels only.

    python3 benchmarks/cubin_lines.py [--kernels 1500] [--launched 3] [--repeat 3]

A framework's cubin holds thousands of kernels and a run launches a few (PyTorch's 27 cubins of
one device measurement took pyprof 100 s to read whole). This compiles a cubin of ``--kernels``
small kernels with a data-dependent loop each (``nvcc -cubin -arch=sm_90 -lineinfo``, the
nvidia-cuda-nvcc wheel; about 30 s), then times pyprof's line-map structure of it
(:func:`pyhpctk.analysis.structures.line_map_structure`) whole and for ``--launched`` kernels'
entries, best of ``--repeat``, in one process, and prints the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL = """template <int K> __global__ void k(const float *a, float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0.0f;
  for (int j = 0; j < (i % (K + 3)); ++j) s += a[(i + j * K) % n] * (float)K;
  if (i < n) b[i] = s;
}
"""


def nvcc() -> tuple[str, str]:
    """The nvcc of the nvidia-cuda-nvcc wheel (or on PATH) and its include directory."""
    try:
        import nvidia.cu13 as wheel  # the CUDA 13 wheels' namespace

        root = Path(next(iter(wheel.__path__)))
        return str(root / "bin" / "nvcc"), str(root / "include")
    except (ImportError, StopIteration):
        found = shutil.which("nvcc")
        if found is None:
            sys.exit("cubin_lines: no nvcc (pip install nvidia-cuda-nvcc)")
        return found, str(Path(found).parent.parent / "include")


def build(kernels: int, where: Path) -> Path:
    source = where / "big.cu"
    body = KERNEL + "".join(
        f"template __global__ void k<{i}>(const float*, float*, int);\n" for i in range(kernels)
    )
    source.write_text(body)
    compiler, include = nvcc()
    out = where / "big.cubin"
    env = dict(os.environ, PATH=f"{Path(compiler).parent}{os.pathsep}{os.environ['PATH']}")
    command = [compiler, "-cubin", "-arch=sm_90", "-lineinfo", f"-I{include}", "-o", str(out)]
    subprocess.run([*command, str(source)], check=True, env=env)
    return out


def best(repeat: int, body: object) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        body()  # type: ignore[operator]
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1500)
    parser.add_argument("--launched", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from pyhpctk.analysis.structures import line_map_structure
    from pyhpctk.structure.elfimage import open_image

    with tempfile.TemporaryDirectory() as scratch:
        began = time.perf_counter()
        cubin = build(args.kernels, Path(scratch))
        print(f"cubin: {cubin.stat().st_size} bytes, {args.kernels} kernels, "
              f"compiled in {time.perf_counter() - began:.1f} s")  # fmt: skip
        entries = [f.start for f in open_image(cubin).functions[: args.launched]]
        module = "gpubins/big.gpubin"
        whole = best(args.repeat, lambda: line_map_structure(cubin, module))
        named = best(args.repeat, lambda: line_map_structure(cubin, module, entries))
    print(f"whole cubin: {whole:.2f} s; {args.launched} launched kernels: {named:.2f} s; "
          f"ratio {whole / named:.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

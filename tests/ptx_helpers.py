"""The PTX fixtures of tests/data/ptx (issue #34) and what their sources say about them."""

from __future__ import annotations

import re
from pathlib import Path

PTX_DIR = Path(__file__).resolve().parent / "data" / "ptx"
CUDA_SOURCE = PTX_DIR / "kernels.cu"
NVCC_PTX = PTX_DIR / "kernels_sm80.ptx"
SHAPES_PTX = PTX_DIR / "shapes.ptx"
TRITON_KERNELS = ("stencil", "reduce", "matmul", "bfs", "wavefront", "histogram", "softmax")


def triton_ptx(name: str) -> Path:
    return PTX_DIR / f"triton_{name}_sm90.ptx"


def source_lines(path: Path, pattern: str) -> list[int]:
    """1-based numbers of the lines of ``path`` matching the regular expression ``pattern``."""
    text = path.read_text(encoding="utf-8").splitlines()
    return [i for i, line in enumerate(text, 1) if re.search(pattern, line)]


def cuda_kernel_names() -> list[str]:
    return re.findall(r"__global__ void (\w+)\(", CUDA_SOURCE.read_text(encoding="utf-8"))


def cuda_kernel_span(name: str) -> range:
    """The lines of kernels.cu from ``name``'s signature to the line before the next kernel."""
    starts = source_lines(CUDA_SOURCE, r"__global__ void \w+\(")
    mine = source_lines(CUDA_SOURCE, rf"__global__ void {name}\(")[0]
    later = [s for s in starts if s > mine]
    return range(mine, later[0] if later else 10**6)


def cupy_ptx(source: str) -> str:
    """CUDA C ``source`` compiled by CuPy's NVRTC for sm_90 (no GPU needed); skips without CuPy."""
    import pytest

    compiler = pytest.importorskip("cupy.cuda.compiler", reason="CuPy and NVRTC compile the set")
    from cupy.cuda import nvrtc

    program = compiler._NVRTCProgram(source, "set.cu", method="cubin")
    program.compile(("-arch=sm_90", "-lineinfo"))
    return bytes(nvrtc.getPTX(program.ptr)).decode().rstrip("\0")

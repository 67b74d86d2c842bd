"""Record the PTX fixtures of the PTX pass's tests (issue #34); run from anywhere:

    .venv/bin/python tests/data/ptx/make_fixtures.py

- kernels_sm80.ptx: kernels.cu through nvcc -ptx -lineinfo -arch=sm_80 (the nvidia-cuda-nvcc
  wheel's nvcc; it needs a host C++ compiler for its preprocessor, no GPU);
- triton_<name>_sm90.ptx: each kernel of triton_kernels.py compiled by Triton for
  GPUTarget("cuda", 90, 32), no GPU; triton_checked_sm90.ptx with debug=True (an assertion, a
  printf and a .func kept apart).
Absolute paths in .file directives are cut to paths relative to the repository (or to
site-packages), so the fixtures do not depend on where they were made. shapes.ptx is written
by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _portable(ptx: str) -> str:
    site = sysconfig.get_paths()["purelib"]
    return ptx.replace(site + "/", "site-packages/").replace(str(ROOT) + "/", "")


def record_nvcc() -> None:
    import nvidia

    nvcc = next(Path(p) for p in nvidia.__path__ if (Path(p) / "cu13/bin/nvcc").exists())
    nvcc = nvcc / "cu13/bin/nvcc"
    out = HERE / "kernels_sm80.ptx"
    subprocess.run(
        [str(nvcc), "-ptx", "-arch=sm_80", "-lineinfo", "-o", str(out), str(HERE / "kernels.cu")],
        check=True, cwd=ROOT,
    )  # fmt: skip
    out.write_text(_portable(out.read_text()))


def record_triton() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.path.insert(0, str(HERE))
    import triton
    import triton_kernels

    for name in triton_kernels.KERNELS:
        ptx = triton_kernels.compile_ptx(name, 90)
        (HERE / f"triton_{name}_sm90.ptx").write_text(_portable(ptx))
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constants = triton_kernels.CHECKED
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"debug": True})
    (HERE / "triton_checked_sm90.ptx").write_text(_portable(compiled.asm["ptx"]))


if __name__ == "__main__":
    record_nvcc()
    record_triton()

"""``ptxas``: find it and assemble PTX into a cubin, with each kernel's register count.

The assembler comes from the ``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin/ptxas``, the ``dev``
extra installs it) or from ``PATH``. Nothing here runs on a GPU.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pyhpctk.errors import PyhpctkError

_USED = re.compile(r"Compiling entry function '([^']+)'.*?Used (\d+) registers", re.DOTALL)


class AssemblerError(PyhpctkError):
    """ptxas is missing or refused the PTX; the message holds its first error line."""

    exit_code = 2


@dataclass(frozen=True)
class Assembled:
    cubin: bytes
    registers: dict[str, int]  # kernel -> registers per thread, as `ptxas -v` reports
    log: str


def find_ptxas() -> Path | None:
    """The ptxas of the nvidia-cuda-nvcc wheel, else the first on PATH, else None."""
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations or [] if spec else []:
        for candidate in sorted(Path(root).glob("cu*/bin/ptxas"), reverse=True):
            if candidate.is_file():
                return candidate
    found = shutil.which("ptxas")
    return Path(found) if found else None


def assemble(ptx: str, arch: str, ptxas: Path | None = None, timeout: float = 120.0) -> Assembled:
    """Assemble ``ptx`` for ``arch`` (``sm_90``, ``sm_90a``, ``sm_80``)."""
    tool = ptxas or find_ptxas()
    if tool is None:
        raise AssemblerError("ptxas not found: install nvidia-cuda-nvcc (pip) or put it on PATH")
    with tempfile.TemporaryDirectory(prefix="pyhpctk-ptxas-") as tmp:
        source, cubin = Path(tmp) / "in.ptx", Path(tmp) / "out.cubin"
        source.write_text(ptx, encoding="utf-8")
        run = subprocess.run(
            [str(tool), "-v", f"-arch={arch}", "-o", str(cubin), str(source)],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        log = run.stdout + run.stderr
        if run.returncode != 0:
            log = log.replace(f"ptxas {source}, ", "")
            first = next((ln for ln in log.splitlines() if "error" in ln.lower()), log.strip())
            raise AssemblerError(f"ptxas -arch={arch} failed ({run.returncode}): {first[:300]}")
        registers = {m.group(1): int(m.group(2)) for m in _USED.finditer(log)}
        return Assembled(cubin.read_bytes(), registers, log)

"""What GPU tests without a GPU share: libcupti's stand-in (``tests/data/gpu/fake_cupti.c``)."""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

FAKE_CUPTI = Path(__file__).parent / "data" / "gpu" / "fake_cupti.c"


def build_fake_cupti(directory: Path) -> Path:
    """``libcupti_fake.so`` compiled into ``directory`` (the C compiler that built Python)."""
    out = directory / "libcupti_fake.so"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    command = [compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(FAKE_CUPTI)]
    subprocess.run([*command, "-lpthread", "-ldl"], check=True)
    return out


#: A program that launches ``{launches}`` kernels through the simulated runtime, each from the
#: function ``step`` (format it with ``launches=N``), then synchronizes.
SIMULATED_LAUNCHES = """
from pyhpctk.measure.gpu import simulated_runtime

gpu = simulated_runtime()


def step():
    gpu.launch()


for _ in range({launches}):
    step()
gpu.synchronize()
"""

"""Launch N kernels on pyrun's simulated GPU, then end in the way argv[1] says.

Usage (under ``pyrun -e gpu=simulated``): gpu_ending.py exception|exit|sigterm|os_exit N
"""

import os
import signal
import sys
import time

from pyhpctk.measure.gpu import simulated_runtime


def launches(gpu: object, count: int) -> None:
    for _ in range(count):
        gpu.launch()  # type: ignore[attr-defined]


def main() -> None:
    how, count = sys.argv[1], int(sys.argv[2])
    launches(simulated_runtime(), count)
    if how == "exception":
        raise RuntimeError("the program failed")
    if how == "exit":
        sys.exit(3)
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    if how == "os_exit":
        os._exit(5)


main()

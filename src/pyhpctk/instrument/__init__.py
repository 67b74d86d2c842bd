"""Instrumentation of GPU kernels before they reach the driver (issue #34).

``ptx`` parses PTX, recovers its control flow, loops and source lines, and inserts counting
probes; ``frameworks`` hooks Triton, CuPy and Numba-CUDA where their kernels are PTX, hands it
to ``ptx`` and finds the counters of the modules they load (each framework imported only when
its hook is installed). Nothing here measures or analyzes: it only reads and writes kernel code,
so pyrun's GPU backends and the tests can both reach it. It depends on numpy, the standard
library and ``pyhpctk.errors`` alone, never on measure/ or analysis/.
"""

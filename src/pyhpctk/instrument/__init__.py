"""Instrumentation of GPU kernels before they reach the driver (issue #34).

Each sub-package rewrites one kind of kernel code: ``ptx`` parses PTX, recovers its control flow,
loops and source lines, and inserts counting probes. Nothing here measures or analyzes: it only
reads and writes kernel code, so pyrun's GPU backends and the tests can both reach it. It depends
on numpy, the standard library and ``pyhpctk.errors`` alone, never on measure/ or analysis/.
"""

"""Triton kernels whose block counts the CI tests derive from their inputs (issue #34, item 3).

``trips``: program ``p`` runs a loop ``row[p + 1] - row[p]`` times (a data-dependent trip
count, as BFS's loop over a vertex's neighbours); ``compile_counted(name)`` compiles one for
``sm_90`` without a GPU. The divergent-branch kernel is ``reduce`` of ``triton_kernels.py``
(even programs sum, odd ones take the maximum).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def trips(row_ptr, x_ptr, y_ptr):
    p = tl.program_id(0)
    e = tl.load(row_ptr + p)
    end = tl.load(row_ptr + p + 1)
    acc = 0
    while e < end:  # row[p + 1] - row[p] times
        acc += tl.load(x_ptr + e)
        e += 1
    tl.store(y_ptr + p, acc)


SIGNATURES = {"trips": (trips, {"row_ptr": "*i32", "x_ptr": "*i32", "y_ptr": "*i32"}, {})}


def compile_counted(name: str, capability: int = 90) -> str:
    """The PTX Triton makes of kernel ``name`` for ``sm_<capability>``, with no GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constants = SIGNATURES[name]
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    return str(triton.compile(source, target=GPUTarget("cuda", capability, 32)).asm["ptx"])

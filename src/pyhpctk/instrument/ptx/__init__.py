"""A PTX instrumentation pass: PTX parsed into kernels and blocks, control flow, loops and source
lines recovered, counting probes inserted, the result assembled with ``ptxas`` (issue #34).

Modules, bottom up: ``parse`` (text → statements), ``cfg`` (blocks and edges), ``loops``
(dominators, natural loops), ``lines`` (``.loc``/``.file``), ``probes`` (the spanning tree and
where counters go), ``rewrite`` (the instrumented PTX), ``counts`` (counters → every block's and
edge's count), ``assemble`` (ptxas). docs/gpu.md describes the pass and its limits.
"""

from pyhpctk.instrument.ptx.assemble import Assembled, AssemblerError, assemble, find_ptxas
from pyhpctk.instrument.ptx.cfg import Cfg, EdgeKind, PtxBlock, PtxEdge, build
from pyhpctk.instrument.ptx.counts import Counts, derive
from pyhpctk.instrument.ptx.errors import PtxError
from pyhpctk.instrument.ptx.lines import Location, block_lines
from pyhpctk.instrument.ptx.loops import Loops, PtxLoop, find_loops
from pyhpctk.instrument.ptx.parse import PtxFunction, PtxModule, parse
from pyhpctk.instrument.ptx.probes import Mode, ProbePlan, make_plan
from pyhpctk.instrument.ptx.rewrite import Buffer, Instrumented, instrument

__all__ = [
    "Assembled",
    "AssemblerError",
    "Buffer",
    "Cfg",
    "Counts",
    "EdgeKind",
    "Instrumented",
    "Location",
    "Loops",
    "Mode",
    "ProbePlan",
    "PtxBlock",
    "PtxEdge",
    "PtxError",
    "PtxFunction",
    "PtxLoop",
    "PtxModule",
    "assemble",
    "block_lines",
    "build",
    "derive",
    "find_loops",
    "find_ptxas",
    "instrument",
    "make_plan",
    "parse",
]

"""A PTX instrumentation pass: PTX parsed into kernels and blocks, control flow, loops and source
lines recovered, counting probes inserted, the result assembled with ``ptxas`` (issue #34).

Modules, bottom up: ``parse`` (text → statements), ``cfg`` (blocks and edges), ``loops``
(dominators, natural loops), ``lines`` (``.loc``/``.file``), ``probes`` (the spanning tree and
where counters go), ``rewrite`` (the instrumented PTX), ``counts`` (counters → every block's and
edge's count), ``assemble`` (ptxas); for traces, ``sites`` (where events are recorded) and
``traces`` (the tracing probes, their control block and event layout). docs/gpu.md describes
the pass and its limits.
"""

from pyhpctk.instrument.ptx.assemble import Assembled, AssemblerError, assemble, find_ptxas
from pyhpctk.instrument.ptx.cfg import Cfg, EdgeKind, PtxBlock, PtxEdge, build
from pyhpctk.instrument.ptx.counts import Counts, derive
from pyhpctk.instrument.ptx.errors import PtxError
from pyhpctk.instrument.ptx.lines import Location, block_lines
from pyhpctk.instrument.ptx.loops import Loops, PtxLoop, find_loops
from pyhpctk.instrument.ptx.parse import PtxFunction, PtxModule, parse
from pyhpctk.instrument.ptx.probes import Mode, ProbePlan, make_plan
from pyhpctk.instrument.ptx.rewrite import REPLICAS, Buffer, Instrumented, instrument
from pyhpctk.instrument.ptx.sites import SiteKind, Sites, TraceSite, line_filter
from pyhpctk.instrument.ptx.traces import (
    CONTROL,
    EVENT_DTYPE,
    Strategy,
    TracedModule,
    TracePlan,
    instrument_traces,
)

__all__ = [
    "CONTROL",
    "EVENT_DTYPE",
    "REPLICAS",
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
    "SiteKind",
    "Sites",
    "Strategy",
    "TracePlan",
    "TraceSite",
    "TracedModule",
    "assemble",
    "block_lines",
    "build",
    "derive",
    "find_loops",
    "find_ptxas",
    "instrument",
    "instrument_traces",
    "line_filter",
    "make_plan",
    "parse",
]

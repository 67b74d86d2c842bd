"""``gpu=nvidia``: the CUPTI backend's room (no numpy, no CUPTI until a backend is made).

:mod:`.backend` (the backend: start and stop in order) owns a :mod:`.callbacks` subscriber, a
:mod:`.buffers` reader and a :mod:`.fine` part (:mod:`.pcsampling`, :mod:`.sassmetrics`);
:mod:`.records` converts activity records to rows; :mod:`.lib` finds libcupti and the C hook
(``_cuptihook*.c``). This module is the row of :data:`~pyhpctk.measure.gpu.spec.BACKENDS`:
:func:`check` and :func:`make`.
"""

from __future__ import annotations

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu import options

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.backend import Backend
    from pyhpctk.measure.gpu.cupti.blocks import BlockReader
    from pyhpctk.measure.gpu.spec import GpuSpec


def _modes(spec: GpuSpec) -> tuple[str, str]:
    """``records=raw|objects`` and ``pcmode=serialized|continuous``."""
    records = spec.option("records", "raw")
    pc_mode = spec.option("pcmode", "serialized")
    if pc_mode not in ("serialized", "continuous"):
        raise UsageError(f"gpu=nvidia: pcmode={pc_mode!r}: say serialized or continuous")
    if records not in ("raw", "objects"):
        raise UsageError(f"gpu=nvidia: records={records!r}: say records=raw or records=objects")
    return records, pc_mode


def check(spec: GpuSpec) -> None:
    """Refuse bad option values now (nothing loaded)."""
    options.check_common(spec)
    _modes(spec)
    _tracing(spec)


def _tracing(spec: GpuSpec) -> tuple[str, int] | None:
    """``trace[=chunks][,tracebytes=N]``: alone (it instruments the kernels blocks would count,
    and pc or inst would read the traced kernels' SASS); ``trace=exact`` refused in one line."""
    from pyhpctk.measure.gpu.warp_options import trace_option

    traced = trace_option(spec)
    if traced is None:
        return None
    keys = {key for key, _ in spec.options}
    for other in ("blocks", "pc", "inst"):
        if other in keys:
            raise UsageError(f"gpu=nvidia: trace and {other} exclude each other (one per run)")
    if traced[0] == "exact":
        from pyhpctk.measure.gpu.cupti.warp_reader import EXACT_REFUSED

        raise UsageError(EXACT_REFUSED)
    return traced


def make(spec: GpuSpec) -> Backend:
    from pyhpctk.measure.gpu.cupti.backend import CuptiBackend
    from pyhpctk.measure.gpu.kernel_filter import kernel_filter

    records, pc_mode = _modes(spec)
    blocks: BlockReader | None = None
    traced = _tracing(spec)
    if traced is not None:
        from pyhpctk.measure.gpu.cupti.warp_reader import TraceReader

        blocks = TraceReader(traced[1], kernel_filter(spec, True))
    elif options.block_counting(spec):
        from pyhpctk.measure.gpu.cupti.blocks import BlockReader as Reader

        blocks = Reader(options.block_mode(spec), kernel_filter(spec, True))
    return CuptiBackend(
        buffer_bytes=spec.int_option("buffer", 8 << 20),
        records=records,
        pc_period=options.pc_period(spec),
        pc_mode=pc_mode,
        hook=options.hook_option(spec),
        inst=options.inst_counting(spec),
        sync=options.sync_option(spec),
        blocks=blocks,
    )

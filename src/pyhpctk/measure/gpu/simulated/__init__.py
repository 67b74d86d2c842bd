"""``gpu=simulated``: replays a recording through the real monitor (no GPU needed).

:mod:`.backend` plays the GPU runtime's part, :mod:`.recording` is the format it replays; the
default recording (``cupy_streams.json``, made on an H200 by ``tests/data/gpu/record_cupy.py``)
ships with the package. This module is the row of
:data:`~pyhpctk.measure.gpu.spec.BACKENDS`: :func:`check` and :func:`make`.
"""

from __future__ import annotations

import os

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu import options
from pyhpctk.measure.settings import ENV_RECORDING as ENV_RECORDING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.backend import Backend
    from pyhpctk.measure.gpu.spec import GpuSpec

#: The recording gpu=simulated replays by default (the H200 fixture, shipped with the package).
DEFAULT_RECORDING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cupy_streams.json")


def check(spec: GpuSpec) -> None:
    """Refuse bad option values and missing recordings now (nothing loaded)."""
    options.check_common(spec)
    for key in ("recording", "pc", "inst", "blocks", "traces"):
        path = spec.option(key)
        if path and not os.path.isfile(path):
            raise UsageError(f"gpu=simulated: {key}={path}: no such file")
    if spec.option("traces"):  # read now: a damaged one is refused before anything is made
        from pyhpctk.measure.gpu.warp_options import check_recording

        check_recording(spec.option("traces"))


def make(spec: GpuSpec) -> Backend:
    from pyhpctk.measure.gpu.simulated import recording
    from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend

    inst = options.inst_counting(spec)
    path = spec.option("recording") or DEFAULT_RECORDING
    try:
        replayed = recording.load(path)
    except OSError as error:
        raise UsageError(f"gpu=simulated: cannot read the recording {path}: {error}") from None
    pc = None
    if spec.option("pc"):
        from pyhpctk.measure.gpu.cupti.pcsampling import load_recording

        pc = load_recording(spec.option("pc"))
    blocks = None
    if options.block_counting(spec):
        from pyhpctk.measure.gpu.kernel_filter import kernel_filter
        from pyhpctk.measure.gpu.simulated.block_recording import load as load_blocks
        from pyhpctk.measure.gpu.simulated.blocks import BlockReplay

        recorded = load_blocks(spec.option("blocks"))
        blocks = BlockReplay(recorded, replayed.functions, kernel_filter(spec, True))
    counts = None
    if inst:
        from pyhpctk.measure.gpu.cupti.sassmetrics import load_inst_recording

        counts = load_inst_recording(spec.option("inst"))
    traces = None
    if spec.option("traces"):
        from pyhpctk.instrument.tracing.recording import load as load_traces

        traces = load_traces(spec.option("traces"))
    return SimulatedBackend(
        replayed,
        buffer_records=spec.int_option("buffer", 256),
        max_pending=spec.int_option("pending", 0),
        pc=pc,
        inst=counts,
        hook=options.hook_option(spec),
        sync=options.sync_option(spec),
        blocks=blocks,
        traces=traces,
    )

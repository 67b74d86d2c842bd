"""The ``gpu=`` options several backends read, checked once (no numpy here).

``hook=``, ``sync=``, ``inst``, ``blocks`` (and its kernel filter), ``pc[,period=N]``: each
backend's ``check(spec)`` and ``make(spec)`` (the modules
:data:`~pyhpctk.measure.gpu.spec.BACKENDS` names) read them through these functions, so a
value is refused with the same words whichever backend reads it.
"""

from __future__ import annotations

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu.kernel_filter import kernel_filter
from pyhpctk.measure.gpu.spec import DEFAULT_SIMULATED_SYNC, DEFAULT_SYNC, SYNC_MODES, GpuSpec


def hook_option(spec: GpuSpec) -> str:
    """``hook=c|python|auto``: how GPU API calls are seen (the C CUPTI hook where built)."""
    hook = spec.option("hook", "auto")
    if hook not in ("auto", "c", "python"):
        raise UsageError(f"gpu={spec.backend}: hook={hook!r}: say hook=c, hook=python or hook=auto")
    return hook


def sync_option(spec: GpuSpec) -> str:
    """``sync=api|activity|both``: who times synchronizations (:mod:`.syncapi`)."""
    default = DEFAULT_SIMULATED_SYNC if spec.backend == "simulated" else DEFAULT_SYNC
    sync = spec.option("sync", default)
    if sync not in SYNC_MODES:
        raise UsageError(
            f"gpu={spec.backend}: sync={sync!r}: say "
            + " or ".join(f"sync={mode}" for mode in SYNC_MODES)
        )
    return sync


def inst_counting(spec: GpuSpec) -> bool:
    """``gpu=nvidia,inst`` / ``gpu=simulated,inst=RECORDING``: exact instruction counts.

    Refused together with ``pc``: CUPTI's SASS metrics API needs ``cuptiProfilerInitialize``,
    which blocks its PC sampling API, and ``GINS`` would mix counts with samples.
    """
    keys = {key for key, _ in spec.options}
    if "inst" not in keys:
        return False
    if "pc" in keys:
        raise UsageError(f"gpu={spec.backend}: pc and inst exclude each other (one per run)")
    if spec.backend == "simulated" and not spec.option("inst"):
        raise UsageError("gpu=simulated: say inst=RECORDING (from record_pc.py --inst)")
    if spec.backend == "nvidia" and spec.option("inst"):
        raise UsageError("gpu=nvidia: inst takes no value")
    return True


#: ``gpu=nvidia,blocks=MODE``: where the PTX pass puts counters (its ``Mode``): ``edges``
#: (default: the edges a spanning tree leaves; thread counts) or ``warps`` (a counter in every
#: block: warp counts too).
BLOCK_MODES = {"": "edges", "edges": "edges", "warps": "blocks"}


def block_counting(spec: GpuSpec) -> bool:
    """``gpu=nvidia,blocks[=edges|warps]`` / ``gpu=simulated,blocks=RECORDING``: exact counts
    of the PTX basic blocks of the kernels Triton, CuPy and Numba compile (issue #34).

    Refused with ``pc`` or ``inst``: those read the SASS of the kernel as compiled, and an
    instrumented kernel's is not the program's.
    """
    keys = {key for key, _ in spec.options}
    if "blocks" not in keys:
        return False
    if keys & {"pc", "inst"}:
        raise UsageError(f"gpu={spec.backend}: blocks excludes pc and inst (one per run)")
    value = spec.option("blocks")
    if spec.backend == "simulated" and not value:
        raise UsageError("gpu=simulated: say blocks=RECORDING (from blocks_device.py --record)")
    if spec.backend == "nvidia" and value not in BLOCK_MODES:
        raise UsageError(f"gpu=nvidia: blocks={value!r}: say blocks, blocks=edges or blocks=warps")
    return True


def block_mode(spec: GpuSpec) -> str:
    """The PTX pass's mode (``edges`` or ``blocks``) ``gpu=nvidia,blocks=...`` asks for."""
    return BLOCK_MODES.get(spec.option("blocks"), "edges")


def pc_period(spec: GpuSpec) -> int:
    """``gpu=nvidia,pc[,period=N]``: the PC sampling period exponent (2^N cycles), 0 when off."""
    if not any(key == "pc" for key, _ in spec.options):
        return 0
    from pyhpctk.measure.gpu.cupti.pcsampling import period_exponent

    try:
        return period_exponent(spec.int_option("period", 12))
    except ValueError as error:
        raise UsageError(f"gpu={spec.backend}: {error}") from None


def memory_tracking(options: tuple[tuple[str, str], ...], backend: str) -> bool:
    """``gpu=nvidia,memory`` / ``gpu=simulated,memory``: every allocation and free of
    PyTorch's and CuPy's allocators with its calling context (issue #37 item 2, :mod:`.memory`).
    """
    for key, value in options:
        if key == "memory":
            if value:
                raise UsageError(f"gpu={backend}: memory takes no value (say gpu={backend},memory)")
            return True
    return False


def check_common(spec: GpuSpec) -> None:
    """Refuse bad values of the options above now (nothing loaded or started)."""
    hook_option(spec)
    memory_tracking(spec.options, spec.backend)
    sync_option(spec)
    inst_counting(spec)
    traced = spec.backend == "nvidia" and any(key == "trace" for key, _ in spec.options)
    kernel_filter(spec, traced or block_counting(spec))  # they choose what blocks or trace see
    pc_period(spec)

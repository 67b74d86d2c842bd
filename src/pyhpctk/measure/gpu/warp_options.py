"""``gpu=nvidia,trace[=exact|chunks][,tracebytes=N]``: per-warp traces of instrumented kernels
(issue #34 item 4), checked once (no numpy here).

``trace`` chooses the buffer strategy (docs/gpu.md, "Per-warp traces"): ``chunks`` (the default:
one run, an online chunk allocator) or ``exact`` (hip-analyzer's two passes, the kernel's
writable memory saved and restored between them); ``tracebytes`` caps a launch's event buffer
(a number of bytes, or with a ``K``, ``M`` or ``G`` suffix; default 256M). Events past the cap
are counted and reported, never lost silently.
"""

from __future__ import annotations

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu.spec import GpuSpec

STRATEGIES = ("chunks", "exact")
DEFAULT_TRACE_BYTES = 256 << 20
MIN_TRACE_BYTES = 32 * 64  # one chunk of 64 events of 32 bytes
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def trace_bytes(spec: GpuSpec) -> int:
    """``tracebytes=N[K|M|G]``: the cap on a launch's trace buffer."""
    text = spec.option("tracebytes", "").strip().upper()
    if not text:
        return DEFAULT_TRACE_BYTES
    number, suffix = (text[:-1], text[-1]) if text[-1] in "KMG" else (text, "")
    if not number.isdigit():
        raise UsageError(f"gpu={spec.backend}: tracebytes={text!r}: say a number of bytes, "
                         "with K, M or G if you like (tracebytes=64M)")  # fmt: skip
    value = int(number) * _SUFFIXES[suffix]
    if value < MIN_TRACE_BYTES:
        raise UsageError(f"gpu={spec.backend}: tracebytes={text}: at least {MIN_TRACE_BYTES} "
                         "bytes (one chunk of 64 events)")  # fmt: skip
    return value


def trace_option(spec: GpuSpec) -> tuple[str, int] | None:
    """``trace[=exact|chunks]`` and its cap, or None when not asked for; ``tracebytes``
    without ``trace`` is refused (it would cap nothing)."""
    keys = {key for key, _ in spec.options}
    if "trace" not in keys:
        if "tracebytes" in keys:
            raise UsageError(f"gpu={spec.backend}: tracebytes= without trace caps nothing: "
                             "add trace (gpu=nvidia,trace,tracebytes=64M)")  # fmt: skip
        return None
    strategy = spec.option("trace") or STRATEGIES[0]
    if strategy not in STRATEGIES:
        raise UsageError(f"gpu={spec.backend}: trace={strategy!r}: say trace=chunks or "
                         "trace=exact (or trace alone: chunks)")  # fmt: skip
    return strategy, trace_bytes(spec)


def check_recording(path: str) -> None:
    """``gpu=simulated,traces=FILE``: a recording that cannot be read is a one-line usage
    error in pyrun, before the measured program starts."""
    from pyhpctk.errors import FormatError
    from pyhpctk.instrument.tracing.recording import load

    try:
        load(path)
    except FormatError as error:
        raise UsageError(f"gpu=simulated: traces={error}") from None

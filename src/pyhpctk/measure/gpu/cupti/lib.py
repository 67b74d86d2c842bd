"""Where the CUPTI backend finds libcupti and the C hook, and libcupti's callback signatures.

Shared by :mod:`.cupti_callbacks`, :mod:`.cupti_buffers` and :mod:`.cupti_backend`; this module
loads nothing itself until asked (the C hook on :func:`load_hook`, no libcupti at all).
"""

from __future__ import annotations

import ctypes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.backend import NativeHook

NO_CBID = 0xFFFFFFFF  # "no such callback" for the C hook's configure()
#: cuptiActivityRegisterCallbacks' two callbacks (cupti_activity.h): a buffer is wanted
#: (buffer, size, maxNumRecords out) / a buffer is complete (ctx, streamId, buffer, size, valid).
BUFFER_REQUESTED = ctypes.CFUNCTYPE(
    None,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
)
BUFFER_COMPLETED = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)


def load_hook() -> NativeHook | None:
    """The C CUPTI hook (``_cuptihook``), None where it was not built (no compiler at install)."""
    try:
        from pyhpctk.measure.gpu.cupti import _cuptihook
    except ImportError:
        return None
    return _cuptihook


def loaded_library(stem: str) -> str | None:
    """The path of a shared library this process has loaded (from ``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if stem in path.rsplit("/", 1)[-1] and path.startswith("/"):
                    return path
    except OSError:
        return None
    return None

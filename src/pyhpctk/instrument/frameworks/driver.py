"""A module's ``.global`` through the CUDA driver (``cuModuleGetGlobal``), for frameworks that
hand out a raw ``CUmodule`` (Triton). Loaded with ctypes on first use: nothing here runs, or
needs libcuda, until a module is read."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from pyhpctk.instrument.frameworks.base import FrameworkError


@functools.cache
def libcuda() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise FrameworkError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}") from None


def check_status(call: str, status: int) -> None:
    if status != 0:
        raise FrameworkError(f"{call} failed with CUDA driver error {status}")


def synchronize() -> None:
    """Wait for the current context's work (``cuCtxSynchronize``): launches' counters are
    final then."""
    check_status("cuCtxSynchronize", libcuda().cuCtxSynchronize())


def module_global(module: int, symbol: str) -> tuple[int, int]:
    """The device address and size of ``symbol`` in the loaded ``module`` (a CUmodule)."""
    address, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = libcuda().cuModuleGetGlobal_v2(
        ctypes.byref(address), ctypes.byref(size), ctypes.c_void_p(module), symbol.encode()
    )
    check_status(f"cuModuleGetGlobal({symbol})", status)
    return address.value, size.value


def read_global(module: int, symbol: str, nbytes: int) -> np.ndarray:
    address, size = module_global(module, symbol)
    out = np.zeros(min(nbytes, size), np.uint8)
    status = libcuda().cuMemcpyDtoH_v2(
        out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(address), ctypes.c_size_t(out.size)
    )
    check_status(f"cuMemcpyDtoH({symbol})", status)
    return out


def zero_global(module: int, symbol: str, nbytes: int) -> None:
    address, size = module_global(module, symbol)
    status = libcuda().cuMemsetD8_v2(
        ctypes.c_uint64(address), ctypes.c_ubyte(0), ctypes.c_size_t(min(nbytes, size))
    )
    check_status(f"cuMemsetD8({symbol})", status)

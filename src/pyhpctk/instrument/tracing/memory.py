"""Device memory for the tracing launcher: what it needs of a GPU, and where a launch writes.

:class:`DeviceMemory` is the launcher's one door to the device (allocate, zero, copy, wait);
:class:`CudaMemory` implements it through the CUDA driver (ctypes, the current context: CuPy's
and PyTorch's are the device's primary context, so their pointers are valid here). Tests give
the launcher a memory of their own.

:func:`writable_regions` finds the memory a launch may write from its arguments, as hip-analyzer
saves every allocation before the counting run: a CuPy array's whole allocation (its
``MemoryPointer``'s ``mem``), a PyTorch tensor's whole storage, or the extent an object's
``__cuda_array_interface__`` describes. Scalars and anything else are no memory. Overlapping
regions (views of one allocation) are merged, so each byte is saved once; regions that only
touch are kept apart (each copy stays in one allocation).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from pyhpctk.instrument.frameworks import driver

Region = tuple[int, int]  # (device address, bytes)


class DeviceMemory(Protocol):
    """What the launcher does on the device."""

    def alloc(self, nbytes: int) -> int: ...

    def free(self, address: int) -> None: ...

    def zero(self, address: int, nbytes: int) -> None: ...

    def read(self, address: int, nbytes: int) -> np.ndarray:
        """``nbytes`` at ``address`` as uint8."""
        ...

    def write(self, address: int, data: np.ndarray) -> None: ...

    def copy(self, target: int, source: int, nbytes: int) -> None: ...

    def synchronize(self) -> None: ...


class CudaMemory:
    """:class:`DeviceMemory` through the CUDA driver's current context."""

    def _call(self, name: str, *args: Any) -> None:
        driver.check_status(name, getattr(driver.libcuda(), name)(*args))

    def alloc(self, nbytes: int) -> int:
        address = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(address), ctypes.c_size_t(max(nbytes, 1)))
        return address.value

    def free(self, address: int) -> None:
        self._call("cuMemFree_v2", ctypes.c_uint64(address))

    def zero(self, address: int, nbytes: int) -> None:
        self._call("cuMemsetD8_v2", ctypes.c_uint64(address), ctypes.c_ubyte(0),
                   ctypes.c_size_t(nbytes))  # fmt: skip

    def read(self, address: int, nbytes: int) -> np.ndarray:
        out = np.zeros(nbytes, np.uint8)
        self._call("cuMemcpyDtoH_v2", out.ctypes.data_as(ctypes.c_void_p),
                   ctypes.c_uint64(address), ctypes.c_size_t(nbytes))  # fmt: skip
        return out

    def write(self, address: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8)
        self._call("cuMemcpyHtoD_v2", ctypes.c_uint64(address),
                   raw.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(raw.size))  # fmt: skip

    def copy(self, target: int, source: int, nbytes: int) -> None:
        self._call("cuMemcpyDtoD_v2", ctypes.c_uint64(target), ctypes.c_uint64(source),
                   ctypes.c_size_t(nbytes))  # fmt: skip

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")


def _interface_extent(interface: dict[str, Any]) -> Region | None:
    address = int(interface["data"][0])
    shape = tuple(int(n) for n in interface["shape"])
    itemsize = np.dtype(interface["typestr"]).itemsize
    if not address or any(n == 0 for n in shape):
        return None
    strides = interface.get("strides")
    if strides is None:
        return address, itemsize * int(np.prod(shape, dtype=np.int64))
    low = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    high = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True)) + itemsize
    return address + low, high - low


def region_of(arg: Any) -> Region | None:
    """The device memory ``arg`` gives a kernel, whole (the module docstring), or None."""
    data = getattr(arg, "data", None)
    mem = getattr(data, "mem", None)
    if mem is not None and hasattr(mem, "ptr") and hasattr(mem, "size"):  # CuPy
        return (int(mem.ptr), int(mem.size)) if int(mem.size) else None
    storage = getattr(arg, "untyped_storage", None)
    if callable(storage) and getattr(arg, "is_cuda", False):  # PyTorch
        whole = storage()
        return (int(whole.data_ptr()), int(whole.nbytes())) if int(whole.nbytes()) else None
    interface = getattr(arg, "__cuda_array_interface__", None)
    if isinstance(interface, dict):
        return _interface_extent(interface)
    return None


def merge(regions: Iterable[Region]) -> list[Region]:
    """Regions sorted, overlapping ones joined. Touching ones are not: a region that starts
    where another ends may be another allocation (CuPy's pool and the driver hand them out end
    to end), and one copy may not span two (``cuMemcpyDtoD``: CUDA_ERROR_INVALID_VALUE)."""
    out: list[list[int]] = []
    for start, size in sorted(r for r in regions if r[1] > 0):
        if out and start < out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], start + size - out[-1][0])
        else:
            out.append([start, size])
    return [(a, b) for a, b in out]


def writable_regions(args: Sequence[Any]) -> list[Region]:
    """The device memory a launch with ``args`` may write (the module docstring)."""
    return merge(r for r in map(region_of, args) if r is not None)


class HostMemory:
    """:class:`DeviceMemory` in numpy on the host: the simulated backend's device, where a
    recorded launch's buffers are put back as the GPU left them (addresses are made up)."""

    def __init__(self) -> None:
        self.blocks: dict[int, np.ndarray] = {}
        self._next = 0x7000_0000_0000

    def alloc(self, nbytes: int) -> int:
        address = self._next
        self._next += (max(nbytes, 1) + 0xFFFF) // 0x10000 * 0x10000
        self.blocks[address] = np.zeros(max(nbytes, 1), np.uint8)
        return address

    def _at(self, address: int, nbytes: int) -> np.ndarray:
        for base, block in self.blocks.items():
            if base <= address and address + nbytes <= base + block.size:
                view: np.ndarray = block[address - base : address - base + nbytes]
                return view
        raise ValueError(f"no allocation holds {nbytes} bytes at {address:#x}")

    def free(self, address: int) -> None:
        del self.blocks[address]

    def zero(self, address: int, nbytes: int) -> None:
        self._at(address, nbytes)[:] = 0

    def read(self, address: int, nbytes: int) -> np.ndarray:
        return self._at(address, nbytes).copy()

    def write(self, address: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        self._at(address, raw.size)[:] = raw

    def copy(self, target: int, source: int, nbytes: int) -> None:
        self.write(target, self.read(source, nbytes))

    def synchronize(self) -> None:
        pass

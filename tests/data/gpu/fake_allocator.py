"""A program with a fake GPU allocator, run under ``pyrun -e gpu=simulated,memory``: it tells
pyrun's memory tracker what CuPy's MemoryHook, PyTorch's allocator history and raw cudaMalloc
would, through the same entry points (tests/test_gpu_memory.py knows the truth, MiB below).

Sites (each a line marked ``# SITE``): weights 4 MiB kept; per step 3 x 1 MiB activations and a
2 MiB workspace (the transient peak, 9 MiB); a raw 1 MiB cudaMalloc freed; then PyTorch's
8 MiB block, kept (the process's peak, 12 MiB). With ``oom``: PyTorch's observer is told of an
out-of-memory error, then the program dies of the exception; with ``cupy-oom``, CuPy's hook (its
cudaMalloc failing first, as CuPy tells it: ``alloc_postprocess`` with ``mem_ptr`` 0).
"""

import sys
import time

from pyhpctk.measure.gpu import memory
from pyhpctk.measure.gpu.memory_hooks import CupyPoolEvents, TorchAllocator

MIB = 1 << 20
tracker = memory.current()
assert tracker is not None, "run under pyrun -e gpu=simulated,memory"
pool = CupyPoolEvents(tracker)  # what cupy.cuda.MemoryHook hears
addresses = iter(range(0x7F0000000000, 0x7F1000000000, 64 * MIB))


def malloc(size):
    address = next(addresses)
    pool.malloc_postprocess(device_id=0, size=size, mem_size=size, mem_ptr=address, pmem_id=1)
    return address


def free(address, size):
    pool.free_postprocess(device_id=0, mem_size=size, mem_ptr=address, pmem_id=1)


def load_weights():
    return malloc(4 * MIB)  # SITE weights


def activations():
    kept = []
    for _ in range(3):
        kept.append(malloc(MIB))  # SITE activations
    return kept


def workspace():
    return malloc(2 * MIB)  # SITE workspace


def step():
    kept = activations()
    scratch = workspace()
    free(scratch, 2 * MIB)
    for address in kept:
        free(address, MIB)


def raw_cuda():
    address = next(addresses)
    tracker.reserved(memory.CUDA, 0, address, MIB)  # SITE raw
    tracker.released(memory.CUDA, 0, address)


class FakeTorch:
    """What TorchAllocator reads of torch: ``torch.cuda.memory._snapshot()``."""

    def __init__(self):
        self.traces = []
        self._C = self
        self.cuda = self.memory = self

    def _snapshot(self):
        return {"segments": [], "device_traces": [self.traces]}


def torch_block(torch):
    line = sys._getframe().f_lineno  # where PyTorch's frames say it allocated
    now = time.time_ns() // 1000 + 1
    address = next(addresses)
    frames = [
        {"filename": __file__, "line": line, "name": "torch_block"},
        {"filename": __file__, "line": MAIN_LINE, "name": "<module>"},
    ]
    torch.traces += [
        {
            "action": "segment_alloc",
            "addr": address,
            "size": 10 * MIB,
            "time_us": now,
            "frames": [],
        },
        {"action": "alloc", "addr": address, "size": 8 * MIB, "time_us": now, "frames": frames},
    ]


pool.alloc_postprocess(device_id=0, mem_size=16 * MIB, mem_ptr=next(addresses))  # the pool grows
weights = load_weights()
for _ in range(2):
    step()
raw_cuda()
time.sleep(0.001)
torch = FakeTorch()
allocator = TorchAllocator(tracker, torch)
allocator.enabled = True
tracker.hooks.append(allocator)
MAIN_LINE = sys._getframe().f_lineno + 1
torch_block(torch)  # SITE torch
if sys.argv[1:] == ["oom"]:
    allocator.out_of_memory(0, 3 << 30, 12 * MIB, 0)  # as the allocator calls its observers
    raise MemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
if sys.argv[1:] == ["cupy-oom"]:  # CuPy's pool tells its hook of the failure (mem_ptr 0)
    for _ in range(3):  # its cudaMalloc fails (mem_ptr 0), again after freeing its cache
        pool.alloc_postprocess(device_id=0, mem_size=3 << 30, mem_ptr=0)
    pool.malloc_postprocess(device_id=0, size=3 << 30, mem_size=3 << 30, mem_ptr=0, pmem_id=0)
    raise MemoryError("Out of memory allocating 3,221,225,472 bytes")

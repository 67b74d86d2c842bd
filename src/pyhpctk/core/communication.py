"""Which GPU kernels are communication: NCCL's collectives, told apart by their names.

A kernel's name is all a profiler learns of it (CUPTI's kernel record carries the name, times,
grid and memory, not what the kernel moves), and NCCL names each of its kernels after what it
does (``src/device/generate.py`` in NCCL's sources), so the name gives the collective, the
reduction, the data type, the algorithm and the protocol:

* NCCL 2.19 and later: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (C++-mangled as CUPTI
  reports it: ``_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE``),
  ``ncclDevKernel_AllGather_RING_LL``, ``ncclDevKernel_SendRecv``, ``ncclDevKernel_Generic``;
* NCCL up to 2.18: ``ncclKernel_AllReduce_RING_LL_Sum_float`` and the like;
* a communicator of one rank (``enqueue.cc``, ``ncclLaunchOneRank``): no kernel for an in-place
  sum (nothing to do), a device copy for an out-of-place one, and the kernel
  ``oneRankReduce<FuncPreMulSum<T>>`` for an average (``ReduceOp.AVG``).

What the name does not say is how many bytes moved: that is the count the program passed to the
collective, which neither CUPTI nor the kernel name carries (docs/gpu.md, "Communication").

Used by pyrun (to give communication kernels a metric of their own) and by pyview (to tell
communication from compute in traces): standard library only, cheap to import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: NCCL's collectives as its kernel names spell them.
COLLECTIVES = (
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "Reduce",
    "SendRecv",
    "AllToAll",
    "Generic",
)
REDUCTIONS = frozenset({"Sum", "Prod", "MinMax", "Min", "Max", "PreMulSum", "SumPostDiv", "Avg"})
ALGORITHMS = frozenset(
    {"RING", "TREE", "COLLNET", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"}
)
PROTOCOLS = frozenset({"LL", "LL128", "SIMPLE"})
#: Element types: NCCL 2.19+ short names and the C type names of earlier releases.
TYPE_BYTES = {
    "i8": 1, "u8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8,
    "f16": 2, "f32": 4, "f64": 8, "bf16": 2, "f8e4m3": 1, "f8e5m2": 1,
    "int8_t": 1, "uint8_t": 1, "int32_t": 4, "uint32_t": 4, "int64_t": 8, "uint64_t": 8,
    "half": 2, "float": 4, "double": 8, "__nv_bfloat16": 2, "bfloat16": 2,
}  # fmt: skip
_ONE_RANK_TYPES = {"a": "i8", "h": "u8", "i": "i32", "j": "u32", "l": "i64", "m": "u64",
                   "x": "i64", "y": "u64", "f": "f32", "d": "f64", "6__half": "f16",
                   "13__nv_bfloat16": "bf16"}  # fmt: skip

_NCCL = re.compile(r"nccl(?:Dev)?Kernel_")
_MANGLED_LENGTH = re.compile(r"_Z(?:N\d*)?(\d+)")
_ONE_RANK = re.compile(r"oneRankReduce(?:I\d*FuncPreMulSum(?:I(\w+?)E)?|<FuncPreMulSum<([^<>]+)>)?")


@dataclass(frozen=True, slots=True)
class Collective:
    """What a communication kernel's name says (``""`` where the name does not say it)."""

    operation: str  # AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, SendRecv, ...
    reduction: str = ""
    datatype: str = ""
    algorithm: str = ""
    protocol: str = ""
    library: str = "nccl"

    @property
    def element_bytes(self) -> int:
        """The size of one element of the collective's data type (0: not in the name)."""
        return TYPE_BYTES.get(self.datatype, 0)


def _identifier(name: str, start: int) -> str:
    """The identifier that begins at ``start`` of a kernel name, mangled or not."""
    mangled = _MANGLED_LENGTH.match(name)
    if mangled is not None and mangled.end() == start:
        return name[start : start + int(mangled.group(1))]
    end = start
    while end < len(name) and (name[end].isalnum() or name[end] == "_"):
        end += 1
    return name[start:end]


def collective_of(name: str) -> Collective | None:
    """The collective a kernel named ``name`` runs, or None for a kernel that is not NCCL's."""
    found = _NCCL.search(name)
    if found is not None:
        identifier = _identifier(name, found.start())
        tokens = identifier[found.end() - found.start() :].split("_")
        operation = tokens[0] if tokens and tokens[0] else "Generic"
        reduction = datatype = algorithm = protocol = ""
        rest = tokens[1:]
        index = 0
        while index < len(rest):
            token = rest[index]
            pair = "_".join(rest[index : index + 2])
            if pair in ALGORITHMS:
                algorithm, index = pair, index + 2
                continue
            if token in REDUCTIONS:
                reduction = token
            elif token in ALGORITHMS:
                algorithm = token
            elif token in PROTOCOLS:
                protocol = token
            elif token in TYPE_BYTES or pair in TYPE_BYTES:
                datatype = token if token in TYPE_BYTES else pair
                index += pair in TYPE_BYTES and token not in TYPE_BYTES
            index += 1
        return Collective(operation, reduction, datatype, algorithm, protocol)
    one = _ONE_RANK.search(name)
    if one is not None:
        # mangled (``I13FuncPreMulSumIfE``) or demangled (``<FuncPreMulSum<float> >``)
        datatype = _ONE_RANK_TYPES.get(one.group(1) or "", (one.group(2) or "").strip())
        return Collective("AllReduce", "PreMulSum", datatype)
    return None


def is_communication(name: str) -> bool:
    """Whether a kernel named ``name`` is communication (an NCCL collective)."""
    return collective_of(name) is not None

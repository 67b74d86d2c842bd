"""On the device: which CUPTI record layouts the per-record C pass (records.plan) follows; the
others are read by the numpy path (correct, slower). Printed by device_pytorch.sh build."""

import re

from cupti import cupti  # the bindings module: the record dtypes live there

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import records
from pyhpctk.measure.gpu.cupti_backend import _Gather

names = [n for n in dir(cupti) if n.endswith("_dtype")]
for kind, pattern in (
    (act.KERNEL, r"activity_kernel\d*_dtype"),
    (act.COPY, r"activity_memcpy\d*_dtype"),
    (act.MEMSET, r"activity_memset\d*_dtype"),
    (act.SYNC, r"activity_synchronization\d*_dtype"),
    (act.ALLOC, r"activity_memory\d+_dtype"),
):
    found = [n for n in names if re.fullmatch(pattern, n)]
    gather = _Gather([getattr(cupti, n) for n in found])
    for name in found:
        dtype = getattr(cupti, name)
        padded = gather.padded(dtype.itemsize)
        path = "C pass" if records.plan(kind, padded) is not None else "NO: numpy path"
        print(f"kind {kind} {name} ({dtype.itemsize} B): {path}")

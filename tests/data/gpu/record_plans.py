"""On the device: which CUPTI record layouts the per-record C pass (records.plan) follows; the
others are read by the numpy path (correct, slower). Printed by device_pytorch.sh build."""

from cupti import cupti  # the bindings module: the record dtypes live there

from pyhpctk.measure.gpu.cupti import records
from pyhpctk.measure.gpu.cupti.buffers import Gather, record_dtype_names

for kind, found in record_dtype_names(cupti).items():
    gather = Gather([getattr(cupti, n) for n in found])
    for name in found:
        dtype = getattr(cupti, name)
        padded = gather.padded(dtype.itemsize)
        path = "C pass" if records.plan(kind, padded) is not None else "NO: numpy path"
        print(f"kind {kind} {name} ({dtype.itemsize} B): {path}")

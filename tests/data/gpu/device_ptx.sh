#!/bin/bash
# Issue #34 on the device: the PTX pass's instrumented kernels against the plain ones (outputs
# bit-identical, block counts equal to what each kernel's arithmetic implies).
# Usage (repository root): bash tests/data/gpu/device_ptx.sh OUT
out=${1:?output directory}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} TRITON_DEFAULT_FP_FUSION=1
export TRITON_CACHE_DIR=/tmp/triton-cache-ptx
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import cupy, triton, numpy; print('cupy', cupy.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
  nvcc --version | tail -2
  which ptxas; ptxas --version | tail -1
} > "$out/ptx_env.txt" 2>&1
cat "$out/ptx_env.txt"
timeout 500 python3 tests/data/gpu/device_ptx.py "$out" 2>&1 | tee "$out/ptx_device.log"
exit "${PIPESTATUS[0]}"

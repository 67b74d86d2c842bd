#!/bin/bash
# Issue #34's remaining items on the device, in one call from the repository root (at most about
# 8 minutes: run with timeout_s 600): the kernel instrumentation benchmark
# (benchmarks/kernel_instrumentation.py: 8 kernels in Triton and CuPy, plain / counts /
# counts-registers / counts-warps / trace-chunks / trace-exact in one process), then pyrun -e gpu=nvidia,trace and blocks=warps on an unchanged program with a
# torch.compile'd model (tests/data/gpu/device_kernels.py). Every log under OUT.
#   bash tests/data/gpu/device_kernels.sh OUT [SCALE] [REPS]
out=${1:?output directory}
scale=${2:-1.0}
reps=${3:-8}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 --version
  python3 -m pip show triton cupy-cuda13x torch numba-cuda 2>/dev/null | grep -E '^(Name|Version)' | paste - -
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/cupti_python*.whl .whl/pyelftools*.whl .whl/capstone*.whl .whl/py_spy*.whl > "$out/pip.txt" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export TRITON_DEFAULT_FP_FUSION=1 TRITON_CACHE_DIR=/tmp/kern_tc CUPY_CACHE_DIR=/tmp/kern_cc
bash tests/data/gpu/build_hook.sh python3 > "$out/build.txt" 2>&1 || echo "FAIL build_hook (see build.txt)"
timeout 300 python3 benchmarks/kernel_instrumentation.py "$out/bench" --scale "$scale" --reps "$reps" \
  2>&1 | tee "$out/bench.log"
echo "benchmark status ${PIPESTATUS[0]}"
timeout 170 python3 tests/data/gpu/device_kernels.py "$out/pyrun" 2>&1 | tee "$out/pyrun.log"
echo "pyrun checks status ${PIPESTATUS[0]}"

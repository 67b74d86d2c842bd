#!/bin/bash
# Issue #37 item 2 on the device: GPU memory with its stacks (tests/data/gpu/memory_device.py).
# A PyTorch training step measured with pyrun -e gpu=nvidia,memory against
# torch.cuda.max_memory_allocated() and torch.cuda.memory._snapshot() of the same run (peak within
# 1 %, the top 5 sites the same), the cost of memory tracking (a ratio against pyrun without it),
# a CuPy program's pool allocations, and a PyTorch and a CuPy program that run out of memory and
# leave their reports. Every log, measurement and database goes under OUT; a PASS/FAIL line per
# check, then "N/M passed". About 2 minutes on an H100.
# Usage (repository root): bash tests/data/gpu/device_memory.sh OUT [WHEEL_DIR]
# (WHEEL_DIR, default .whl/ where present: wheels of what the image lacks, cupti-python among
# them, installed into /tmp/site when the image has no cupti.)
out=${1:?output directory}
wheels=${2:-$([ -d .whl ] && echo .whl)}
mkdir -p "$out"
began=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 --version
  python3 -m pip show torch cupy-cuda13x cupy-cuda12x cupti-python 2>/dev/null \
    | grep -E '^(Name|Version)' | paste - -
} 2>&1 | tee "$out/memory_env.txt"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c 'import cupti' 2>/dev/null && [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheels"/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
# pyrun's C parts for this python3 (the CUPTI hook and the sampling engine)
# (not where the caller built them already and set PYHPCTK_BUILT: a job may be loading them)
[ -n "$PYHPCTK_BUILT" ] || bash tests/data/gpu/build_hook.sh python3 >> "$out/memory_env.txt" 2>&1 ||
  echo "FAIL build" | tee -a "$out/memory_env.txt"
timeout 230 python3 tests/data/gpu/memory_device.py "$out" 2>&1 | tee "$out/memory.log"
status=${PIPESTATUS[0]}
echo "device_memory.sh: rc=$status in $(( $(date +%s) - began )) s" | tee -a "$out/memory.log"
exit "$status"

#!/bin/bash
# Issue #34 item 2 on the device: a Triton, a CuPy and a Numba kernel through pyhpctk's framework
# hooks (tests/data/gpu/device_ptx_hooks.py). Usage (repository root): bash THIS OUT [WHEEL_DIR]
# The image's numba-cuda is used if it is 0.30.x; otherwise a numba-cuda 0.30 wheel for the
# device's Python, carried in WHEEL_DIR, is put first on the path.
out=${1:?output directory}
wheels=${2:-}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 --version
  python3 -m pip show triton cupy-cuda13x numba numba-cuda cuda-core cuda-bindings torch 2>/dev/null \
    | grep -E '^(Name|Version)' | paste - -
} 2>&1 | tee "$out/ptx_hooks_env.txt"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc CUPY_CACHE_DIR=/tmp/cc
export TRITON_DEFAULT_FP_FUSION=1
v=$(python3 -c 'import importlib.metadata as m; print(m.version("numba-cuda"))' 2>/dev/null)
pre=""
if [[ "$v" != 0.30.* && -n "$wheels" ]]; then
  echo "numba-cuda ${v:-absent} in the image: the carried one instead" | tee -a "$out/ptx_hooks_env.txt"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheels"/numba_cuda*.whl || exit 3
  pre="import sys, site; sys.path.insert(0, '/tmp/site'); site.addsitedir('/tmp/site');"  # its .pth
fi
cd tests/data/gpu || exit 2
timeout 420 python3 -c "${pre}import runpy, sys; sys.argv = ['device_ptx_hooks.py', '$out']
runpy.run_path('device_ptx_hooks.py', run_name='__main__')" 2>&1 | tee "$out/ptx_hooks.log"
exit "${PIPESTATUS[0]}"

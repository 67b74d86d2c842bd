#!/bin/bash
# Issues #34 and #37 on the device in two calls of one warm machine (each under 10 minutes;
# run the second within 30 s of the first's end so the machine and the window job stay).
#   one: wheels, the C parts, the 10-minute window job started in its own session
#        (device_window.sh, WINDOW_JOB_PAUSE=0.02 so the card is mostly free for the rest),
#        GPU memory (device_memory.sh), the kernel instrumentation benchmark
#        (benchmarks/kernel_instrumentation.py through device_kernels.sh's steps)
#   two: pyrun -e gpu=nvidia,trace on a torch.compile'd program (device_kernels.py), the window
#        job's end and check, ranges against torch.profiler with their cost (device_ranges.sh),
#        the gpu-marked tests
# Every log goes under /tmp/round/PHASE, packed into OUT/PHASE.tgz at the end (the device tool
# brings back at most 8 files).
#   bash tests/data/gpu/device_round.sh one|two OUT
phase=${1:?one or two}
out=${2:?output directory}
work=/tmp/round/$phase
mkdir -p "$work"
pack() { tar czf "$out/$phase.tgz" -C /tmp/round "$phase" $( [ "$phase" = two ] && echo win ); }
trap pack EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH
export TRITON_CACHE_DIR=/tmp/kern_tc CUPY_CACHE_DIR=/tmp/kern_cc PYHPCTK_BUILT=1
began=$(date +%s)
stage() { echo "== $1: $(( $(date +%s) - began )) s" | tee -a "$work/stages.txt"; }
if [ "$phase" = one ]; then
  stage install
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 --version
    python3 -m pip show torch triton cupy-cuda13x numba-cuda 2>/dev/null | grep -E '^(Name|Version)' | paste - -
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/cupti_python*.whl .whl/pyelftools*.whl .whl/capstone*.whl \
      .whl/py_spy*.whl .whl/nvtx*.whl
    bash tests/data/gpu/build_hook.sh python3 && echo "build ok"
  } > "$work/env.txt" 2>&1
  stage window
  WINDOW_JOB_PAUSE=0.02 setsid bash tests/data/gpu/device_window.sh /tmp/round/win \
    < /dev/null > /dev/null 2>&1 &
  stage memory
  timeout 200 bash tests/data/gpu/device_memory.sh "$work/memory" > "$work/memory.txt" 2>&1
  stage kernels
  timeout 290 python3 benchmarks/kernel_instrumentation.py "$work/bench" --scale 1.0 --reps 8 --frameworks triton,cupy \
    > "$work/bench.log" 2>&1
  echo "benchmark status $?" >> "$work/bench.log"
else
  stage pyrun-trace
  timeout 170 python3 tests/data/gpu/device_kernels.py "$work/pyrun" > "$work/pyrun.log" 2>&1
  echo "pyrun checks status $?" >> "$work/pyrun.log"
  stage window-wait
  for _ in $(seq 150); do grep -q "window_check rc=" /tmp/round/win/window.txt 2>/dev/null && break; sleep 1; done
  stage ranges
  timeout 250 bash tests/data/gpu/device_ranges.sh "$work/ranges" 3 > "$work/ranges.txt" 2>&1
  stage gpu-tests
  timeout 140 python3 -m pytest -p no:cacheprovider -m gpu -q tests/test_gpu_cupti.py \
    tests/test_gpu_e2e.py tests/test_gpu_inst.py tests/test_gpu_pc.py tests/test_gpu_sync_device.py \
    tests/test_ptx_hooks_gpu.py > "$work/gpu_tests.txt" 2>&1
fi
stage end
grep -h -E "^(PASS|FAIL)|passed|failed|status|rc=" "$work"/*.txt "$work"/*.log /tmp/round/win/window.txt 2>/dev/null | tail -60

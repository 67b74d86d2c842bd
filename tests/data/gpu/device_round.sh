#!/bin/bash
# Issues #34 and #37 on the device in two calls of one warm machine (each under 10 minutes;
# run the second within 30 s of the first's end so the machine and the window job stay).
#   one (under 10 minutes): wheels, the C parts, the 10-minute window job started in its own
#        session (device_window.sh, WINDOW_JOB_PAUSE=0.02 so the card is mostly free for the
#        rest), GPU memory (device_memory.sh), ranges against torch.profiler with their cost
#        (device_ranges.sh), the kernel instrumentation benchmark until the phase's end
#   two (SECONDS, default 300): pyrun -e gpu=nvidia,trace on a torch.compile'd program
#        (device_kernels.py), the window job's end and check, the gpu-marked tests if time is left
# Every log goes under /tmp/round/PHASE, packed into OUT/PHASE.tgz at the end (the device tool
# brings back at most 8 files).
#   bash tests/data/gpu/device_round.sh one OUT [SECONDS] | two OUT [SECONDS]
# (ROUND_WINDOW=0 bash ... one OUT SECONDS: without the window job, where one call is all)
phase=${1:?one or two}
out=${2:?output directory}
work=/tmp/round/$phase
mkdir -p "$work"
pack() {  # the logs and small results, not the measurements and databases
  (cd /tmp/round && find "$phase" $( [ "$phase" = two ] && echo win ) -type f -size -4M \
    \( -name '*.txt' -o -name '*.log' -o -name '*.json' -o -name '*.csv' \) -print0 |
    tar czf "$out/$phase.tgz" --null -T -)
}
trap pack EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH
export TRITON_CACHE_DIR=/tmp/kern_tc CUPY_CACHE_DIR=/tmp/kern_cc PYHPCTK_BUILT=1
began=$(date +%s)
stage() { echo "== $1: $(( $(date +%s) - began )) s" | tee -a "$work/stages.txt"; }
left() { echo $(( $1 - ($(date +%s) - began) )); }  # seconds left of a phase of $1 s
if [ "$phase" = one ]; then
  stage install
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; python3 --version
    python3 -m pip show torch triton cupy-cuda13x numba-cuda 2>/dev/null | grep -E '^(Name|Version)' | paste - -
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/cupti_python*.whl .whl/pyelftools*.whl .whl/capstone*.whl \
      .whl/py_spy*.whl .whl/nvtx*.whl
    bash tests/data/gpu/build_hook.sh python3 && echo "build ok"
  } > "$work/env.txt" 2>&1
  phase_s=${3:-565}
  if [ "${ROUND_WINDOW:-1}" = 1 ]; then  # ROUND_WINDOW=0: no window job (one call alone)
    stage window
    WINDOW_JOB_PAUSE=0.02 setsid bash tests/data/gpu/device_window.sh /tmp/round/win \
      < /dev/null > /dev/null 2>&1 &
  fi
  stage memory
  timeout 150 bash tests/data/gpu/device_memory.sh "$work/memory" > "$work/memory.txt" 2>&1
  stage ranges
  timeout 220 bash tests/data/gpu/device_ranges.sh "$work/ranges" 3 > "$work/ranges.txt" 2>&1
  stage kernels
  timeout "$(left "$phase_s")" python3 benchmarks/kernel_instrumentation.py "$work/bench" --scale 1.0 \
    --reps 8 --frameworks cupy,numba,triton > "$work/bench.log" 2>&1
  echo "benchmark status $?" >> "$work/bench.log"
else
  phase_s=${3:-300}
  stage pyrun-trace
  timeout 150 python3 tests/data/gpu/device_kernels.py "$work/pyrun" > "$work/pyrun.log" 2>&1
  echo "pyrun checks status $?" >> "$work/pyrun.log"
  stage window-wait
  while [ -d /tmp/round/win ] && [ "$(left "$phase_s")" -gt 10 ]; do  # no window job: no wait
    grep -q "window_check rc=" /tmp/round/win/window.txt 2>/dev/null && break; sleep 1
  done
  stage gpu-tests
  [ "$(left "$phase_s")" -gt 30 ] && timeout "$(left "$phase_s")" python3 -m pytest \
    -p no:cacheprovider -m gpu -q tests/test_gpu_cupti.py tests/test_gpu_e2e.py \
    tests/test_gpu_inst.py tests/test_gpu_pc.py tests/test_gpu_sync_device.py \
    tests/test_ptx_hooks_gpu.py > "$work/gpu_tests.txt" 2>&1
fi
stage end
grep -h -E "^(PASS|FAIL)|passed|failed|status|rc=" "$work"/*.txt "$work"/*.log /tmp/round/win/window.txt 2>/dev/null | tail -60

#!/bin/bash
# Issue #37 item 1 on the device (about 3 minutes): ResNet-18 and GPT-2 training steps under
# pyrun --ranges -e gpu=nvidia; for two modules of each, the kernels pyrun puts under the module
# (forward and backward) against torch.profiler's own count on a separate run; pyview --ranges'
# first screen; and what --ranges costs beside pyrun without ranges, both in one process
# (benchmarks/pyrun_ranges.py). Every log goes to OUT; one PASS/FAIL line per check, all of them
# again at the end (OUT/summary.txt).
# Usage (repository root; wheels in .whl/ as for device_pytorch.sh):
#   bash tests/data/gpu/device_ranges.sh OUT [STEPS]
out=${1:?output directory}
steps=${2:-3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
began=$(date +%s)
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
stage() { echo "== $1: $(( $(date +%s) - began )) s since the start" | tee -a "$out/stages.txt"; }

stage build
{ [ -d /tmp/site/cupti ] || { ls .whl/*.whl >/dev/null 2>&1 &&
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl; }
  if [ -z "$PYHPCTK_BUILT" ]; then  # set where the caller built them (and a job may be using them)
    rm -f src/pyhpctk/measure/gpu/cupti/_cuptihook*.so src/pyhpctk/measure/_engine*.so
    bash tests/data/gpu/build_hook.sh python3  # the hook with set_range, from these sources
  fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, pyhpctk.measure.gpu.cupti._cuptihook as h; print("torch", torch.__version__, "hook set_range:", hasattr(h, "set_range"))'
} > "$out/build.txt" 2>&1
grep -q "hook set_range: True" "$out/build.txt" && say "PASS build: the C hook has set_range" ||
  say "FAIL build: no C hook with set_range (see build.txt)"

for workload in resnet18 gpt2; do
  stage "$workload: pyrun --ranges"
  rm -rf "/tmp/ranges.$workload.m" "/tmp/ranges.$workload.d"
  timeout 150 python3 -m pyhpctk.cli.pyrun --ranges -e gpu=nvidia -o "/tmp/ranges.$workload.m" \
    python3 tests/data/gpu/ranges_device.py steps "$workload" "$steps" > "$out/$workload.pyrun.txt" 2>&1
  rc=$?
  timeout 120 python3 -m pyhpctk.cli.pyprof -o "/tmp/ranges.$workload.d" "/tmp/ranges.$workload.m" \
    >> "$out/$workload.pyrun.txt" 2>&1
  [ $rc -eq 0 ] && [ -f "/tmp/ranges.$workload.d/meta.db" ] &&
    say "PASS $workload: pyrun --ranges and pyprof ran" ||
    say "FAIL $workload: pyrun --ranges rc=$rc or no database (see $workload.pyrun.txt)"
  python3 -m pyhpctk.cli.pyview --ranges --metric GKER:COUNT --metric GKER --no-color --lines 60 \
    "/tmp/ranges.$workload.d" > "$out/$workload.ranges_view.txt" 2>&1
  python3 -m pyhpctk.cli.pyview --metric GKER:COUNT --no-color --lines 80 \
    "/tmp/ranges.$workload.d" > "$out/$workload.view.txt" 2>&1

  stage "$workload: torch.profiler"
  timeout 120 python3 tests/data/gpu/ranges_device.py profile "$workload" "$steps" \
    "$out/$workload.profiler.json" > "$out/$workload.profiler.txt" 2>&1 ||
    say "FAIL $workload: the torch.profiler run failed (see $workload.profiler.txt)"
  python3 tests/data/gpu/ranges_device.py check "$workload" "/tmp/ranges.$workload.d" \
    "$out/$workload.profiler.json" 2>&1 | tee "$out/$workload.check.txt" | grep -E "^(PASS|FAIL)" >> "$summary"
  cat "$out/$workload.check.txt"

  stage "$workload: overhead"
  timeout 150 python3 benchmarks/pyrun_ranges.py --workload "$workload" --rounds 3 --repeat 2 \
    --steps 5 > "$out/$workload.overhead.txt" 2>&1
  ratio=$(sed -n 's/.*median ratio \([0-9.]*\).*/\1/p' "$out/$workload.overhead.txt")
  if [ -z "$ratio" ]; then
    say "FAIL $workload overhead: no ratio (see $workload.overhead.txt)"
  elif awk "BEGIN{exit !($ratio <= 1.03)}"; then
    say "PASS $workload overhead: pyrun --ranges / pyrun = $ratio (<= 1.03)"
  else
    say "FAIL $workload overhead: pyrun --ranges / pyrun = $ratio (> 1.03)"
  fi
done
stage end
echo "== summary"; cat "$summary"
exit 0

#!/bin/bash
# Issue #37 item 1 on the device (about 2 minutes): why the cost of pyrun --ranges builds up
# while a job runs (the H100, 2026-12-08: rounds 1.035, 1.27, 1.32 for ResNet-18, the steps
# without ranges steady). benchmarks/pyrun_ranges.py --probe for each model, 4 rounds, then again
# with a switch interval of 0.5 ms: each configuration of each round gets a "probe" line of what
# pyrun did meanwhile (benchmarks/ranges_probe.py: each thread's CPU and context switches, the C
# hook's fast/slow/sites/resets and epochs, the Python slow path, the collector, the sizes of
# the ranges' tables and CCTs). Reading them: benchmarks/RESULTS.md, "Does anything pyrun keeps
# grow with the steps under ranges?".
# Usage (repository root; wheels in .whl/ as for device_pytorch.sh; PYHPCTK_BUILT set: the C
# parts are already built in this tree):
#   bash tests/data/gpu/device_ranges_probe.sh OUT
out=${1:?output directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
{
  [ -d /tmp/site/cupti ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  [ -n "$PYHPCTK_BUILT" ] || bash tests/data/gpu/build_hook.sh python3
} > "$out/build.txt" 2>&1
for workload in ${RANGES_WORKLOADS:-resnet18 gpt2}; do
  for interval in 0 0.0005; do
    file="$out/$workload.probe.$interval.txt"
    echo "== $workload, switch interval ${interval} s (0: the default)"
    timeout 150 python3 benchmarks/pyrun_ranges.py --workload "$workload" --rounds 4 --repeat 2 \
      --steps 5 --probe --switch-interval "$interval" > "$file" 2>&1
    grep -E "^(round|$workload:)" "$file"
  done
done
exit 0

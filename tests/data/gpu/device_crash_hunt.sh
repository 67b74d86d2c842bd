#!/bin/bash
# Issue #18 on the device: hunt crashes of measured PyTorch programs (the SIGSEGV found on
# 2026-12-02, benchmarks/RESULTS.md). ResNet-18 under pyrun -e gpu=nvidia -t at 1 kHz CPU and
# wall-clock sampling (5x the default rate): A = native frames (the default), B = --no-native,
# 4 runs at a time, until SECONDS have passed; faulthandler on. The failing logs (at most 5) and
# dmesg's segfault lines go to $OUT (the device tool's output folder).
# Usage (repository root, wheels in .whl/): bash tests/data/gpu/device_crash_hunt.sh [SECONDS]
budget=${1:-380}
OUT=${OUT:?set OUT, the output folder}
[ -d /tmp/site/cupti ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
python3 -c 'import pyhpctk.measure.gpu.cupti._cuptihook as h; h.convert_records' 2>/dev/null || bash tests/data/gpu/build_hook.sh python3
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/hunt $OUT/fail; t0=$(date +%s); n=0
one() {
  i=$1; mode=$2; extra=""; [ $mode = B ] && extra=--no-native
  timeout 110 python3 -m pyhpctk.cli.pyrun $extra -e CPUTIME@1000 -e REALTIME@1000 -e gpu=nvidia -t -o /tmp/hunt/m$i \
    python3 tests/data/gpu/soak_resnet.py 5 > /tmp/hunt/run$i.log 2>&1
  rc=$?; echo "run $i mode $mode rc=$rc" >> /tmp/hunt/summary.txt
  [ $rc -ne 0 ] && [ $(ls $OUT/fail | wc -l) -lt 5 ] && cp /tmp/hunt/run$i.log $OUT/fail/run$i-$mode.log
  rm -rf /tmp/hunt/m$i
}
while [ $(( $(date +%s) - t0 )) -lt $budget ]; do
  for k in 1 2 3 4; do n=$((n+1)); m=A; [ $((k % 2)) = 0 ] && m=B; one $n $m & done; wait
done
cp /tmp/hunt/summary.txt $OUT/
echo "A: $(grep -c 'mode A' /tmp/hunt/summary.txt) runs, $(grep 'mode A' /tmp/hunt/summary.txt | grep -vc 'rc=0$') failed"
echo "B: $(grep -c 'mode B' /tmp/hunt/summary.txt) runs, $(grep 'mode B' /tmp/hunt/summary.txt | grep -vc 'rc=0$') failed"
grep -v 'rc=0$' /tmp/hunt/summary.txt
(dmesg 2>&1 | grep -i -E "segfault|general protection|trap" | tail -20) > $OUT/dmesg.txt; cat $OUT/dmesg.txt
for f in $OUT/fail/*.log; do [ -f "$f" ] && { echo "=== $f"; head -60 "$f"; }; done

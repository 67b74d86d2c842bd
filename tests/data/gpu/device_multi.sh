#!/bin/bash
# Issue #22 on one H200 (no machine with two GPUs was lent): record a torch.distributed
# program with world size 1 for the simulated backend, on NCCL and on gloo, and measure the
# NCCL one end to end under torchrun and pyrun. Ends within 90 s: every command runs under a
# timeout that also stops it at 88 s from the start, and a stage that would start too late is
# skipped (and says so). Output in OUT (4 files):
#   multi.txt            what each stage printed (the recorder's summary: kernel names, which
#                        are communication, by which line; the plain run's loop time)
#   nccl_ws1_h200.json   the NCCL recording -> tests/data/gpu/ (then make_multi_fixture.py)
#   gloo_ws1_h200.json   the gloo recording -> tests/data/gpu/
#   e2e.txt              pyview of the pyrun run: GCOMM/GKER per line, --overlap, --blame
# Usage (repository root, wheels in .whl/: cupti-python, pyelftools):
#   bash tests/data/gpu/device_multi.sh OUT
out=${1:?output directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
# KINDS.md: NVLink multicast stays off, also for the processes torchrun starts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log=$out/multi.txt
SECONDS=0
END=88
stage() {  # stage NAME LATEST_START: false (and a line saying so) when it is too late
  if [ "$SECONDS" -gt "$2" ]; then echo "== $1: skipped at $SECONDS s (starts by $2 s)" >> "$log"; return 1; fi
  echo "== $1: $SECONDS s" >> "$log"
}
limited() {  # limited SECONDS COMMAND...: at most SECONDS, and never past END
  local most=$1 left=$(( END - SECONDS )); shift
  [ "$left" -lt "$most" ] && most=$left
  [ "$most" -le 0 ] && { echo "(no time left for $1)"; return 124; }
  timeout "$most" "$@"
}
stage setup 5 && {
  [ -d /tmp/site/cupti ] || limited 20 python3 -m pip install -q --no-index --no-deps \
    --no-compile --target /tmp/site .whl/*.whl >> "$log" 2>&1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log" 2>&1
}
stage record-nccl 20 && {
  limited 28 python3 tests/data/gpu/record_nccl.py "$out/nccl_ws1_h200.json" --backend nccl \
    --steps 4 >> "$log" 2>&1; echo "rc=$?" >> "$log"; }
stage record-gloo 45 && {
  limited 18 python3 tests/data/gpu/record_nccl.py "$out/gloo_ws1_h200.json" --backend gloo \
    --steps 2 >> "$log" 2>&1; echo "rc=$?" >> "$log"; }
stage pyrun-torchrun 58 && {
  rm -rf /tmp/nccl.m /tmp/nccl.d
  limited 22 python3 -m torch.distributed.run --standalone --nproc-per-node 1 --no-python \
    python3 -m pyhpctk.cli.pyrun -e gpu=nvidia,hook=python -t -o /tmp/nccl.m \
    python3 tests/data/gpu/record_nccl.py --plain --backend nccl --steps 4 >> "$log" 2>&1
  echo "rc=$?" >> "$log"; ls /tmp/nccl.m >> "$log" 2>&1
  { limited 8 python3 -m pyhpctk.cli.pyprof -o /tmp/nccl.d /tmp/nccl.m
    limited 4 python3 -m pyhpctk.cli.pyview /tmp/nccl.d -m GCOMM:COUNT -m GCOMM -m GKER:COUNT -t 1
    limited 4 python3 -m pyhpctk.cli.pyview /tmp/nccl.d --overlap --blame
  } > "$out/e2e.txt" 2>&1
  echo "rc=$?" >> "$log"; }
stage plain 74 && {  # the same program without pyrun: the overhead's baseline (loop_seconds)
  limited 14 python3 tests/data/gpu/record_nccl.py --plain --backend nccl --steps 4 >> "$log" 2>&1
  echo "rc=$?" >> "$log"; }
echo "== end: $SECONDS s" >> "$log"
exit 0

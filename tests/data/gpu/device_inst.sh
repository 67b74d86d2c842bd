#!/bin/bash
# Issue #7 device diagnosis of CUPTI's SASS metrics (instruction counts): is it the machine, the
# libcupti, or our Python? Builds tests/data/gpu/sass_probe.cu (no Python) as a program and as a
# library, runs the program (the system's libcupti, then each directory in PROBE_LIBS),
# then every diagnose_inst.py variant, some of which do steps through the probe library.
# Usage (repository root, wheels installed into /tmp/site): bash tests/data/gpu/device_inst.sh OUT
out=${1:?output directory}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
cuda=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
{
  echo "== machine"; nvidia-smi --query-gpu=name,driver_version,virtualization_mode,persistence_mode --format=csv
  nvidia-smi -q | grep -i -E "virtualization|confidential|compute mode|MIG|Driver Version|CUDA Version" | head
  echo "cuda=$cuda"; ls -la /dev/nvidia* 2>&1 | head
  echo "== libcupti on disk"; find / -xdev -name "libcupti.so*" 2>/dev/null
  python3 -m pip show cupti-python 2>/dev/null | grep -i "^version" | sed 's/^/cupti-python /' 
  cat /proc/driver/nvidia/params 2>/dev/null | grep -i -E "profil|admin" ; grep -r . /proc/driver/nvidia/params 2>/dev/null | grep -i prof
} > "$out/inst_env.txt" 2>&1
nvcc -arch=sm_90 -o /tmp/sass_probe tests/data/gpu/sass_probe.cu -lcupti -lcuda >> "$out/inst_env.txt" 2>&1
nvcc -arch=sm_90 -shared -Xcompiler -fPIC -DPROBE_LIBRARY -o /tmp/libsass_probe.so \
  tests/data/gpu/sass_probe.cu -lcupti -lcuda >> "$out/inst_env.txt" 2>&1
ldd /tmp/sass_probe | grep -E "cupti|cuda" >> "$out/inst_env.txt" 2>&1
cubin=tests/data/gpu/gt_sm90.cubin
{
  for lib in "" ${PROBE_LIBS:-}; do
    for args in "primary 1 1000" "primary 0 1000" "created 1 1000" "primary 1 64 $cubin"; do
      echo "== LD_LIBRARY_PATH=$lib probe $args"
      LD_LIBRARY_PATH=$lib timeout 30 /tmp/sass_probe $args 2>&1 \
        | grep -E "^(driver|RESULT|  supp|cuptiSassMetricsEnable|cuptiProfilerInit|cuModule|cuLaunch|kernel)"
      echo "rc=${PIPESTATUS[0]}"
    done
  done
  echo "== PROBE_NO_QUERY=1 probe (no cuptiProfilerDeviceSupported)"
  PROBE_NO_QUERY=1 timeout 30 /tmp/sass_probe primary 1 1000 2>&1 | grep -E "RESULT"
  echo "== PROBE_ZERO_CONFIG=1 probe (config array zeroed after SetConfig)"
  PROBE_ZERO_CONFIG=1 timeout 30 /tmp/sass_probe primary 1 1000 2>&1 | grep -E "RESULT|metric id"
} > "$out/inst_probe.txt" 2>&1
timeout 250 python3 tests/data/gpu/diagnose_inst.py > "$out/inst_diag.txt" 2>&1
cat "$out/inst_env.txt" "$out/inst_probe.txt" "$out/inst_diag.txt" > "$out/inst.txt"
rm -f "$out/inst_env.txt" "$out/inst_probe.txt" "$out/inst_diag.txt"
grep -E "^(== |RESULT|rc=|[a-z_+0-9]+ +(ok|ERR))" "$out/inst.txt"

#!/usr/bin/env bash
# The whole pipeline on an example, no GPU needed: measure -> structure -> analyze -> view.
# Usage: bash examples/demo.sh [OUTPUT_DIR]   (make demo runs it with the project's venv on PATH)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-demo-out}"
rm -rf "$out"
mkdir -p "$out"

echo "== 1. pyrun: measure every thread of examples/threads_demo.py (CPU time, traces)"
pyrun -o "$out/measurements" -t python "$here/threads_demo.py"

echo "== 2. pystruct: recover the structure (functions, loops) of the Python sources measured"
pystruct "$out/measurements"

echo "== 3. pyprof: aggregate the measurements into a database"
pyprof -o "$out/database" "$out/measurements"

echo "== 4. pyhpctk verify: check the database"
pyhpctk verify "$out/database"

echo "== 5. pyview: top-down view (the costliest calls within a screen; pyview --full shows every row)"
pyview "$out/database"
echo "== 5b. pyview: the functions that cost most themselves (bottom-up, by exclusive time)"
pyview --bottom-up --lines 8 "$out/database"

echo "== 5c. native frames: a numpy product on two OpenBLAS threads, OpenBLAS's functions and loops under its line"
OPENBLAS_NUM_THREADS=2 pyrun -o "$out/native-measurements" python "$here/native_demo.py"
pystruct -q "$out/native-measurements"   # also the native libraries the samples reached (cached)
pyprof -o "$out/native-database" "$out/native-measurements"
pyview --lines 30 "$out/native-database"
pyview --bottom-up --exclusive --lines 8 "$out/native-database"   # the kernels, self time

echo "== 6. GPU: which Python line launched which GPU work (CUPTI with a GPU, else simulated)"
if python -c "import cupy, sys; sys.exit(cupy.cuda.runtime.getDeviceCount() == 0)" 2>/dev/null; then
    gpu_event=gpu=nvidia
else
    gpu_event=gpu=simulated   # replays activity recorded on an NVIDIA H200
fi
pyrun -e "$gpu_event" -t -o "$out/gpu-measurements" python "$here/gpu_demo.py" 20
pyprof -o "$out/gpu-database" "$out/gpu-measurements"
pyview --depth 14 -m 'GPUOP (sec)' -m 'GKER (sec)' -m 'GXCOPY (sec)' -m 'GKER:COUNT' "$out/gpu-database"

echo "== 7. pymodel: run a program at P = 2..32 and rank its calling contexts by how they scale"
for p in 2 4 8 16 32; do
    pyrun -e CPUTIME@200 -o "$out/scaling-m$p" python "$here/scaling_demo.py" "$p"
    pyprof -o "$out/scaling-d$p" "$out/scaling-m$p" 2>/dev/null
done
pymodel "$out"/scaling-d{2,4,8,16,32} --param p=2,4,8,16,32 --top 8

echo "== 8. pyview: a GPU database written by HPCToolkit itself (reference data), same viewer"
ref="$here/../../shared/reference/hpctoolkit-testdata/dbase/loops-cuda-nvidia-t.d"
if [ -d "$ref" ]; then
    pyview --depth 8 "$ref"
fi

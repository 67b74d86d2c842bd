#!/bin/bash
# What the issue #7 device session runs: read CUPTI's PC sampling header, record the PC-sample
# fixtures of the ground-truth kernel, run the gpu-marked PC tests, measure the ground-truth
# kernel with pyrun (brought back as meas_gt.tgz), run the overhead benchmark.
# Usage (repository root, wheels installed, PYTHONPATH set):
#   bash tests/data/gpu/device_pc.sh OUTDIR [STEPS]
out=${1:?output directory}
steps=${2:-diagnose,record,tests,measure,bench}
export PYTHONUNBUFFERED=1
header=$(find /usr/local /opt /usr/include /tmp/site -name cupti_pcsampling.h 2>/dev/null | head -1)
export PCS_HEADER=$header
case ",$steps," in *,header,*)
  { echo "== $header"; cat "$header";
    s=$(dirname "$header")/cupti_sass_metrics.h; echo "== $s"; cat "$s";
    nvidia-smi; which ncu nvdisasm; ls /usr/local; } > "$out/headers.txt" 2>&1 ;; esac
case ",$steps," in *,diagnose,*)
  # which CUPTI configuration returns samples on this driver (issue #7: the 2nd H200 session
  # got totalSamples = 0 with serialized + start/stop and one buffer for config and GetData)
  for variant in "--mode serialized" "--mode continuous" "--mode serialized --no-start-stop" \
      "--mode continuous --no-start-stop"; do
    echo "== $variant"
    timeout 30 python3 tests/data/gpu/record_pc.py /tmp/diag.json --period 10 --launches 2 \
      --iters 4000 $variant 2>&1 | tail -3
  done > "$out/diagnose.txt" 2>&1 ;; esac
case ",$steps," in *,record,*)
  # the CI fixture (hpcrun's period, 2^12 cycles) and a dense one for the ground-truth check
  timeout 40 python3 tests/data/gpu/record_pc.py "$out/pc_gt.json" --period 12 --launches 2 \
    --iters 20000 2>&1 | tee "$out/record.txt"
  timeout 40 python3 tests/data/gpu/record_pc.py "$out/pc_gt_dense.json" --period 8 \
    --launches 2 --iters 20000 2>&1 | tee -a "$out/record.txt" ;; esac
case ",$steps," in *,tests,*)
  timeout 60 python3 -m pytest -p no:cacheprovider -m gpu -q tests/test_gpu_pc.py 2>&1 \
    | tee "$out/tests.txt" ;; esac
case ",$steps," in *,measure,*)
  rm -rf /tmp/meas_gt
  timeout 40 python3 -m pyhpctk.cli.pyrun -e gpu=nvidia,pc,period=8 -o /tmp/meas_gt \
    python3 tests/data/gpu/record_pc.py x --no-sampling --launches 2 --iters 20000 2>&1 \
    | tee -a "$out/record.txt"
  tar -C /tmp -czf "$out/meas_gt.tgz" meas_gt ;; esac
case ",$steps," in *,bench,*)
  ncu=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  timeout 80 python3 benchmarks/pyrun_gpu_fine.py --ncu "$ncu" --repeat 1 --launches 10 \
    --out "$out/bench.json" 2>&1 | tee "$out/bench.txt" ;; esac

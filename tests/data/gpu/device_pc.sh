#!/bin/bash
# What the issue #7 device session runs: read CUPTI's headers, record the PC-sample and
# instruction-count fixtures of the ground-truth kernel, run the gpu-marked PC and instruction
# tests, measure the ground-truth kernel with pyrun (brought back as meas_gt.tgz), run the
# overhead benchmark. Every step runs under timeout and logs to OUTDIR; a failing step does not
# stop the others. Default steps (record,tests,bench) take under 6 minutes and leave at most 7
# files: pc_gt.json pc_gt_dense.json inst_gt.json record.txt tests.txt bench.json bench.txt.
# Usage (repository root, wheels installed, PYTHONPATH set):
#   bash tests/data/gpu/device_pc.sh OUTDIR [STEPS]   # STEPS: header,diagnose,record,inst,tests,measure,bench
out=${1:?output directory}
steps=${2:-record,tests,bench}
mkdir -p "$out"
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
  # the CI fixtures (-> tests/data/gpu/pc_gt_h200.json, pc_gt_dense_h200.json,
  # inst_gt_h200.json): hpcrun's period (2^12 cycles); a dense one with many calls at the two
  # shared_fn sites for the 10% edge-weight check; exact counts (1 launch: CUPTI's one window)
  { echo "== pc period 12"
    timeout 45 python3 tests/data/gpu/record_pc.py "$out/pc_gt.json" --period 12 --launches 2 \
      --iters 64 --reps 200 2>&1 | tail -5
    echo "rc=${PIPESTATUS[0]}"
    echo "== pc period 8 (dense)"
    timeout 45 python3 tests/data/gpu/record_pc.py "$out/pc_gt_dense.json" --period 8 \
      --launches 6 --iters 16 --reps 400 2>&1 | tail -5
    echo "rc=${PIPESTATUS[0]}"
    echo "== inst"
    timeout 45 python3 tests/data/gpu/record_pc.py "$out/inst_gt.json" --inst --launches 1 \
      --iters 64 2>&1 | tail -5
    echo "rc=${PIPESTATUS[0]}"; } > "$out/record.txt" 2>&1 ;; esac
case ",$steps," in *,inst,*)
  # only the instruction-count fixture (-> tests/data/gpu/inst_gt_h200.json)
  { echo "== inst"
    timeout 45 python3 tests/data/gpu/record_pc.py "$out/inst_gt.json" --inst --launches 1 \
      --iters 64 2>&1 | tail -5
    echo "rc=${PIPESTATUS[0]}"; } > "$out/record.txt" 2>&1 ;; esac
case ",$steps," in *,tests,*)
  timeout 120 python3 -m pytest -p no:cacheprovider -m gpu -q -rxs tests/test_gpu_pc.py \
    tests/test_gpu_inst.py > "$out/tests.txt" 2>&1
  echo "rc=$?" >> "$out/tests.txt" ;; esac
case ",$steps," in *,measure,*)
  rm -rf /tmp/meas_gt
  timeout 40 python3 -m pyhpctk.cli.pyrun -e gpu=nvidia,pc,period=8 -o /tmp/meas_gt \
    python3 tests/data/gpu/record_pc.py x --no-sampling --launches 2 --iters 20000 2>&1 \
    | tee -a "$out/record.txt"
  tar -C /tmp -czf "$out/meas_gt.tgz" meas_gt ;; esac
case ",$steps," in *,bench,*)
  ncu=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  timeout 100 python3 benchmarks/pyrun_gpu_fine.py --ncu "$ncu" --repeat 1 --launches 10 \
    --iters 64 --reps 200 --out "$out/bench.json" > "$out/bench.txt" 2>&1
  echo "rc=$?" >> "$out/bench.txt" ;; esac
exit 0

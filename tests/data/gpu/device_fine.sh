#!/bin/bash
# Issue #7 item 6 on the device: the gpu-marked tests of the fine-grained layers, then the overhead
# of PC sampling and instruction counting on the real workload (the CuPy stencil) against a plain
# run and Nsight Compute, in the same run.
# Usage (repository root, wheels installed into /tmp/site):
#   bash tests/data/gpu/device_fine.sh OUTDIR [STEPS] [LAUNCHES]
out=${1:?output directory}
steps=${2:-build,tests,stencil}  # also: breakdown (issue #6 in-process costs)
launches=${3:-50}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
case ",$steps," in *,build,*)
bash tests/data/gpu/build_hook.sh python3 2>&1 | tee "$out/build.txt" ;; esac
case ",$steps," in *,tests,*)
timeout 280 python3 -m pytest -p no:cacheprovider -m gpu -q \
  tests/test_gpu_inst.py tests/test_gpu_pc.py tests/test_gpu_cupti.py tests/test_gpu_e2e.py \
  2>&1 | tee "$out/tests.txt" ;; esac
case ",$steps," in *,stencil,*)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "$(which ncu)" --version | tail -1
  timeout 400 python3 benchmarks/pyrun_gpu_fine.py --workload stencil --ncu "$(which ncu)" \
    --launches "$launches" --modes pyrun,pyrun_pc,pyrun_inst,ncu,ncu_inst --ncu-repeat 1 \
    --out "$out/bench_stencil.json"; } 2>&1 | tee "$out/stencil.txt" ;; esac
case ",$steps," in *,breakdown,*)
timeout 100 python3 benchmarks/gpu_breakdown.py --repeat 4 2>&1 | tee "$out/breakdown.txt" ;; esac

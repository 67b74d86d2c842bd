#!/bin/bash
# What one device-machine session runs (issue #6): build the C CUPTI hook, record the fixture,
# smoke-test the raw CUPTI buffer path against the objects path, run the gpu-marked tests, the
# in-process cost breakdown and the overhead benchmark.
# Usage (repository root, wheels installed into /tmp/site):
#   bash tests/data/gpu/device_session.sh OUTDIR [STEPS]
out=${1:?output directory}
steps=${2:-build,explore,record,raw,tests,breakdown,bench}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
case ",$steps," in *,build,*)
{ bash tests/data/gpu/build_hook.sh python3 && python3 -c \
  'from pyhpctk.measure.gpu.cupti.backend import load_hook; print("hook:", load_hook())'; } \
  2>&1 | tee "$out/build.txt" ;; esac
case ",$steps," in *,explore,*)
python3 - <<'PY' 2>&1 | tee "$out/explore.txt"
import numpy, click, sys
print("python", sys.version.split()[0], "numpy", numpy.__version__, "click", click.__version__)
from cupti import cupti
names = sorted(n for n in dir(cupti) if n.startswith("activity_kernel") and n.endswith("_dtype"))
for n in names + ["activity_memcpy6_dtype", "activity_memset4_dtype", "activity_synchronization2_dtype", "activity_memory4_dtype"]:
    d = getattr(cupti, n, None)
    print(n, None if d is None else d.itemsize, None if d is None else d.names)
print("version", cupti.get_version() if hasattr(cupti, "get_version") else "?")
PY
;; esac
case ",$steps," in *,record,*)
python3 tests/data/gpu/record_cupy.py "$out/cupy_streams.json" 2>&1 | tee "$out/record.txt" ;; esac
case ",$steps," in *,raw,*)
python3 tests/data/gpu/record_cupy.py --raw 2>&1 | tee -a "$out/record.txt" ;; esac
case ",$steps," in *,tests,*)
timeout 300 python3 -m pytest -p no:cacheprovider -m gpu -q -x --timeout 150 \
  tests/test_gpu_cupti.py tests/test_gpu_e2e.py 2>&1 | tee "$out/tests.txt" ;; esac
case ",$steps," in *,breakdown,*)
timeout 100 python3 benchmarks/gpu_breakdown.py --repeat 4 2>&1 | tee "$out/breakdown.txt" ;; esac
case ",$steps," in *,bench,*)
timeout 400 python3 benchmarks/pyrun_gpu.py --all --repeat 3 --rounds 4 --cpus 2-7 \
  --out "$out/bench.json" 2>&1 \
  | tee "$out/bench.txt" ;; esac

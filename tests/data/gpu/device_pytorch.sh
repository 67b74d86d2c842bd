#!/bin/bash
# Issue #18 on the device: GPU measurement at PyTorch scale. Stages (comma-separated, default
# all): build (wheels into /tmp/site, the C hook; says how it reads frames), tests (gpu-marked
# tests, then the CPU-only GPU tests), graphs (record graphs_h200.json, replay it in
# test_gpu_graphs.py), soak (pyrun -e gpu=nvidia -t on ResNet-18, SOAK_RUNS times; a run past
# SOAK_TIMEOUT s gets py-spy dump --native of every process, then is killed), bench
# (pyrun_gpu.py: ResNet-18, GPT-2, launch, compute, BENCH_ROUNDS rounds, pinned, plain run
# interleaved, pyrun with CUPTI's SYNCHRONIZATION records (pyrun-syncact) and
# torch.profiler(with_stack=True) beside; no round is started past BENCH_BUDGET
# s, so the tables always come), breakdown (gpu_breakdown.py: each BREAKDOWN_CHILDREN once:
# ResNet-18 and GPT-2 sessions with the hook's counters and the time in each part, the CuPy
# launch loop, and CUPTI's own cost on ResNet-18); cpu, only when named (pyrun_ab.py: the CPU
# sampler's cost inside one process, beside a bare timer signal's). Every stage prints its
# time; logs and fixtures go to OUT (the default stages' 8 files: tests.txt graphs.txt
# graphs_h200.json soak.txt soak.tgz bench.txt bench.json breakdown.txt; cpu.txt when named).
# Usage (repository root, wheels in .whl/: cupti-python, pyelftools, py-spy, capstone...):
#   bash tests/data/gpu/device_pytorch.sh OUT [STAGES]
out=${1:?output directory}
stages=${2:-build,tests,graphs,soak,bench,breakdown}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
began=$(date +%s)
stage() { echo "== stage $1: $(( $(date +%s) - began )) s since the start" | tee -a "$out/stages.txt"; }
want() { case ",$stages," in *,$1,*) return 0 ;; esac; return 1; }
setup() {  # every stage can run alone on a fresh machine; a hook built from older sources
  [ -d /tmp/site/cupti ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  python3 -c 'import pyhpctk.measure.gpu.cupti._cuptihook as h; h.take_syncs' 2>/dev/null ||
    bash tests/data/gpu/build_hook.sh python3  # (a machine kept warm keeps its .so: rebuilt)
}
if want build; then stage build
  rm -f src/pyhpctk/measure/gpu/cupti/_cuptihook*.so src/pyhpctk/measure/_engine*.so  # from these sources
  { setup; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, cupy, cupti; from pyhpctk.measure.gpu.cupti.backend import load_hook; h = load_hook(); print("torch", torch.__version__, "cupy", cupy.__version__, "hook", h, "frames:", getattr(h, "FRAME_WALK", None))'
    python3 -m pyhpctk.measure.sampling.engine && echo "sampling engine: built for $(python3 -V)"
    python3 tests/data/gpu/record_plans.py  # which record layouts take the C pass
    which py-spy; } > "$out/tests.txt" 2>&1
fi
if want tests; then stage tests; setup
  # sync=api's rows against CUPTI's SYNCHRONIZATION records (-rP: their comparison printed)
  timeout 120 python3 -m pytest -p no:cacheprovider -m gpu -q -rP --timeout 100 \
    tests/test_gpu_sync_device.py >> "$out/tests.txt" 2>&1
  echo "rc=$?" >> "$out/tests.txt"
  timeout 400 python3 -m pytest -p no:cacheprovider -m gpu -q --timeout 200 \
    tests/test_gpu_cupti.py tests/test_gpu_e2e.py >> "$out/tests.txt" 2>&1
  echo "rc=$?" >> "$out/tests.txt"
  timeout 120 python3 -m pytest -p no:cacheprovider -q tests/test_gpu_nohang.py tests/test_gpu_graphs.py \
    tests/test_gpu_monitor.py tests/test_gpu_hook.py tests/test_gpu_raw.py \
    tests/test_gpu_sync_api.py >> "$out/tests.txt" 2>&1
  echo "rc=$?" >> "$out/tests.txt"
fi
if want graphs; then stage graphs; setup
  { timeout 120 python3 tests/data/gpu/record_graphs.py "$out/graphs_h200.json" --replays 6
    echo "rc=$?"
    cp "$out/graphs_h200.json" tests/data/gpu/graphs_h200.json  # the CI test replays it too
    timeout 120 python3 -m pytest -p no:cacheprovider -q tests/test_gpu_graphs.py; echo "rc=$?"
    # the same program measured by pyrun end to end: kernels under their capture lines
    rm -rf /tmp/graphs.m /tmp/graphs.d
    timeout 120 python3 -m pyhpctk.cli.pyrun -e gpu=nvidia -o /tmp/graphs.m python3 \
      tests/data/gpu/record_graphs.py --plain --replays 6; echo "pyrun rc=$?"
    python3 -m pyhpctk.cli.pyprof -o /tmp/graphs.d /tmp/graphs.m && \
      python3 -m pyhpctk.cli.pyview /tmp/graphs.d --metric GKER:COUNT --depth 14 | head -120
  } > "$out/graphs.txt" 2>&1
fi
if want soak; then stage soak; setup
  runs=${SOAK_RUNS:-30}; limit=${SOAK_TIMEOUT:-90}; steps=${SOAK_STEPS:-5}; ok=0
  rm -rf /tmp/soak && mkdir -p /tmp/soak
  for i in $(seq 1 "$runs"); do
    t0=$(date +%s.%N)
    setsid python3 -m pyhpctk.cli.pyrun -e gpu=nvidia -t -o /tmp/soak/m$i \
      python3 tests/data/gpu/soak_resnet.py "$steps" > /tmp/soak/run$i.log 2>&1 &
    pid=$!; waited=0
    while kill -0 $pid 2>/dev/null && [ $waited -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
    if kill -0 $pid 2>/dev/null; then
      echo "run $i: no end after $limit s: py-spy dumps" | tee -a "$out/soak.txt"
      for p in $(pgrep -g "$(ps -o pgid= $pid | tr -d ' ')"); do
        echo "=== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline)"; py-spy dump --pid "$p" --native 2>&1
      done > /tmp/soak/hang$i.txt
      kill -9 -- -"$(ps -o pgid= $pid | tr -d ' ')" 2>/dev/null
    else
      wait $pid; rc=$?
      [ $rc -eq 0 ] && ok=$((ok + 1))
      echo "run $i: rc=$rc $(awk "BEGIN{print $(date +%s.%N) - $t0}") s" >> "$out/soak.txt"
    fi
    rm -rf /tmp/soak/m$i
  done
  echo "soak: $ok of $runs runs ended with status 0 (limit $limit s, $steps steps each)" | tee -a "$out/soak.txt"
  tail -3 /tmp/soak/run1.log >> "$out/soak.txt"
  ls /tmp/soak/hang*.txt >/dev/null 2>&1 && tar -C /tmp -czf "$out/soak.tgz" soak
fi
if want bench; then stage bench; setup
  timeout 590 python3 benchmarks/pyrun_gpu.py --all --rounds "${BENCH_ROUNDS:-4}" --repeat 3 \
    --steps 10 --cpus 2-7 --workloads "${BENCH_WORKLOADS:-resnet18,gpt2,launch,compute}" \
    --modes "${BENCH_MODES:-plain,pyrun,pyrun-syncact,torchprof}" --budget "${BENCH_BUDGET:-540}" \
    --out "$out/bench.json" > "$out/bench.txt" 2>&1
  echo "rc=$?" >> "$out/bench.txt"
fi
if want breakdown; then stage breakdown; setup
  timeout 150 python3 benchmarks/gpu_breakdown.py --repeat 3 --times "${BREAKDOWN_TIMES:-1}" \
    --children "${BREAKDOWN_CHILDREN:-resnet18,gpt2,session,layers:resnet18}" \
    > "$out/breakdown.txt" 2>&1
  echo "rc=$?" >> "$out/breakdown.txt"
fi
if want cpu; then stage cpu; setup  # not in the default set: issue #16's CPU figures
  # inside one process (drift-proof: the device machine's speed drifts by several % in
  # minutes), with a bare timer signal's floor beside pyrun's cost
  timeout 300 python3 benchmarks/pyrun_ab.py --cpus 2-5 --pairs "${AB_PAIRS:-20}" --phase 0.25 \
    --rates 200,1000 > "$out/cpu.txt" 2>&1
  echo "rc=$?" >> "$out/cpu.txt"
fi
stage end
cat "$out/stages.txt" >> "$out/tests.txt" 2>/dev/null; rm -f "$out/stages.txt"
exit 0

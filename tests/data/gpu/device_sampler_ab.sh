#!/bin/bash
# Issue #18 on the device: pyrun -e gpu=nvidia on ResNet-18 and the CuPy launch loop with each CPU
# sampler (plain run, the engine on perf_events, the Python sampler thread, the engine on POSIX
# timers), 5 repetitions of 10 steps per process, interleaved, ROUNDS rounds; the engine's counts
# (PYHPCTK_PYRUN_DEBUG=1) under each. Usage: bash tests/data/gpu/device_sampler_ab.sh OUT [ROUNDS]
out=${1:?}; rounds=${2:-2}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH
[ -d /tmp/site/cupti ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
python3 -m pyhpctk.measure.sampling.engine 2>/dev/null || bash tests/data/gpu/build_hook.sh python3
for r in $(seq 1 $rounds); do
 for w in resnet18 launch; do
  for cfg in plain engine thread posix; do
    mode=pyrun; envs=""
    case $cfg in plain) mode=plain;; thread) envs="PYHPCTK_PYRUN_SAMPLER=thread";; posix) envs="PYHPCTK_PYRUN_CPU_TIMER=posix";; esac
    res=$(env $envs PYHPCTK_PYRUN_DEBUG=1 python3 benchmarks/pyrun_gpu.py --workload $w --mode $mode --repeat 5 --steps 10 --cpus 2-7 2>/tmp/err.txt | grep '^{' | tail -1)
    echo "$r $w $cfg $(echo "$res" | python3 -c 'import json,sys; d=json.load(sys.stdin); print([round(t,4) for t in d["times"]], d.get("hook",{}).get("slow"))')"
    grep -i "engine\|sample\|drain" /tmp/err.txt | head -5 | sed 's/^/    /'
  done
 done
done 2>&1 | tee $out/ab.txt
